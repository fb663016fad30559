"""Section `active`: K reliable topics (durability `always`, the default: fsync before the
ack), one producer each with one message in flight, for a fixed window: msgs/s, p50/p99 of
the ack latency, the broker's CPU and the generator's."""

import re
import shutil
import subprocess
import sys
import time

import numpy

from bench._proc import popen, proc_cpu, reap, repo_env
from bench.scale import load
from bench.scale.common import REPO, Broker


def measure(addr, topics, *, broker_pid, procs, connections, warmup, duration):
    """One closed-loop window against whatever serves `addr`."""
    gen = load.ClosedLoop(addr, topics, procs=procs, connections=connections)
    try:
        start_at = time.time() + warmup
        end_at = start_at + duration
        gen.run(start_at, end_at)
        time.sleep(max(0.0, start_at - time.time()))
        b0 = proc_cpu(broker_pid)
        g0 = sum(proc_cpu(p) for p in gen.pids)
        time.sleep(max(0.0, end_at - time.time()))
        b1 = proc_cpu(broker_pid)
        g1 = sum(proc_cpu(p) for p in gen.pids)
        reports, lat = gen.results()
    finally:
        gen.stop()
    acks = sum(r["acks"] for r in reports)
    errors = sum(r["errors"] for r in reports)
    out = {"topics": len(topics), "procs": len(gen.pids), "connections": connections,
           "window_s": duration, "acks": acks, "msgs_per_s": round(acks / duration, 1),
           "errors": errors,
           "first_error": next((r["first_error"] for r in reports if r["first_error"]), None),
           "broker_cores": round((b1 - b0) / duration, 3),
           "generator_cores": round((g1 - g0) / duration, 3)}
    if len(lat):
        a = numpy.frombuffer(lat, dtype=numpy.float32)
        out["p50_ms"], out["p99_ms"] = (round(float(x), 3)
                                        for x in numpy.percentile(a, [50, 99]))
        out["broker_cpu_us_per_msg"] = round((b1 - b0) / acks * 1e6, 1) if acks else None
    return out


def sweep(python, workdir, name, ks, *, procs, connections, warmup, duration, log):
    """A fresh broker per K (its topics alone on it); a row per K."""
    rows = []
    for k in ks:
        broker = Broker(python, workdir, f"active-{name}-{k}").start()
        try:
            row = measure(broker.addr, [load.topic_name("active", i) for i in range(k)],
                          broker_pid=broker.pid, procs=procs,
                          connections=min(connections, k), warmup=warmup,
                          duration=duration)
        except RuntimeError as exc:
            row = {"topics": k, "error": str(exc)}
            log(f"  {name}: K={k:,}: ERROR {exc}")
        else:
            log(f"  {name}: K={k:,}: {row['msgs_per_s']:,.0f} msgs/s, p50 "
                f"{row.get('p50_ms', 0):.2f} ms, p99 {row.get('p99_ms', 0):.2f} ms, broker "
                f"{row['broker_cores']:.2f} cores, generator {row['generator_cores']:.2f} "
                f"cores, {row['errors']} errors")
        finally:
            broker.stop()
            shutil.rmtree(broker.data, ignore_errors=True)
        rows.append(row)
    return rows


def generator_ceiling(ks, *, procs, connections, warmup, duration, log):
    """The generator against bench.scale.noop_server (answers at once): its own ceiling."""
    server = popen([sys.executable, "-P", "-m", "bench.scale.noop_server"],
                   stdout=subprocess.PIPE, text=True, env=repo_env(), cwd=REPO)
    try:
        m = re.match(r"ready (\d+)", server.stdout.readline())
        if not m:
            raise RuntimeError("bench.scale.noop_server did not start")
        rows = []
        for k in ks:
            row = measure(f"127.0.0.1:{m.group(1)}",
                          [load.topic_name("noop", i) for i in range(k)],
                          broker_pid=server.pid, procs=procs,
                          connections=min(connections, k), warmup=warmup,
                          duration=duration)
            rows.append(row)
            log(f"  generator vs a no-op server, K={k:,}: {row['msgs_per_s']:,.0f} msgs/s, "
                f"p50 {row.get('p50_ms', 0):.2f} ms, generator {row['generator_cores']:.2f} "
                f"cores, server {row['broker_cores']:.2f} cores")
        return rows
    finally:
        reap(server)
