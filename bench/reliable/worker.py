"""A producer or consumer process for bench.reliable, using this project's client
(danube.client) on uvloop, reliable topics. Run only by bench.reliable.runner:

    python -P -m bench.reliable.worker '<json config>'     (PYTHONPATH=<repo>)

Same line protocol as bench.e2e (bench/e2e/common.py): the worker prints {"event":
"ready"} once connected, waits for {"cmd": "go", "start", "ws", "we"} (ns, time.time_ns
clock), runs until `we`, prints {"event": "result", ...}; the consumer then waits for
{"cmd": "expect", "sources": {...}} and prints its own result after draining. EOF on stdin
means exit.

Payload: [u32 source][u32 seq][u64 time.time_ns() before send] + padding to `size` bytes.
A source is one producer (one per producer task); seq counts from 0 per source.

Producer modes:
  batch       `tasks` producers (one create_producer each), each a loop of
              send_many(batch of `batch` payloads, batch_size=batch): one SendMessages call,
              one durable batch, one batch in flight per producer.
  concurrent  one producer, `concurrency` loops of await send(payload).
  paced       one producer, open loop: message i is due at start + i/rate and gets its own
              send() at once, at most `inflight` outstanding (a message that finds the cap
              reached waits, which shows up as lag behind the schedule).
"""

import asyncio
import json
import struct
import sys
import time
import traceback
from array import array

import numpy as np
import uvloop

from bench.e2e.common import command_queue, emit, next_command, sleep_until_ns
from danube.client import DanubeClient

HEADER = struct.Struct("<IIQ")
MAX_ERRORS = 1000
STALL_MS = 5


def padding(size):
    return b"x" * max(0, size - HEADER.size)


class BatchMaker:
    """A batch's payloads built with numpy instead of a Python expression per message (the
    load generator should cost the producer process as little as it can): the same bytes
    as ``HEADER.pack(sid, seq, t) + padding(size)`` for each seq."""

    def __init__(self, size, n):
        self.size = size = max(size, HEADER.size)
        self.n = n
        rows = np.full((n, size), ord("x"), np.uint8)
        self.rows = rows
        self.sid = rows[:, 0:4].view("<u4")[:, 0]
        self.seq = rows[:, 4:8].view("<u4")[:, 0]
        self.stamp = rows[:, 8:16].view("<u8")[:, 0]
        self.slices = [slice(i, i + size) for i in range(0, n * size, size)]

    def make(self, sid, first, t):
        self.sid[:] = sid
        self.seq[:] = np.arange(first, first + self.n, dtype=np.uint64).astype(np.uint32)
        self.stamp[:] = t
        return list(map(self.rows.tobytes().__getitem__, self.slices))


class Source:
    """One producer's sequence space and what happened to each message."""
    __slots__ = ("sid", "next_seq", "failed")

    def __init__(self, sid):
        self.sid = sid
        self.next_seq = 0
        self.failed = []            # seqs whose send raised (not acknowledged)


