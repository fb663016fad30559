"""Shared by the e2e benchmark's worker processes: the payload format, the producer loops
(flood / concurrent / batch / paced), the consumer's loss and latency accounting, and the
line protocol with the orchestrator.

STANDARD LIBRARY ONLY: this module is also imported by official_worker.py, which runs
under the official client's interpreter (`-I`, its own virtualenv), where neither our
`danube` package nor anything else of this repository may be imported.

Protocol: the worker gets its configuration as one JSON argument, writes JSON lines to
stdout ({"event": "ready"}, then {"event": "result", ...}) and reads JSON lines from stdin
({"cmd": "go", "start": ns, "ws": ns, "we": ns}, {"cmd": "expect", "n": N},
{"cmd": "exit"}). EOF on stdin means exit.
"""

import asyncio
import json
import struct
import sys
import threading
import time
import traceback
from array import array

PAYLOAD_SIZE = 100
# seq, scheduled time (ns, = stamp unless paced), stamp taken right before send() (ns)
HEADER = struct.Struct("<QQQ")
PAD = b"x" * (PAYLOAD_SIZE - HEADER.size)
MAX_ERRORS = 1000
STALL_MS = 5        # paced producer: a gap this long between two send() calls is a stall


def make_payload(seq, sched_ns, stamp_ns):
    return HEADER.pack(seq, sched_ns, stamp_ns) + PAD


