"""Section `batched`: one reliable topic, 100 B x 1000 per send_many, 1 and 4 producers,
measured by bench.reliable itself (its scenarios b100_1000_p1 and b100_1000_p4, run as a
subprocess of the build's interpreter: its broker and its client are that build's); and one
producer with one message in flight (bench.scale's closed loop with K = 1): its p50."""

import json
import os
import shutil
import subprocess

from bench._proc import repo_env
from bench.scale import active, load
from bench.scale.common import REPO, Broker

SCENARIOS = ("b100_1000_p1", "b100_1000_p4")


def reliable_batched(python, workdir, name, duration, log):
    """bench.reliable's batched scenarios with `python`: {scenario: msgs/s} or an error."""
    out_path = os.path.join(workdir, f"reliable-{name}.json")
    cmd = [python, "-m", "bench.reliable", "--sections", "batched", "--scenarios",
           ",".join(SCENARIOS), "--duration", str(duration), "--warmup", "1",
           "--dir", workdir, "--json", out_path]
    # Run from the repository root without -P: bench/ is found there, and bench/__init__
    # makes it import the interpreter's installed danube (the baseline's for a baseline).
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=repo_env(), capture_output=True, text=True,
                              timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "bench.reliable did not finish in 600 s"}
    try:
        with open(out_path) as f:
            results = json.load(f)["results"]
    except (OSError, ValueError, KeyError):
        return {"error": f"bench.reliable exited {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout)[-2000:]}"}
    row = {}
    for r in results:
        if "error" in r:
            row[r["key"]] = {"error": r["error"][-500:]}
        else:
            row[r["key"]] = {"msgs_per_s": r["msgs_per_s"],
                             "broker_cores": r["cores"]["broker"]}
    log(f"  {name}: bench.reliable " + ", ".join(
        f"{k} {v.get('msgs_per_s', 0):,.0f} msgs/s" if "error" not in v else f"{k} ERROR"
        for k, v in row.items()))
    return row


def one_in_flight(python, workdir, name, *, warmup, duration, log):
    broker = Broker(python, workdir, f"inflight1-{name}").start()
    try:
        row = active.measure(broker.addr, [load.topic_name("one", 0)], broker_pid=broker.pid,
                             procs=1, connections=1, warmup=warmup, duration=duration)
    except RuntimeError as exc:
        log(f"  {name}: one message in flight: ERROR {exc}")
        return {"error": str(exc)}
    finally:
        broker.stop()
        shutil.rmtree(broker.data, ignore_errors=True)
    log(f"  {name}: one producer, one message in flight: {row['msgs_per_s']:,.0f} msgs/s, "
        f"p50 {row.get('p50_ms', 0):.3f} ms, p99 {row.get('p99_ms', 0):.3f} ms")
    return row
