"""The load generator of bench.scale: worker processes (multiprocessing, spawned) speaking to
the broker through the project's own HTTP/2 client (danube.rpc.client.Channel) with raw unary
calls, and a reliable producer per topic (ProducerRequest.dispatch_strategy = Reliable: the
first producer auto-creates the topic as a reliable one).

Two jobs, each split over `procs` processes:

- create(): make topics [first, last) each with a producer and one 100 B message acknowledged,
  `inflight` topics being made at a time per process;
- closed_loop(): one producer per topic, each with one message in flight (send, wait for the
  ack, send again), counting the acks that come inside a wall-clock window and their latency.

The SendMessage requests are encoded once per producer and the answers are not decoded: the
generator spends its CPU on the calls, not on protobuf, so that it can outrun the broker.
"""

import array
import asyncio
import multiprocessing
import os
import resource
import time

PAYLOAD = b"x" * 100
CREATE = "/danube.ProducerService/CreateProducer"
SEND = "/danube.ProducerService/SendMessage"
CALL_TIMEOUT = 60.0
#: A create worker stops after this many errors: the sweep stops at the step anyway, and a
#: broker out of descriptors would otherwise be asked for every remaining topic.
MAX_ERRORS = 50

_ctx = multiprocessing.get_context("spawn")


def topic_name(prefix, i):
    return f"/default/{prefix}-{i}"


def _raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _calls(channel):
    from danube.proto import DanubeApi_pb2 as pb
    create = channel.unary_unary(CREATE, pb.ProducerRequest.SerializeToString,
                                 pb.ProducerResponse.FromString)
    # Raw bytes both ways: the request is encoded once, the answer (a request id) not read.
    send = channel.unary_unary(SEND, bytes, bytes)
    return pb, create, send


def _message(pb, producer_id, topic):
    return pb.StreamMessage(request_id=1, payload=PAYLOAD, producer_name="p",
                            msg_id=pb.MsgID(producer_id=producer_id,
                                            topic_name=topic)).SerializeToString()


async def _producer(pb, create, topic, name="p"):
    r = await create(pb.ProducerRequest(request_id=1, producer_name=name, topic_name=topic,
                                        dispatch_strategy=pb.Reliable), timeout=CALL_TIMEOUT)
    return r.producer_id


def _error(exc):
    return f"{type(exc).__name__}: {exc}"[:500]


def _split(items, procs):
    """`items` dealt round-robin into at most `procs` non-empty lists."""
    parts = [items[i::procs] for i in range(max(1, min(procs, len(items))))]
    return [p for p in parts if p]


class _Workers:
    """Worker processes running `target(pipe, *args)`, one args tuple each."""

    def __init__(self, target, arg_tuples):
        self.pipes, self.procs = [], []
        for args in arg_tuples:
            ours, theirs = _ctx.Pipe()
            p = _ctx.Process(target=target, args=(theirs, *args), daemon=True)
            p.start()
            theirs.close()
            self.pipes.append(ours)
            self.procs.append(p)

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def recv_all(self, timeout):
        out = []
        deadline = time.monotonic() + timeout
        for pipe, proc in zip(self.pipes, self.procs):
            while not pipe.poll(0.2):
                if not proc.is_alive():
                    raise RuntimeError(f"load worker {proc.pid} exited ({proc.exitcode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"load worker {proc.pid} did not answer in "
                                       f"{timeout:.0f} s")
            out.append(pipe.recv())
        return out

    def send_all(self, msg):
        for pipe in self.pipes:
            pipe.send(msg)

    def stop(self):
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


# -- create topics ----------------------------------------------------------------------

def create(addr, prefix, first, last, *, procs=2, inflight=16, connections_per_proc=1,
           keep=False):
    """Create topics [first, last): a reliable producer and one acknowledged message each.
    Returns (result, workers): result = {created, errors, first_error, seconds}; with `keep`
    the workers still hold their connections open (call workers.stop() later), else they are
    already stopped."""
    indexes = list(range(first, last))
    parts = _split(indexes, procs)
    workers = _Workers(_create_main, [(addr, prefix, part, inflight, connections_per_proc)
                                      for part in parts])
    try:
        workers.recv_all(60)                     # connected
        t0 = time.perf_counter()
        workers.send_all("go")
        reports = workers.recv_all(CALL_TIMEOUT * 4 + len(indexes) / 20)
        seconds = time.perf_counter() - t0
    except BaseException:
        workers.stop()
        raise
    if not keep:
        workers.stop()
    errors = sum(r["errors"] for r in reports)
    return {"created": sum(r["created"] for r in reports), "attempted":
            sum(r["attempted"] for r in reports), "errors": errors,
            "first_error": next((r["first_error"] for r in reports if r["first_error"]), None),
            "seconds": seconds}, workers


