"""Drain an existing reliable subscription: subscribe, ack everything that arrives, until
every payload listed in `expect_file` has arrived, then until nothing more comes for
`quiet` seconds.

args: url, topic, name, subscription, kind (default exclusive), expect_file (payloads, one
per line; absolute path), timeout (default 30), quiet (default 1.0), give_up (default 3.0:
stop waiting once nothing has arrived for this long).
Returns {"complete": bool, "received": [[payload, topic_offset], ...] in arrival order,
"ack_errors": [...]}. The topic must exist (no producer is created).
"""

import asyncio
import time

from _lib import sub_type, new_client


async def main(args):
    client = await new_client(args["url"])
    consumer = (client.new_consumer().with_topic(args["topic"])
                .with_consumer_name(args["name"]).with_subscription(args["subscription"])
                .with_subscription_type(sub_type(args.get("kind", "exclusive"))).build())
    await consumer.subscribe()
    queue = await consumer.receive()
    with open(args["expect_file"], encoding="utf-8") as f:
        missing = set(f.read().split())
    received, errors, acks = [], [], set()
    arrived = asyncio.Event()

    async def ack(msg):
        try:
            await consumer.ack(msg)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(repr(exc))

    async def pump():
        while True:
            msg = await queue.get()
            payload = msg.payload.decode()
            received.append([payload, msg.msg_id.topic_offset])
            missing.discard(payload)
            task = asyncio.ensure_future(ack(msg))
            acks.add(task)
            task.add_done_callback(acks.discard)
            arrived.set()

    pumping = asyncio.ensure_future(pump())
    now = time.monotonic()
    deadline, last = now + args.get("timeout", 30.0), now
    while missing and now < deadline and now - last < args.get("give_up", 3.0):
        arrived.clear()
        try:
            await asyncio.wait_for(arrived.wait(), 0.2)
            last = time.monotonic()
        except asyncio.TimeoutError:
            pass
        now = time.monotonic()
    complete = not missing
    while True:
        arrived.clear()
        try:
            await asyncio.wait_for(arrived.wait(), args.get("quiet", 1.0))
        except asyncio.TimeoutError:
            break
    pumping.cancel()
    await asyncio.gather(*list(acks), return_exceptions=True)
    return {"complete": complete, "received": received, "ack_errors": errors}
