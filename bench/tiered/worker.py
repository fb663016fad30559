"""Client processes for bench.tiered, using this project's client (danube.client) on uvloop,
reliable topics. Run only by bench.tiered.runner:

    python -P -m bench.tiered.worker '<json config>'     (PYTHONPATH=<repo>)

Line protocol as in bench.e2e (bench/e2e/common.py): JSON events on stdout, JSON commands on
stdin, EOF on stdin means exit.

Roles:

  replay  Creates the reliable topic (a producer), creates the reliable subscription `sub`
          (subscribe, let the stream open, close: the subscription stays, at the live
          tail) and prints {"event": "ready"}. On {"cmd": "publish"} it publishes `n`
          payloads of `size` bytes with send_many (batches of `batch`) and prints
          "published". On {"cmd": "drain"} it subscribes again, receives every one of the
          `n` messages with Consumer.receive() and acks each (acks pipelined, at most
          `ack_window` outstanding), and prints "drained" with the timings.
          Payload: [u64 sequence number] + padding; the drain checks that message i has
          topic offset i and sequence number i.

  bulk    A producer pushing `rate_bytes` payload bytes per second into its topic with
          send_many(`batch` payloads of `size` bytes): batch i is due at start + i /
          batches_per_s (a schedule; late batches go out back to back). Waits for
          {"cmd": "go", "start", "ws", "we"} (ns, time.time_ns clock), runs until `we` and
          prints "result".
"""

import asyncio
import json
import struct
import sys
import time
from array import array

import uvloop

from bench.e2e.common import command_queue, emit, next_command, sleep_until_ns
from danube.client import DanubeClient

SEQ = struct.Struct("<Q")


def payloads(first, n, size):
    pad = bytes((i * 7) & 0xFF for i in range(max(0, size - SEQ.size)))
    pack = SEQ.pack
    return [pack(i) + pad for i in range(first, first + n)]


async def run_replay(cfg, commands):
    client = DanubeClient(cfg["url"])
    try:
        topic, sub = cfg["topic"], cfg["sub"]
        producer = await client.create_producer(topic, f"{cfg['name']}-p", reliable=True)
        consumer = await client.subscribe(topic, f"{cfg['name']}-c", sub, sub_type="exclusive")
        # Let the ReceiveMessages stream open (a consumer closed before that stays
        # registered on the broker until its grace runs out), then close: the reliable
        # subscription stays, waiting at the live tail.
        await asyncio.sleep(0.5)
        await consumer.close()
        emit({"event": "ready"})

        await next_command(commands, "publish")
        n, size, batch = cfg["n"], cfg["size"], cfg["batch"]
        t0 = time.perf_counter()
        for first in range(0, n, batch):
            await producer.send_many(payloads(first, min(batch, n - first), size),
                                     batch_size=batch)
        emit({"event": "published", "seconds": time.perf_counter() - t0})

        await next_command(commands, "drain")
        acks = asyncio.Semaphore(cfg.get("ack_window", 1000))
        ack_errors = [0]
        pending = set()

        cpu0 = time.process_time()
        t0 = time.perf_counter()
        consumer = await client.subscribe(topic, f"{cfg['name']}-c", sub, sub_type="exclusive")
        t_subscribed = time.perf_counter()

        async def ack(msg):
            try:
                await consumer.ack(msg)
            except Exception:  # noqa: BLE001 - counted; the broker would redeliver
                ack_errors[0] += 1
            finally:
                acks.release()

        receive = consumer.receive
        unpack = SEQ.unpack_from
        wrong = dups = 0
        expected = 0
        t_first = None
        while expected < n:
            try:
                msg = await receive(timeout=cfg.get("idle_timeout", 60))
            except TimeoutError:
                break
            if t_first is None:
                t_first = time.perf_counter()
            off = msg.msg_id.topic_offset
            if off < expected:
                dups += 1               # a redelivery: not counted again
            else:
                if off != expected or unpack(msg.payload)[0] != off:
                    wrong += 1
                expected = off + 1
            await acks.acquire()
            task = asyncio.ensure_future(ack(msg))
            pending.add(task)
            task.add_done_callback(pending.discard)
        t_last = time.perf_counter()
        cpu1 = time.process_time()
        if pending:
            await asyncio.gather(*pending)
        t_acked = time.perf_counter()
        emit({"event": "drained", "received": expected, "complete": expected >= n,
              "out_of_order_or_wrong": wrong, "redelivered": dups,
              "ack_errors": ack_errors[0],
              "subscribe_s": t_subscribed - t0,
              "first_message_s": (t_first - t0) if t_first is not None else None,
              "seconds": t_last - t0, "acks_done_s": t_acked - t0,
              "cpu_s": cpu1 - cpu0})
        await consumer.close()
        await next_command(commands, "exit")
    finally:
        await asyncio.wait_for(client.close(), 5)


async def run_bulk(cfg, commands):
    client = DanubeClient(cfg["url"])
    try:
        producer = await client.create_producer(cfg["topic"], cfg["name"], reliable=True)
        size, batch = cfg["size"], cfg["batch"]
        data = payloads(0, batch, size)
        per_s = cfg["rate_bytes"] / (size * batch)
        emit({"event": "ready", "batches_per_s": per_s})
        go = await next_command(commands, "go")
        start, ws, we = go["start"], go["ws"], go["we"]
        await sleep_until_ns(start)
        clock = time.time_ns
        calls_us = array("q")
        sent = sent_in_window = errors = late = 0
        first_error = None
        i = 0
        while True:
            due = start + int(i * 1e9 / per_s)
            if due >= we:
                break
            now = clock()
            if due > now:
                await asyncio.sleep((due - now) / 1e9)
                continue
            if now - due > 100_000_000:
                late += 1
            i += 1
            t = clock()
            try:
                await producer.send_many(data, batch_size=batch)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors += 1
                first_error = first_error or repr(exc)
                await asyncio.sleep(0.01)
                continue
            end = clock()
            sent += batch
            if ws <= end < we:
                sent_in_window += batch
            if t >= ws:
                calls_us.append((end - t) // 1000)
        emit({"event": "result", "sent": sent, "sent_in_window": sent_in_window,
              "bytes_in_window": sent_in_window * size, "errors": errors,
              "first_error": first_error, "late_batches": late,
              "call_us": calls_us.tolist()})
        await next_command(commands, "exit")
    finally:
        await asyncio.wait_for(client.close(), 5)


async def worker(cfg):
    commands = command_queue(asyncio.get_running_loop())
    if cfg["role"] == "replay":
        await run_replay(cfg, commands)
    elif cfg["role"] == "bulk":
        await run_bulk(cfg, commands)
    else:
        raise SystemExit(f"unknown role {cfg['role']!r}")


def main():
    uvloop.run(worker(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
