"""A second consumer joins a Shared subscription mid-stream.

args: url, topic, subscription, before (messages sent before the join), after (sent after).
Consumer "early" is there from the start; "late" subscribes once "early" has received the
first `before` messages. Returns {"early": [payload], "late": [payload], "ack_errors": [...]}.
"""

from _lib import Receiver, new_client, new_producer, wait_all


async def main(args):
    client = await new_client(args["url"])
    topic, sub = args["topic"], args["subscription"]
    producer = await new_producer(client, topic, "churn-producer")
    early = await Receiver.start(client, topic, "early", sub, "shared")
    before, after = args["before"], args["after"]
    for i in range(before):
        await producer.send(f"m-{i}".encode(), {"i": str(i)})
    got_first = await early.count(before, 10)
    late = await Receiver.start(client, topic, "late", sub, "shared")
    for i in range(before, before + after):
        await producer.send(f"m-{i}".encode(), {"i": str(i)})
    total = before + after
    await wait_all(lambda: len(early.messages) + len(late.messages) >= total, 10)
    await early.quiet(0.3)
    await late.quiet(0.05)
    return {"early_got_first": got_first,
            "early": [m["payload"] for m in early.messages],
            "late": [m["payload"] for m in late.messages],
            "ack_errors": early.ack_errors + late.ack_errors}
