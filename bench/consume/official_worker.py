"""Drain with the official Python client (run under .venv-official's interpreter, with -I):
`python -I official_worker.py '{"url", "topic", "sub", "n", "idle_timeout"}'`. Acks are
pipelined (at most `ack_window` outstanding, each its own Ack call, as the client offers).
Prints one JSON line: received, distinct, duplicates, seconds, cpu_s."""

import asyncio
import json
import sys
import time

from danube import DanubeClientBuilder, SubType


async def main(cfg):
    client = await DanubeClientBuilder().service_url(cfg["url"]).build()
    consumer = (client.new_consumer().with_topic(cfg["topic"]).with_consumer_name("official")
                .with_subscription(cfg["sub"]).with_subscription_type(SubType.EXCLUSIVE)
                .build())
    n = cfg["n"]
    acks = asyncio.Semaphore(cfg.get("ack_window", 1000))
    errors = [0]
    pending = set()

    async def ack(msg):
        try:
            await consumer.ack(msg)
        except Exception:  # noqa: BLE001 - counted; the broker redelivers
            errors[0] += 1
        finally:
            acks.release()

    cpu0, t0 = time.process_time(), time.perf_counter()
    await consumer.subscribe()
    queue = await consumer.receive()
    seen = bytearray(n)
    received = dups = 0
    distinct = 0
    while distinct < n:
        try:
            msg = await asyncio.wait_for(queue.get(), cfg.get("idle_timeout", 30))
        except asyncio.TimeoutError:
            break
        received += 1
        off = msg.msg_id.topic_offset
        if off < n and not seen[off]:
            seen[off] = 1
            distinct += 1
        else:
            dups += 1
        await acks.acquire()
        task = asyncio.ensure_future(ack(msg))
        pending.add(task)
        task.add_done_callback(pending.discard)
    seconds = time.perf_counter() - t0
    if pending:
        await asyncio.gather(*pending)
    print(json.dumps({"received": received, "distinct": distinct, "duplicates": dups,
                      "ack_errors": errors[0], "seconds": seconds,
                      "cpu_s": time.process_time() - cpu0}), flush=True)
    await consumer.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
