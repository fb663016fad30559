"""Our client's side of bench.consume: `python -P -m bench.consume.worker '<json>'`.

  fill   creates the reliable subscription `sub` (subscribe, let the stream open, close)
         and publishes `n` payloads of `size` bytes with send_many (batches of 1000):
         [u64 sequence number] + padding.
  drain  subscribes and receives until every offset 0..n-1 has arrived, acking each:
         `acks` "default" (subscribe() with no options), "batched" (batch_acks=True, ranges)
         or "each" (one Ack call per message, at most 1000 outstanding, or one at a time,
         awaited, with `sequential_acks`: a plain loop's cost); `window` is the consumer's
         max_unacked_messages; `receive` "one": receive() per message (else receive_many); `nack_every` > 0 nacks every such message (delay 0) the
         first time it arrives instead of acking it (the redelivery path).
Prints one JSON line: received, distinct, duplicates (deliveries of an offset already
received, beyond the nacked ones' expected second delivery), wrong, seconds, cpu_s."""

import asyncio
import json
import struct
import sys
import time

import uvloop

from danube.client import DanubeClient

SEQ = struct.Struct("<Q")


async def fill(client, cfg):
    topic, n, size = cfg["topic"], cfg["n"], cfg["size"]
    producer = await client.create_producer(topic, "bench-p", reliable=True)
    consumer = await client.subscribe(topic, "bench-c", cfg["sub"],
                                      sub_type=cfg.get("sub_type", "exclusive"))
    await asyncio.sleep(0.5)
    await consumer.close()
    pad = bytes(max(0, size - SEQ.size))
    t0 = time.perf_counter()
    for first in range(0, n, 1000):
        await producer.send_many([SEQ.pack(i) + pad for i in range(first, min(n, first + 1000))],
                                 batch_size=1000)
    return {"published": n, "seconds": time.perf_counter() - t0}


async def drain(client, cfg):
    n, batched = cfg["n"], cfg["acks"] == "batched"
    nack_every = cfg.get("nack_every", 0)
    cpu0, t0 = time.process_time(), time.perf_counter()
    sub_type = cfg.get("sub_type", "exclusive")
    if cfg["acks"] == "default":            # subscribe() with no options at all
        consumer = await client.subscribe(cfg["topic"], "bench-c", cfg["sub"], sub_type)
        batched = True
    else:
        consumer = await client.subscribe(cfg["topic"], "bench-c", cfg["sub"], sub_type,
                                          max_unacked_messages=cfg.get("window"),
                                          batch_acks=batched, ack_batch=cfg.get("ack_batch"))
    one_at_a_time = cfg.get("receive") == "one"
    sequential_acks = cfg.get("sequential_acks", False)
    seen = bytearray(n)
    received = distinct = dups = wrong = nacked = 0
    acks = asyncio.Semaphore(1000)
    pending = set()

    async def ack_one(msg):
        try:
            await consumer.ack(msg)
        finally:
            acks.release()

    unpack = SEQ.unpack_from
    while distinct < n:
        try:
            if one_at_a_time:
                msgs = (await consumer.receive(timeout=cfg.get("idle_timeout", 30)),)
            else:
                msgs = await consumer.receive_many(1000, timeout=cfg.get("idle_timeout", 30))
        except TimeoutError:
            break
        for msg in msgs:
            received += 1
            off = msg.msg_id.topic_offset
            if off >= n or unpack(msg.payload)[0] != off:
                wrong += 1
                continue
            state = seen[off]
            if nack_every and off % nack_every == 0 and state == 0:
                seen[off] = 2               # nacked once: its redelivery is expected
                nacked += 1
                await consumer.nack(msg, delay_ms=0)
                continue
            if state == 1:
                dups += 1
            else:
                distinct += 1
            seen[off] = 1
            if batched or sequential_acks:
                await consumer.ack(msg)
            else:
                await acks.acquire()
                task = asyncio.ensure_future(ack_one(msg))
                pending.add(task)
                task.add_done_callback(pending.discard)
    seconds = time.perf_counter() - t0
    if pending:
        await asyncio.gather(*pending)
    await consumer.flush_acks()
    cpu = time.process_time() - cpu0
    await consumer.close()
    return {"received": received, "distinct": distinct, "duplicates": dups, "wrong": wrong,
            "nacked": nacked, "seconds": seconds, "cpu_s": cpu}


async def main(cfg):
    client = DanubeClient(cfg["url"])
    try:
        result = await (fill if cfg["role"] == "fill" else drain)(client, cfg)
    finally:
        await asyncio.wait_for(client.close(), 10)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    uvloop.run(main(json.loads(sys.argv[1])))
