"""Producer re-creation by name: two official producers with the same name on one topic get
the same producer id; another name gets another id; a message sent through the second one
carries that id.

args: url, topic. Returns {"first", "second", "other", "received": [message]}.
"""

from _lib import Receiver, new_client, new_producer, producer_ids


async def main(args):
    client = await new_client(args["url"])
    topic = args["topic"]
    first = await new_producer(client, topic, "reused-name")
    # A separate client, as a restarted application would have.
    client2 = await new_client(args["url"])
    second = await new_producer(client2, topic, "reused-name")
    other = await new_producer(client, topic, "another-name")
    receiver = await Receiver.start(client, topic, "c", "s", "exclusive")
    await second.send(b"via second", {})
    await first.send(b"via first", {})
    await receiver.count(2, 10)
    await receiver.quiet(0.2)
    return {"first": producer_ids(first)[0], "second": producer_ids(second)[0],
            "other": producer_ids(other)[0], "received": receiver.messages}
