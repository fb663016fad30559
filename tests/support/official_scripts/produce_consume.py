"""Generic scenario: one producer (optionally partitioned), N consumers, a list of messages.

args:
  url, topic
  producer: {"name", "partitions"?}
  consumers: [{"name", "subscription", "kind", "key_filters"?}]
  messages: [{"payload"? | "payload_b64"?, "attributes"?, "key"?}]
  expect: {consumer name: count}  and/or  expect_total: count over all consumers
  quiet: seconds of silence awaited afterwards, to catch duplicates or strays (default 0.3)

The producer is created first (that creates the topic, or its partitions: subscribing never
creates a topic), then every consumer subscribes and starts receiving, then the messages are
sent in order. Returns {"producer_ids", "send_results", "received": {name: [message]},
"ack_errors": {name: [...]}}.
"""

import asyncio
import base64

from _lib import Receiver, new_client, new_producer, producer_ids, wait_all


async def main(args):
    client = await new_client(args["url"])
    spec = args.get("producer", {})
    producer = await new_producer(client, args["topic"], spec.get("name", "producer"),
                                  partitions=spec.get("partitions"))
    receivers = {}
    for c in args["consumers"]:
        receivers[c["name"]] = await Receiver.start(
            client, args["topic"], c["name"], c["subscription"], c.get("kind", "shared"),
            c.get("key_filters", ()))
    results = []
    for m in args["messages"]:
        data = (base64.b64decode(m["payload_b64"]) if "payload_b64" in m
                else m["payload"].encode())
        attrs = m.get("attributes")
        if m.get("key") is not None:
            results.append(await producer.send_with_key(data, attrs, m["key"]))
        else:
            results.append(await producer.send(data, attrs))
    expect = args.get("expect", {})
    total = args.get("expect_total")
    timeout = args.get("timeout", 10.0)
    await asyncio.gather(*(receivers[name].count(n, timeout) for name, n in expect.items()))
    if total is not None:
        await wait_all(lambda: sum(len(r.messages) for r in receivers.values()) >= total,
                       timeout)
    await asyncio.gather(*(r.quiet(args.get("quiet", 0.3)) for r in receivers.values()))
    out = {
        "producer_ids": producer_ids(producer),
        "send_results": results,
        "received": {name: r.messages for name, r in receivers.items()},
        "ack_errors": {name: r.ack_errors for name, r in receivers.items()},
    }
    # No close(): the runner exits the process, which ends every stream at once.
    return out