def percentiles(values, points=(50, 90, 99, 99.9)):
    """{"p50": .., "p99": .., "max": .., "mean": .., "n": ..} in ms of a sequence of ns."""
    n = len(values)
    if not n:
        return {"n": 0}
    s = sorted(values)
    out = {"n": n}
    for p in points:
        # nearest-rank
        k = max(0, min(n - 1, int(-(-p * n // 100)) - 1))
        out[f"p{p:g}"] = s[k] / 1e6
    out["min"] = s[0] / 1e6
    out["max"] = s[-1] / 1e6
    out["mean"] = sum(s) / n / 1e6
    return out


def us_percentiles(values_us):
    """``percentiles`` (ms) of microsecond values."""
    return percentiles([v * 1000 for v in values_us])


def format_table(head, rows):
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) if rows else len(head[i])
              for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(head, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


# -- stdio protocol ----------------------------------------------------------------------

def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def command_queue(loop):
    """An asyncio.Queue fed with the orchestrator's JSON commands (None on EOF)."""
    queue = asyncio.Queue()

    def reader():
        for line in sys.stdin:
            line = line.strip()
            if line:
                loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=reader, daemon=True).start()
    return queue


async def next_command(queue, name):
    while True:
        cmd = await queue.get()
        if cmd is None:
            raise SystemExit(f"orchestrator went away while waiting for {name!r}")
        if cmd.get("cmd") == name:
            return cmd
        if cmd.get("cmd") == "exit":
            raise SystemExit(0)


async def sleep_until_ns(t_ns):
    left = (t_ns - time.time_ns()) / 1e9
    if left > 0:
        await asyncio.sleep(left)


# -- producer ----------------------------------------------------------------------------

class ProducerRun:
    """Runs one producer mode between `start` and `we` (ns, time.time_ns clock)."""

    def __init__(self, adapter, cfg):
        self.adapter = adapter
        self.cfg = cfg
        self.next_seq = 0
        self.sent = 0               # acknowledged by the broker
        self.sent_in_window = 0
        self.errors = 0
        self.first_error = None
        self.rtt = array("q")       # send() call durations in the window (ns)
        self.lag = array("q")       # paced: how late send() was called vs. schedule (ns)
        self.stalls = []            # paced: (s into the window, ms) gaps between send() calls
        self._prev_start = None

    def _error(self, exc):
        self.errors += 1
        if self.first_error is None:
            self.first_error = repr(exc)
        if self.errors >= MAX_ERRORS:
            raise RuntimeError(f"{self.errors} send errors, first: {self.first_error}")

    async def _send_loop(self, ws, we):
        send = self.adapter.send
        clock = time.time_ns
        while True:
            t = clock()
            if t >= we:
                return
            seq = self.next_seq
            self.next_seq = seq + 1
            try:
                await send(HEADER.pack(seq, t, t) + PAD)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                self._error(exc)
                await asyncio.sleep(0.01)
                continue
            self.sent += 1
            if t >= ws:
                self.sent_in_window += 1
                self.rtt.append(clock() - t)

    async def flood(self, ws, we):
        await self._send_loop(ws, we)

    async def concurrent(self, ws, we):
        await asyncio.gather(*(self._send_loop(ws, we)
                               for _ in range(self.cfg["concurrency"])))

    async def _batch_loop(self, ws, we):
        send_many = self.adapter.send_many
        size = self.cfg["batch"]
        clock = time.time_ns
        pack = HEADER.pack
        while True:
            t = clock()
            if t >= we:
                return
            first = self.next_seq
            self.next_seq = first + size
            payloads = [pack(seq, t, t) + PAD for seq in range(first, first + size)]
            try:
                await send_many(payloads)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                self._error(exc)
                await asyncio.sleep(0.01)
                continue
            self.sent += size
            if t >= ws:
                self.sent_in_window += size
                self.rtt.append(clock() - t)

    async def batch(self, ws, we):
        await asyncio.gather(*(self._batch_loop(ws, we)
                               for _ in range(self.cfg.get("inflight", 1))))

    async def paced(self, start, ws, we):
        """Message i is due at start + i/rate: a schedule, so the rate never drifts. The
        event loop's timers have ~1 ms resolution, so the messages that fell due while
        sleeping go out together. With cfg["inflight"] == 1 (default) they are sent one
        send() at a time, each awaited before the next; with inflight N each due message
        gets its own send() call at once (open loop), at most N outstanding. Each payload
        carries the scheduled time and the time its send() was called."""
        send = self.adapter.send
        clock = time.time_ns
        interval = 1e9 / self.cfg["rate"]
        inflight = self.cfg.get("inflight", 1)
        sem = asyncio.Semaphore(inflight) if inflight > 1 else None
        tasks = set()
        i = 0
        while True:
            due = start + int(i * interval)
            if due >= we:
                break
            t = clock()
            if due > t:
                # Never ask for less than 1 ms: shorter sleeps round to zero-timeout polls
                # (a busy loop on a machine whose CPUs the broker and consumer need).
                await asyncio.sleep(max((due - t) / 1e9, 0.001))
                continue
            i += 1
            seq = self.next_seq
            self.next_seq = seq + 1
            if sem is None:
                await self._paced_send(send, seq, due, ws)
            else:
                await sem.acquire()
                task = asyncio.ensure_future(self._paced_send(send, seq, due, ws, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def _paced_send(self, send, seq, due, ws, sem=None):
        t = time.time_ns()
        prev, self._prev_start = self._prev_start, t
        if prev is not None and t - prev > STALL_MS * 1_000_000 and t >= ws:
            # Sends start at most ~1 ms apart; a longer gap is a stall of this process
            # (event loop blocked, or not scheduled).
            self.stalls.append(((t - ws) / 1e9, (t - prev) / 1e6))
        try:
            await send(HEADER.pack(seq, due, t) + PAD)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            self._error(exc)
            return
        finally:
            if sem is not None:
                sem.release()
        self.sent += 1
        if t >= ws:
            self.sent_in_window += 1
            self.rtt.append(time.time_ns() - t)
            self.lag.append(t - due)

    def result(self):
        out = {"sent": self.sent, "attempted": self.next_seq,
               "sent_in_window": self.sent_in_window, "errors": self.errors,
               "first_error": self.first_error, "send_rtt_ms": percentiles(self.rtt)}
        if self.cfg["mode"] == "paced":
            out["pacer_lag_ms"] = percentiles(self.lag)
            out["stalls"] = {"count": len(self.stalls),
                             "total_ms": sum(g for _, g in self.stalls),
                             "max_ms": max((g for _, g in self.stalls), default=0.0),
                             "first": [[round(a, 3), round(g, 2)] for a, g in self.stalls[:50]]}
        return out


async def run_producer(adapter, cfg, commands):
    await adapter.setup_producer(cfg)
    emit({"event": "ready"})
    go = await next_command(commands, "go")
    run = ProducerRun(adapter, cfg)
    await sleep_until_ns(go["start"])
    mode = cfg["mode"]
    t0 = time.time_ns()
    if mode == "paced":
        await run.paced(go["start"], go["ws"], go["we"])
    else:
        await getattr(run, mode)(go["ws"], go["we"])
    result = run.result()
    result["elapsed_s"] = (time.time_ns() - t0) / 1e9
    emit({"event": "result", **result})
    await next_command(commands, "exit")


# -- consumer ----------------------------------------------------------------------------

class Recorder:
    """Per-message accounting at the consumer: every sequence number is marked in a
    bitmap (distinct / duplicates / reordered), and the messages received inside the
    measured window are counted and their end-to-end latencies kept."""

    def __init__(self):
        self.seen = bytearray(1 << 20)
        self.received = 0
        self.distinct = 0
        self.duplicates = 0
        self.reordered = 0
        self.last_seq = -1
        self.ws = self.we = None
        self.in_window = 0
        self.lat = array("q")        # receive time - stamp taken before send() (ns)
        self.lat_sched = array("q")  # receive time - scheduled send time (ns)
        self.bad = 0
        self.last_arrival = 0

    def add(self, payload, now):
        if len(payload) != PAYLOAD_SIZE:
            self.bad += 1
            return
        seq, sched, stamp = HEADER.unpack_from(payload)
        self.received += 1
        self.last_arrival = now
        seen = self.seen
        if seq >= len(seen):
            seen.extend(bytes(max(len(seen), seq + 1 - len(seen))))
        if seen[seq]:
            self.duplicates += 1
        else:
            seen[seq] = 1
            self.distinct += 1
        if seq < self.last_seq:
            self.reordered += 1
        self.last_seq = seq
        ws = self.ws
        if ws is not None and ws <= now < self.we:
            self.in_window += 1
            self.lat.append(now - stamp)
            self.lat_sched.append(now - sched)

    def got(self, n):
        """How many of the sequence numbers 0..n-1 arrived."""
        return self.seen.count(1, 0, n)

    def result(self, n):
        return {"received": self.received, "distinct": self.distinct,
                "duplicates": self.duplicates, "reordered": self.reordered,
                "bad_payloads": self.bad, "expected": n, "missing": n - self.got(n),
                "beyond_expected": self.seen.count(1, n),
                "received_in_window": self.in_window,
                "latency_ms": percentiles(self.lat),
                "latency_from_schedule_ms": percentiles(self.lat_sched)}


async def run_consumer(adapter, cfg, commands):
    await adapter.setup_consumer(cfg)
    rec = Recorder()
    receive = adapter.receive
    clock = time.time_ns

    async def pump():
        add = rec.add
        while True:
            payload = await receive()
            add(payload, clock())

    task = asyncio.ensure_future(pump())
    emit({"event": "ready"})
    try:
        go = await next_command(commands, "go")
        rec.ws, rec.we = go["ws"], go["we"]
        expect = await next_command(commands, "expect")
        n = expect["n"]
        # Drain: until every expected message arrived, or nothing arrived for `idle` s.
        idle = cfg.get("drain_idle_s", 2.0) * 1e9
        deadline = clock() + cfg.get("drain_max_s", 20.0) * 1e9
        while rec.got(n) < n:
            now = clock()
            if task.done() or now > deadline or now - max(rec.last_arrival, go["we"]) > idle:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)    # late duplicates
        if task.done() and task.exception() is not None:
            error = "".join(traceback.format_exception(task.exception()))
        else:
            error = None
        emit({"event": "result", **rec.result(n), "receive_error": error})
        await next_command(commands, "exit")
    finally:
        task.cancel()


async def worker(adapter, cfg):
    commands = command_queue(asyncio.get_running_loop())
    try:
        if cfg["role"] == "producer":
            await run_producer(adapter, cfg, commands)
        else:
            await run_consumer(adapter, cfg, commands)
    finally:
        try:
            await asyncio.wait_for(adapter.close(), 5)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
