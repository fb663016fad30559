"""Step-by-step reliable-topic scenario, for reconnects and consumer churn.

A reliable producer is created first (that creates the reliable topic: subscribing never
creates one).

args: url, topic, steps: a list of
  {"op": "produce", "payloads": [...], "keys"?: [...]}
  {"op": "subscribe", "as": label, "name": consumer name, "subscription", "kind",
   "plan"?: _lib.PlannedReceiver plan, "new_client"?: true, "key_filters"?: [...]}
  {"op": "wait", "as": label, "payloads": [...], "attempts"?: n, "timeout"?: 10}
                                     until label got each of them (n times; default once);
                                     label "*": all the consumers together
  {"op": "close", "as": label}                 the consumer's stream ends
  {"op": "quiet", "as": label, "seconds"?: 0.3}
  {"op": "sleep", "seconds": s}

Returns {"deliveries": {label: [delivery]}, "waits": [bool per wait step], "send_results",
"errors": {label: [...]}}.
"""

import asyncio
import time

from _lib import PlannedReceiver, new_client, new_producer


async def main(args):
    url, topic = args["url"], args["topic"]
    client = await new_client(url)
    producer = await new_producer(client, topic, "steps-producer", reliable=True)
    receivers, waits, sent = {}, [], []
    counts, t0 = {}, time.monotonic()
    for step in args["steps"]:
        op = step["op"]
        if op == "produce":
            keys = step.get("keys") or [None] * len(step["payloads"])
            for payload, key in zip(step["payloads"], keys):
                if key is None:
                    sent.append(await producer.send(payload.encode(), {}))
                else:
                    sent.append(await producer.send_with_key(payload.encode(), {}, key))
        elif op == "subscribe":
            owner = await new_client(url) if step.get("new_client") else client
            receivers[step["as"]] = await PlannedReceiver.start(
                owner, topic, step["name"], step["subscription"], step.get("kind", "exclusive"),
                step.get("plan"), counts, t0, step.get("key_filters", ()))
        elif op == "wait":
            label = step["as"]
            group = list(receivers.values()) if label == "*" else [receivers[label]]
            want, times = step["payloads"], step.get("attempts", 1)

            def got_all(group=group, want=want, times=times):
                seen = [d["payload"] for r in group for d in r.deliveries]
                return all(seen.count(p) >= times for p in want)
            waits.append(await group[0].until(got_all, step.get("timeout", 10.0)))
        elif op == "close":
            await receivers[step["as"]].close()
        elif op == "quiet":
            await receivers[step["as"]].quiet(step.get("seconds", 0.3))
        elif op == "sleep":
            await asyncio.sleep(step["seconds"])
        else:
            raise ValueError(f"unknown op {op!r}")
    return {"deliveries": {k: r.deliveries for k, r in receivers.items()}, "waits": waits,
            "send_results": sent, "errors": {k: r.errors for k, r in receivers.items()}}
