"""A reliable producer and an exclusive consumer (acking everything) on one topic, with the
topic unloaded by the admin API half-way through: both must carry on by themselves (the
producer's sends are retried and it is created again; the consumer subscribes again when
its health check says CLOSE).

args: url, admin_addr, topic, count, burst (sends in flight at once), pause (seconds between
bursts). Returns the send errors, the payloads received in order, and the unload's error
(None when it succeeded)."""

import asyncio

from _lib import Receiver, admin_topic_call, error_info, new_client, new_producer


async def main(args):
    client = await new_client(args["url"])
    producer = await new_producer(client, args["topic"], "unload-producer", reliable=True)
    receiver = await Receiver.start(client, args["topic"], "unload-consumer", "unload-sub",
                                    "exclusive")
    count, burst, errors = args["count"], args.get("burst", 1), []

    async def send(i):
        try:
            await producer.send(f"m{i}".encode(), {})
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(error_info(exc))

    unload = None
    for start in range(0, count, burst):
        sends = asyncio.gather(*(send(i) for i in range(start, min(start + burst, count))))
        if unload is None and start >= count // 2:
            # While this burst is in flight.
            unload = asyncio.ensure_future(admin_topic_call(args["admin_addr"], "UnloadTopic",
                                                            args["topic"]))
        await sends
        await asyncio.sleep(args.get("pause", 0.02))
    unload_error = await unload
    await receiver.until(lambda msgs: len({m["payload"] for m in msgs}) >= count - len(errors),
                         timeout=20)
    return {"send_errors": errors, "unload_error": unload_error,
            "received": [m["payload"] for m in receiver.messages]}
