"""The peer: NATS JetStream's pull consumer through nats-py.
`python -P -m bench.consume.nats_worker '<json>'`.

  fill   creates the file-backed stream `stream` on subject `subject` and publishes `n`
         payloads of `size` bytes ([u64 sequence number] + padding) as core NATS publishes
         the stream captures, then waits until the stream holds all of them.
  drain  a durable pull consumer (max_ack_pending `window`) fetching batches of up to 1000:
         `acks` "each" (AckPolicy.EXPLICIT, msg.ack() per message) or "all" (AckPolicy.ALL,
         the last message of every 1000 acked). Checks every sequence number arrives.
Prints one JSON line like bench.consume.worker's."""

import asyncio
import json
import struct
import sys
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

SEQ = struct.Struct("<Q")


async def fill(nc, js, cfg):
    n, size, subject = cfg["n"], cfg["size"], cfg["subject"]
    await js.add_stream(StreamConfig(name=cfg["stream"], subjects=[subject],
                                     storage=StorageType.FILE))
    pad = bytes(max(0, size - SEQ.size))
    t0 = time.perf_counter()
    for i in range(n):
        await nc.publish(subject, SEQ.pack(i) + pad)
        if i % 10000 == 9999:
            await nc.flush()
    await nc.flush()
    while (await js.stream_info(cfg["stream"])).state.messages < n:
        await asyncio.sleep(0.05)
    return {"published": n, "seconds": time.perf_counter() - t0}


async def drain(nc, js, cfg):
    n, each = cfg["n"], cfg["acks"] == "each"
    cpu0, t0 = time.process_time(), time.perf_counter()
    psub = await js.pull_subscribe(
        cfg["subject"], durable=cfg["durable"], stream=cfg["stream"],
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT if each else AckPolicy.ALL,
                              max_ack_pending=cfg.get("window", 1000), ack_wait=60))
    seen = bytearray(n)
    received = distinct = dups = wrong = 0
    while distinct < n:
        try:
            msgs = await psub.fetch(1000, timeout=cfg.get("idle_timeout", 30))
        except nats.errors.TimeoutError:
            break
        for msg in msgs:
            received += 1
            seq = SEQ.unpack_from(msg.data)[0]
            if seq >= n:
                wrong += 1
            elif seen[seq]:
                dups += 1
            else:
                seen[seq] = 1
                distinct += 1
            if each:
                await msg.ack()
        if not each and msgs:
            await msgs[-1].ack()
    seconds = time.perf_counter() - t0
    await nc.flush()
    return {"received": received, "distinct": distinct, "duplicates": dups, "wrong": wrong,
            "nacked": 0, "seconds": seconds, "cpu_s": time.process_time() - cpu0}


async def main(cfg):
    nc = await nats.connect(cfg["url"])
    try:
        js = nc.jetstream()
        result = await (fill if cfg["role"] == "fill" else drain)(nc, js, cfg)
    finally:
        await nc.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
