"""A consumer that receives and holds (never acks) everything, printing a line
"received <payload> <topic_offset>" per delivery (flushed), until the process is killed.
Used with official_client.spawn_scenario, e.g. to freeze (SIGSTOP) a consumer that holds
unacked messages.

args: url, topic, name, subscription, kind, payloads (sent by a reliable producer after the
consumer subscribed; the producer also creates the reliable topic), run_for (seconds, 60).
Prints "subscribed" once receiving."""

import asyncio

from _lib import PlannedReceiver, new_client, new_producer


async def main(args):
    client = await new_client(args["url"])
    producer = await new_producer(client, args["topic"], "hold-producer", reliable=True)
    receiver = await PlannedReceiver.start(client, args["topic"], args["name"],
                                           args["subscription"], args.get("kind", "exclusive"),
                                           {"default": "hold"})
    print("subscribed", flush=True)
    for payload in args.get("payloads", []):
        await producer.send(payload.encode(), {})
    seen = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + args.get("run_for", 60)
    while loop.time() < end:
        for d in receiver.deliveries[seen:]:
            print(f"received {d['payload']} {d['topic_offset']}", flush=True)
        seen = len(receiver.deliveries)
        await asyncio.sleep(0.01)
    return {"deliveries": receiver.deliveries}
