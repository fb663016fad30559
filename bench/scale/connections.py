"""Many connections: `count` client connections held open at once, each with a producer that
has sent one message, and what they cost the broker in RSS.

    measure("127.0.0.1", port, broker_pid, 10_000, procs=4, reliable=False)

The connections are opened by `procs` worker processes (this file run as a script, each with
its own descriptor limit raised to the hard one), `count / procs` each, on the project's own
HTTP/2 client: one Channel per connection, CreateProducer then SendMessage on it, raw unary
calls with the protobufs of danube/proto. The producers share a few topics (TOPICS), so what
is measured is the connection and its producer, not the topic. The broker is reached only
through the wire and /proc, so the same function measures any build's broker.

Run alone it starts a standalone broker of the installed build and prints the result:

    .venv/bin/python bench/scale/connections.py [--count 10000] [--procs 4] [--reliable]
"""

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time

#: Topics the producers are spread over (producer i on topic i % TOPICS).
TOPICS = 16
#: Connections a worker has being opened (connect, CreateProducer, SendMessage) at once;
#: more only fills the broker's accept queue.
OPENING_AT_ONCE = 64
#: Seconds a call may take before it counts as an error.
CALL_TIMEOUT = 60.0
PAYLOAD = b"x" * 100


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def measure(host: str, port: int, broker_pid: int, count: int, *, procs: int = 4,
            reliable: bool = False) -> dict:
    """Open `count` connections to the broker at host:port, each with a producer that sends
    one message, hold them all, and return what they cost the broker (process `broker_pid`):
    count, served (producer created and message acknowledged), errors, first_error,
    rss_before_kb, rss_after_kb, rss_per_conn_kb, seconds (to open them all), and
    broker_fds_before/after, answers_after (the broker still answered a new connection's
    call with all of them open)."""
    procs = max(1, min(procs, count))
    shares = [count // procs + (i < count % procs) for i in range(procs)]
    rss_before = rss_kb(broker_pid)
    fds_before = open_fds(broker_pid)
    started = time.perf_counter()
    workers = []
    base = 0
    try:
        for share in shares:
            workers.append(_Worker(host, port, base, share, reliable))
            base += share
        reports = [w.report(timeout=CALL_TIMEOUT * 2 + count / 50) for w in workers]
        seconds = time.perf_counter() - started
        # What the broker frees or grows after the last answer (a deferred write, the
        # allocator) settles within a moment; every connection is still open meanwhile.
        time.sleep(1.0)
        rss_after = rss_kb(broker_pid)
        fds_after = open_fds(broker_pid)
        answers_after = _answers(host, port, reliable)
    finally:
        for w in workers:
            w.stop()
    served = sum(r["served"] for r in reports)
    errors = sum(r["errors"] for r in reports)
    first_error = next((r["first_error"] for r in reports if r["first_error"]), None)
    return {
        "count": count, "reliable": reliable, "procs": procs,
        "served": served, "errors": errors, "first_error": first_error,
        "rss_before_kb": rss_before, "rss_after_kb": rss_after,
        "rss_per_conn_kb": round((rss_after - rss_before) / count, 2) if count else 0.0,
        "seconds": round(seconds, 2),
        "broker_fds_before": fds_before, "broker_fds_after": fds_after,
        "answers_after": answers_after,
    }


def _answers(host, port, reliable):
    """Whether a new connection still gets a producer and an acknowledged message. On a
    thread of its own, so that a caller running an event loop can call measure() too."""
    import uvloop
    answered = []

    def check():
        try:
            answered.append(uvloop.run(_one_connection(
                host, port, "/default/conns-after", "conn-after", reliable)) is None)
        except Exception:  # noqa: BLE001 - any failure means it did not answer
            answered.append(False)
    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    thread.join(CALL_TIMEOUT * 2 + 10)
    return bool(answered and answered[0])


class _Worker:
    """A worker process holding `count` connections; reports once they are all open (or
    failed) and closes them when its stdin closes."""

    def __init__(self, host, port, base, count, reliable):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", host, str(port),
             str(base), str(count)] + (["--reliable"] if reliable else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._err = []
        threading.Thread(target=lambda: self._err.extend(self.proc.stderr), daemon=True).start()

    def report(self, timeout):
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            raise RuntimeError(f"connections worker exited (rc={self.proc.poll()}) without "
                               f"a report:\n{''.join(self._err[-20:])}")
        return json.loads(line)

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the worker process ------------------------------------------------------------------

def _calls(channel):
    from danube.proto import DanubeApi_pb2 as pb
    create = channel.unary_unary("/danube.ProducerService/CreateProducer",
                                 pb.ProducerRequest.SerializeToString,
                                 pb.ProducerResponse.FromString)
    send = channel.unary_unary("/danube.ProducerService/SendMessage",
                               pb.StreamMessage.SerializeToString,
                               pb.MessageResponse.FromString)
    return pb, create, send


async def _one_connection(host, port, topic, name, reliable, keep=None):
    """Connect, create a producer, send one message; None when served, else the error.
    The channel is appended to `keep` (held open) or closed."""
    from danube.rpc.client import Channel
    channel = Channel(f"{host}:{port}", connect_timeout=CALL_TIMEOUT)
    try:
        pb, create, send = _calls(channel)
        strategy = pb.Reliable if reliable else pb.NonReliable
        producer = await create(pb.ProducerRequest(request_id=1, producer_name=name,
                                                   topic_name=topic,
                                                   dispatch_strategy=strategy),
                                timeout=CALL_TIMEOUT)
        await send(pb.StreamMessage(request_id=2, payload=PAYLOAD, producer_name=name,
                                    msg_id=pb.MsgID(producer_id=producer.producer_id,
                                                    topic_name=topic)),
                   timeout=CALL_TIMEOUT)
        return None
    except Exception as exc:  # noqa: BLE001 - reported, counted as not served
        return f"{type(exc).__name__}: {exc}"
    finally:
        if keep is not None:
            keep.append(channel)
        else:
            await channel.close()


async def _work(host, port, base, count, reliable):
    kind = "r" if reliable else "n"
    channels, errors = [], []
    opening = asyncio.Semaphore(OPENING_AT_ONCE)

    async def one(i):
        async with opening:
            error = await _one_connection(host, port, f"/default/conns-{kind}{i % TOPICS}",
                                          f"conn-{i}", reliable, channels)
        if error is not None:
            errors.append(error)

    await asyncio.gather(*(one(base + i) for i in range(count)))
    print(json.dumps({"served": count - len(errors), "errors": len(errors),
                      "first_error": errors[0] if errors else None}), flush=True)
    # Held until the parent closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for channel in channels:
        await channel.close()


def _worker_main(argv):
    host, port, base, count = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import uvloop
    uvloop.run(_work(host, port, base, count, "--reliable" in argv))


# -- run alone -----------------------------------------------------------------------------

def _start_broker(tmp):
    log_path = os.path.join(tmp, "broker.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
         "--data-dir", os.path.join(tmp, "data"), "--broker-addr", "127.0.0.1:0",
         "--admin-addr", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    text = ""
    while time.time() < deadline:
        with open(log_path) as f:
            text = f.read()
        m = re.search(r"client gRPC .* listening on 127\.0\.0\.1:(\d+)", text)
        if m and "broker ready" in text:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("broker did not start:\n" + text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, action="append",
                    help="connections (repeatable; default 1000, 5000 and 10000, each "
                         "against a fresh broker)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--reliable", action="store_true")
    args = ap.parse_args()
    for count in args.count or [1000, 5000, 10_000]:
        with tempfile.TemporaryDirectory() as tmp:
            proc, port = _start_broker(tmp)
            try:
                result = measure("127.0.0.1", port, proc.pid, count, procs=args.procs,
                                 reliable=args.reliable)
            finally:
                proc.terminate()
                proc.wait(60)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker_main(sys.argv[2:])
    else:
        main()