def _create_main(pipe, addr, prefix, indexes, inflight, connections):
    _raise_nofile()
    import uvloop
    uvloop.run(_create(pipe, addr, prefix, indexes, inflight, connections))


async def _create(pipe, addr, prefix, indexes, inflight, connections):
    from danube.rpc.client import Channel
    channels = [Channel(addr) for _ in range(connections)]
    for ch in channels:
        await ch.connection()
    calls = [_calls(ch) for ch in channels]
    loop = asyncio.get_running_loop()
    pipe.send("ready")
    await loop.run_in_executor(None, pipe.recv)
    state = {"created": 0, "attempted": 0, "errors": 0, "first_error": None}
    todo = iter(indexes)

    async def one_by_one(k):
        pb, create_producer, send = calls[k % len(calls)]
        for i in todo:
            if state["errors"] >= MAX_ERRORS:
                return
            state["attempted"] += 1
            topic = topic_name(prefix, i)
            try:
                pid = await _producer(pb, create_producer, topic)
                await send(_message(pb, pid, topic), timeout=CALL_TIMEOUT)
                state["created"] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                state["errors"] += 1
                state["first_error"] = state["first_error"] or f"{topic}: {_error(exc)}"

    await asyncio.gather(*(one_by_one(k) for k in range(inflight)))
    pipe.send(state)
    await loop.run_in_executor(None, pipe.recv)     # held open until told (keep)
    for ch in channels:
        await ch.close()


# -- one message in flight per producer ---------------------------------------------------

class ClosedLoop:
    """Producers on `topics`, spread over `procs` processes with `connections` connections
    in all; start() creates the producers and sends one message each, run() measures."""

    def __init__(self, addr, topics, *, procs=2, connections=8):
        parts = _split(list(topics), procs)
        per_proc = max(1, connections // len(parts))
        self.workers = _Workers(_loop_main, [(addr, part, per_proc) for part in parts])
        ready = self.workers.recv_all(120 + len(topics) / 20)
        errors = [r for r in ready if r.get("error")]
        if errors:
            self.workers.stop()
            raise RuntimeError(f"producers not created: {errors[0]['error']}")

    @property
    def pids(self):
        return self.workers.pids

    def run(self, start_at, end_at):
        """Tell the workers the window [start_at, end_at) (time.time()); they send from now
        until end_at. Returns their reports once the window is over."""
        self.workers.send_all((start_at, end_at))

    def results(self):
        reports = self.workers.recv_all(CALL_TIMEOUT * 2)
        lat = array.array("f")
        for r in reports:
            lat.frombytes(r.pop("latency_ms"))
        return reports, lat

    def stop(self):
        self.workers.stop()


def _loop_main(pipe, addr, topics, connections):
    _raise_nofile()
    import uvloop
    uvloop.run(_loop(pipe, addr, topics, connections))


async def _loop(pipe, addr, topics, connections):
    from danube.rpc.client import Channel
    channels = [Channel(addr) for _ in range(min(connections, len(topics)))]
    calls = [_calls(ch) for ch in channels]
    loop = asyncio.get_running_loop()
    producers = []
    try:
        for i, topic in enumerate(topics):
            pb, create_producer, send = calls[i % len(calls)]
            pid = await _producer(pb, create_producer, topic)
            body = _message(pb, pid, topic)
            await send(body, timeout=CALL_TIMEOUT)
            producers.append((send, body))
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        pipe.send({"error": _error(exc)})
        return
    pipe.send({"ready": len(producers)})
    while True:
        window = await loop.run_in_executor(None, pipe.recv)
        if window is None:
            break
        start_at, end_at = window
        lat = array.array("f")
        state = {"acks": 0, "errors": 0, "first_error": None}
        clock, wall = time.perf_counter, time.time

        async def one(send, body):
            while True:
                t0 = clock()
                try:
                    await send(body, timeout=CALL_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - counted
                    state["errors"] += 1
                    state["first_error"] = state["first_error"] or _error(exc)
                    await asyncio.sleep(0.01)
                    continue
                took = clock() - t0
                now = wall()
                if now >= end_at:
                    return
                if now >= start_at:
                    state["acks"] += 1
                    lat.append(took * 1e3)

        await asyncio.gather(*(one(s, b) for s, b in producers))
        state["latency_ms"] = lat.tobytes()
        state["pid"] = os.getpid()
        pipe.send(state)
    for ch in channels:
        await ch.close()
