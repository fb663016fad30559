"""Failover subscription: only the first consumer receives; once it closes the standby is
promoted and receives what is published afterwards.

args: url, topic, subscription, n (messages per phase).
Returns {"phase1": {"first": [...], "second": [...]}, "first_health_after_close",
"phase2": {"first": [...], "second": [...]}}.
"""

from _lib import Receiver, consumer_ids, new_client, new_producer, wait_health


async def main(args):
    url, topic, sub, n = args["url"], args["topic"], args["subscription"], args["n"]
    client = await new_client(url)
    producer = await new_producer(client, topic, "failover-producer")
    first = await Receiver.start(client, topic, "first", sub, "failover")
    second = await Receiver.start(client, topic, "second", sub, "failover")
    for i in range(n):
        await producer.send(f"p1-{i}".encode(), {})
    await first.count(n, 10)
    await first.quiet(0.2)
    await second.quiet(0.05)
    phase1 = {"first": [m["payload"] for m in first.messages],
              "second": [m["payload"] for m in second.messages]}
    first_id = list(consumer_ids(first.consumer).values())[0]
    await first.close()
    # The broker notices the closed stream asynchronously: wait until it reports the first
    # consumer inactive before publishing phase 2.
    status = await wait_health(url, "consumer", first_id, "CLOSE", 10)
    seen = len(first.messages), len(second.messages)
    for i in range(n):
        await producer.send(f"p2-{i}".encode(), {})
    await second.count(seen[1] + n, 10)
    await second.quiet(0.2)
    return {"phase1": phase1, "first_health_after_close": status,
            "phase2": {"first": [m["payload"] for m in first.messages[seen[0]:]],
                       "second": [m["payload"] for m in second.messages[seen[1]:]]}}