class ProducerRun:
    def __init__(self, cfg):
        self.cfg = cfg
        self.errors = 0
        self.first_error = None
        self.acked_in_window = 0    # acknowledged (call returned) inside [ws, we)
        self.acked = 0
        self.rtt_us = array("q")    # per call, calls started inside the window
        self.lag_us = array("q")    # paced: send() called late vs its schedule
        self.sched_us = array("q")  # paced: ack time - scheduled time
        self.stalls = []
        self.cap_waits = 0          # paced: a due message found `inflight` sends outstanding
        self.sources = []
        self._prev_start = None

    def _error(self, exc):
        self.errors += 1
        if self.first_error is None:
            self.first_error = repr(exc)
        if self.errors >= MAX_ERRORS:
            raise RuntimeError(f"{self.errors} send errors, first: {self.first_error}")

    def _done(self, n, t, now, ws, we):
        self.acked += n
        if ws <= now < we:
            self.acked_in_window += n
        if t >= ws:
            self.rtt_us.append((now - t) // 1000)

    async def _batch_loop(self, producer, source, ws, we):
        size = self.cfg["batch"]
        maker = BatchMaker(self.cfg["size"], size)
        sid = source.sid
        clock = time.time_ns
        send_many = producer.send_many
        while True:
            t = clock()
            if t >= we:
                return
            first = source.next_seq
            source.next_seq = first + size
            payloads = maker.make(sid, first, t)
            t = clock()
            try:
                await send_many(payloads, batch_size=size)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                source.failed.extend(range(first, first + size))
                self._error(exc)
                await asyncio.sleep(0.01)
                continue
            self._done(size, t, clock(), ws, we)

    async def batch(self, producers, ws, we):
        await asyncio.gather(*(self._batch_loop(p, s, ws, we)
                               for p, s in zip(producers, self.sources)))

    async def _send_loop(self, producer, source, ws, we):
        pad = padding(self.cfg["size"])
        pack = HEADER.pack
        sid = source.sid
        clock = time.time_ns
        send = producer.send
        while True:
            t = clock()
            if t >= we:
                return
            seq = source.next_seq
            source.next_seq = seq + 1
            try:
                await send(pack(sid, seq, t) + pad)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                source.failed.append(seq)
                self._error(exc)
                await asyncio.sleep(0.01)
                continue
            self._done(1, t, clock(), ws, we)

    async def concurrent(self, producers, ws, we):
        await asyncio.gather(*(self._send_loop(producers[0], self.sources[0], ws, we)
                               for _ in range(self.cfg["concurrency"])))

    async def paced(self, producers, start, ws, we):
        producer, source = producers[0], self.sources[0]
        clock = time.time_ns
        interval = 1e9 / self.cfg["rate"]
        sem = asyncio.Semaphore(self.cfg["inflight"])
        pad = padding(self.cfg["size"])
        tasks = set()
        i = 0
        while True:
            due = start + int(i * interval)
            if due >= we:
                break
            t = clock()
            if due > t:
                # Never less than 1 ms: shorter sleeps round to zero-timeout polls, a busy
                # loop on a machine whose CPUs the broker needs. Messages that fell due
                # while sleeping all go out at once (each its own send()).
                await asyncio.sleep(max((due - t) / 1e9, 0.001))
                continue
            i += 1
            if sem.locked():
                self.cap_waits += 1
            await sem.acquire()
            seq = source.next_seq
            source.next_seq = seq + 1
            task = asyncio.ensure_future(self._paced_send(producer, source, seq, due, pad,
                                                          sem, ws, we))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def _paced_send(self, producer, source, seq, due, pad, sem, ws, we):
        t = time.time_ns()
        prev, self._prev_start = self._prev_start, t
        if prev is not None and t - prev > STALL_MS * 1_000_000 and t >= ws:
            self.stalls.append(((t - ws) / 1e9, (t - prev) / 1e6))
        try:
            await producer.send(HEADER.pack(source.sid, seq, t) + pad)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            source.failed.append(seq)
            self._error(exc)
            return
        finally:
            sem.release()
        now = time.time_ns()
        self._done(1, t, now, ws, we)
        if t >= ws:
            self.lag_us.append((t - due) // 1000)
            self.sched_us.append((now - due) // 1000)

    def result(self):
        out = {"acked": self.acked, "acked_in_window": self.acked_in_window,
               "errors": self.errors, "first_error": self.first_error,
               "sources": {str(s.sid): {"attempted": s.next_seq, "failed": s.failed}
                           for s in self.sources},
               "rtt_us": self.rtt_us.tolist()}
        if self.cfg["mode"] == "paced":
            out["lag_us"] = self.lag_us.tolist()
            out["from_schedule_us"] = self.sched_us.tolist()
            out["cap_waits"] = self.cap_waits
            out["stalls"] = {"count": len(self.stalls),
                             "max_ms": max((g for _, g in self.stalls), default=0.0),
                             "first": [[round(a, 3), round(g, 2)] for a, g in self.stalls[:20]]}
        return out


async def run_producer(cfg, commands):
    client = DanubeClient(cfg["url"])
    try:
        tasks = cfg.get("tasks", 1) if cfg["mode"] == "batch" else 1
        producers = [await client.create_producer(cfg["topic"], f"{cfg['name']}-{i}",
                                                  reliable=True) for i in range(tasks)]
        run = ProducerRun(cfg)
        run.sources = [Source(cfg["source_base"] + i) for i in range(tasks)]
        emit({"event": "ready"})
        go = await next_command(commands, "go")
        await sleep_until_ns(go["start"])
        t0 = time.time_ns()
        if cfg["mode"] == "paced":
            await run.paced(producers, go["start"], go["ws"], go["we"])
        else:
            await getattr(run, cfg["mode"])(producers, go["ws"], go["we"])
        result = run.result()
        result["elapsed_s"] = (time.time_ns() - t0) / 1e9
        emit({"event": "result", **result})
        await next_command(commands, "exit")
    finally:
        await asyncio.wait_for(client.close(), 5)


class Tally:
    """The consumer's accounting: which (source, seq) and which offsets arrived."""

    def __init__(self):
        self.seen = {}              # source -> bytearray bitmap of seqs
        self.offsets = bytearray(1 << 20)
        self.received = 0
        self.duplicates = 0         # a (source, seq) seen again (a redelivery)
        self.offset_duplicates = 0
        self.min_offset = None
        self.max_offset = -1
        self.bad = 0
        self.reordered = 0          # an offset below the previous one (outside redelivery)
        self.last_offset = -1
        self.last_arrival = 0
        self.lat_us = array("q")    # receive time - time before send() (us), in window
        self.ws = self.we = None

    def add(self, msg, now):
        payload = msg.payload
        if len(payload) < HEADER.size:
            self.bad += 1
            return
        sid, seq, stamp = HEADER.unpack_from(payload)
        self.received += 1
        self.last_arrival = now
        bits = self.seen.get(sid)
        if bits is None:
            bits = self.seen[sid] = bytearray(1 << 16)
        if seq >= len(bits):
            bits.extend(bytes(max(len(bits), seq + 1 - len(bits))))
        if bits[seq]:
            self.duplicates += 1
        else:
            bits[seq] = 1
        off = msg.msg_id.topic_offset
        offs = self.offsets
        if off >= len(offs):
            offs.extend(bytes(max(len(offs), off + 1 - len(offs))))
        if offs[off]:
            self.offset_duplicates += 1
        else:
            offs[off] = 1
        if off < self.last_offset:
            self.reordered += 1
        self.last_offset = off
        if self.min_offset is None or off < self.min_offset:
            self.min_offset = off
        if off > self.max_offset:
            self.max_offset = off
        if self.ws is not None and self.ws <= now < self.we:
            self.lat_us.append((now - stamp) // 1000)

    def missing(self, sources):
        """Acknowledged messages (attempted minus failed, per source) never received."""
        missing = 0
        for sid, info in sources.items():
            bits = self.seen.get(int(sid), bytearray())
            n = info["attempted"]
            got = bits.count(1, 0, n)
            failed = set(info["failed"])
            got_failed = sum(1 for s in failed if s < len(bits) and bits[s])
            missing += (n - len(failed)) - (got - got_failed)
        return missing

    def result(self, sources):
        distinct_offsets = self.offsets.count(1)
        if self.min_offset is None:
            gaps = 0
        else:
            gaps = (self.max_offset - self.min_offset + 1) - distinct_offsets
        expected = sum(i["attempted"] - len(i["failed"]) for i in sources.values())
        known = {int(s) for s in sources}
        return {"received": self.received, "duplicates": self.duplicates,
                "expected": expected, "missing": self.missing(sources),
                "unknown_sources": sorted(s for s in self.seen if s not in known),
                "bad_payloads": self.bad,
                "first_offset": self.min_offset, "last_offset": self.max_offset,
                "distinct_offsets": distinct_offsets, "offset_gaps": gaps,
                "offset_duplicates": self.offset_duplicates,
                "offsets_contiguous": gaps == 0 and self.min_offset in (0, None),
                "reordered": self.reordered,
                "latency_us": self.lat_us.tolist()}


async def run_consumer(cfg, commands):
    client = DanubeClient(cfg["url"])
    task = None
    try:
        consumer = await client.subscribe(cfg["topic"], cfg["name"], cfg["sub"],
                                          sub_type="exclusive")
        tally = Tally()
        acks = asyncio.Semaphore(cfg.get("ack_window", 256))
        ack_errors = [0]

        async def ack(msg):
            try:
                await consumer.ack(msg)
            except Exception:  # noqa: BLE001 - counted; the broker redelivers
                ack_errors[0] += 1
            finally:
                acks.release()

        async def pump():
            receive = consumer.receive
            clock = time.time_ns
            add = tally.add
            while True:
                msg = await receive()
                add(msg, clock())
                await acks.acquire()
                asyncio.ensure_future(ack(msg))

        task = asyncio.ensure_future(pump())
        emit({"event": "ready"})
        go = await next_command(commands, "go")
        tally.ws, tally.we = go["ws"], go["we"]
        expect = await next_command(commands, "expect")
        sources = expect["sources"]
        clock = time.time_ns
        idle = cfg.get("drain_idle_s", 3.0) * 1e9
        deadline = clock() + cfg.get("drain_max_s", 30.0) * 1e9
        while tally.missing(sources) > 0:
            now = clock()
            if task.done() or now > deadline or now - max(tally.last_arrival, go["we"]) > idle:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)        # late duplicates
        error = None
        if task.done() and task.exception() is not None:
            error = "".join(traceback.format_exception(task.exception()))
        emit({"event": "result", **tally.result(sources), "ack_errors": ack_errors[0],
              "receive_error": error})
        await next_command(commands, "exit")
    finally:
        if task is not None:
            task.cancel()
        await asyncio.wait_for(client.close(), 5)


async def worker(cfg):
    commands = command_queue(asyncio.get_running_loop())
    if cfg["role"] == "producer":
        await run_producer(cfg, commands)
    else:
        await run_consumer(cfg, commands)


def main():
    cfg = json.loads(sys.argv[1])
    uvloop.run(worker(cfg))


if __name__ == "__main__":
    main()
