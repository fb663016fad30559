"""Generic reliable-topic scenario: a reliable producer, consumers that ack, nack or hold
each delivery as their plan says (_lib.PlannedReceiver), optionally a dead-letter topic.

args:
  url, topic
  producer: {"name"}: a reliable producer, created first (it creates the reliable topic;
            subscribing never creates one)
  dlq: {"topic", "subscription"} (optional): a reliable producer creates the dead-letter
       topic and an acking Exclusive consumer subscribes to it, before anything is sent
       (a new reliable subscription starts at the live tail)
  consumers: [{"name", "subscription", "kind", "plan"}], subscribed in this order
  messages: [{"payload" | "payload_b64", "attributes"?, "key"?}], sent in order, one at a time
  settled: [payload]: wait until every one of these was acked (over all consumers)
  acked_count: wait until this many deliveries were acked (over all consumers)
  dlq_count: wait until the dead-letter consumer has this many messages
  timeout: for the waits (default 10 s); quiet: silence awaited at the end (default 0.3 s);
  hold: extra seconds to wait before the quiet period (e.g. to see that nothing comes)

Returns {"send_results", "producer_ids", "settled_met", "dlq_met", "deliveries": {consumer:
[delivery]}, "dlq": [message], "errors": {consumer: [...]}}.
"""

import asyncio
import base64
import time

from _lib import PlannedReceiver, Receiver, new_client, new_producer, producer_ids


async def main(args):
    client = await new_client(args["url"])
    topic = args["topic"]
    producer = await new_producer(client, topic, args.get("producer", {}).get("name", "rp"),
                                  reliable=True)
    dlq = None
    if args.get("dlq"):
        spec = args["dlq"]
        await new_producer(client, spec["topic"], "dlq-creator", reliable=True)
        dlq = await Receiver.start(client, spec["topic"], "dlq-reader", spec["subscription"],
                                   "exclusive")
    t0 = time.monotonic()
    counts = {}
    receivers = {}
    for c in args.get("consumers", []):
        receivers[c["name"]] = await PlannedReceiver.start(
            client, topic, c["name"], c["subscription"], c.get("kind", "exclusive"),
            c.get("plan"), counts, t0)
    results = []
    for m in args.get("messages", []):
        data = (base64.b64decode(m["payload_b64"]) if "payload_b64" in m
                else m["payload"].encode())
        if m.get("key") is not None:
            results.append(await producer.send_with_key(data, m.get("attributes"), m["key"]))
        else:
            results.append(await producer.send(data, m.get("attributes")))
    timeout = args.get("timeout", 10.0)
    want = set(args.get("settled", []))

    acked_count = args.get("acked_count", 0)

    def settled():
        done = [p for r in receivers.values() for p in r.settled()]
        return want <= set(done) and len(done) >= acked_count

    first = next(iter(receivers.values()), None)
    settled_met = await first.until(settled, timeout) if first is not None else settled()
    dlq_met = None
    if dlq is not None and args.get("dlq_count") is not None:
        dlq_met = await dlq.count(args["dlq_count"], timeout)
    if args.get("hold"):
        await asyncio.sleep(args["hold"])
    await asyncio.gather(*(r.quiet(args.get("quiet", 0.3)) for r in receivers.values()))
    return {"send_results": results, "producer_ids": producer_ids(producer),
            "settled_met": settled_met, "dlq_met": dlq_met,
            "deliveries": {n: r.deliveries for n, r in receivers.items()},
            "dlq": dlq.messages if dlq is not None else [],
            "errors": {n: r.errors for n, r in receivers.items()}}
