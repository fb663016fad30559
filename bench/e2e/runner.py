"""Orchestrates the end-to-end benchmark (see bench/README.md, "bench.e2e").

One broker process for the whole run; for each scenario a fresh topic, a producer process
and a consumer process (3 processes on the machine's cores), all bound to 127.0.0.1.
The orchestrator only sleeps during the measured window; CPU comes from /proc/<pid>/stat
(utime+stime, all threads) sampled at the window's edges.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from bench._proc import (LineWorker, popen, proc_cpu, reap, reap_all, repo_env,
                         system_busy, tail)
from bench.e2e.common import format_table

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS = REPO / "bench" / "results" / "e2e.json"
OFFICIAL_PYTHON = os.environ.get("DANUBE_OFFICIAL_PYTHON",
                                 str(REPO / ".venv-official" / "bin" / "python"))

BROKER_CPU_TARGET = 0.5          # cores, official client at its max rate
THROUGHPUT_TARGET = 50_000       # msgs/s e2e, project client send_many
PACED_RATE = 5_000               # msgs/s, project client send()
PACED_P99_TARGET = 5.0           # ms
OFFICIAL_PACED_RATE = 1_000      # msgs/s, official client send()
OFFICIAL_CONCURRENCY = 16
BATCH = 1000

# key, client (producer's; the consumer's too unless extra["consumer_client"]), producer
# mode, extra producer config, label, run by default
SCENARIOS = [
    ("official_seq", "official", "flood", {},
     "official: send() one at a time", True),
    ("official_conc", "official", "concurrent", {"concurrency": OFFICIAL_CONCURRENCY},
     f"official: {OFFICIAL_CONCURRENCY} send() loops (gather)", True),
    ("project_batch", "project", "batch", {"batch": BATCH, "inflight": 1},
     f"project: send_many, batches of {BATCH}", True),
    ("project_seq", "project", "flood", {},
     "project: send() one at a time", True),
    ("project_paced", "project", "paced", {"rate": PACED_RATE},
     f"project: send() paced {PACED_RATE:,}/s", True),
    ("project_paced_open", "project", "paced", {"rate": PACED_RATE, "inflight": 64},
     f"project: send() paced {PACED_RATE:,}/s, open loop", True),
    ("official_paced", "official", "paced", {"rate": OFFICIAL_PACED_RATE},
     f"official: send() paced {OFFICIAL_PACED_RATE:,}/s", True),
    # Diagnostic (not run by default): the official producer with OUR consumer, to tell
    # the official consumer's share of the end-to-end latency from the rest.
    ("official_conc_ourcons", "official", "concurrent",
     {"concurrency": OFFICIAL_CONCURRENCY, "consumer_client": "project"},
     f"official {OFFICIAL_CONCURRENCY} send() loops -> project consumer", False),
]


# -- child processes ---------------------------------------------------------------------

def spawn(cmd, *, env, cwd, stderr):
    return popen(cmd, cwd=cwd, env=env, text=True, stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=stderr)


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


class Broker:
    """`python -P -m danube broker --mode standalone` on ports chosen by the OS.
    `launcher` replaces `-m danube` (a wrapper module that runs the same command line);
    `extra` adds broker flags."""
    LISTEN = re.compile(r"client gRPC .* listening on ([\d.]+):(\d+)")
    PROM = re.compile(r"prometheus exporter listening on http://([\d.]+):(\d+)")

    def __init__(self, data_dir, log_path, *, launcher=("-m", "danube"), extra=()):
        self.command = [sys.executable, "-P", *launcher, "broker", "--mode", "standalone",
                        *extra, "--data-dir", str(data_dir), "--broker-addr", "127.0.0.1:0",
                        "--admin-addr", "127.0.0.1:0", "--prom-exporter", "127.0.0.1:0"]
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = spawn(self.command, env=repo_env(), cwd=REPO, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        self.port = self.prom_port = None
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.log.write(line)
                self.log.flush()
                m = self.LISTEN.search(line)
                if m:
                    self.port = int(m.group(2))
                m = self.PROM.search(line)
                if m:
                    self.prom_port = int(m.group(2))
                if "broker ready" in line:
                    ready.set()
            ready.set()
        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or self.proc.poll() is not None or self.port is None:
            raise RuntimeError(f"broker did not start; see {log_path}:\n" + tail(log_path))
        self.url = f"http://127.0.0.1:{self.port}"

    def metrics(self, topic):
        """The broker's Prometheus samples for `topic` ({name{labels}: value})."""
        if self.prom_port is None:
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError as exc:
            return {"error": repr(exc)}
        out = {}
        needle = f'topic="{topic}"'
        for line in text.splitlines():
            if line.startswith("danube_") and needle in line:
                key, _, value = line.rpartition(" ")
                name = key.split("{", 1)[0]
                out[name] = out.get(name, 0) + float(value)
        return out

    def stop(self):
        reap(self.proc, 20.0)
        self.log.close()


class Worker(LineWorker):
    """A producer or consumer process speaking bench.e2e.common's line protocol."""

    def __init__(self, client, cfg, log_path):
        self.client = client
        self.role = cfg["role"]
        self._tmp = None
        if client == "project":
            env = repo_env()
            cmd = [sys.executable, "-P", "-m", "bench.e2e.project_worker", json.dumps(cfg)]
            cwd = REPO
        else:
            # Isolated from this repository: -I, no PYTHON* variables, a scratch cwd.
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            self._tmp = tempfile.TemporaryDirectory(prefix="danube-e2e-official-")
            cmd = [OFFICIAL_PYTHON, "-I", str(HERE / "official_worker.py"), json.dumps(cfg)]
            cwd = self._tmp.name
        self._start(cmd, env=env, cwd=cwd, log_path=log_path, label=f"{client} {self.role}")

    def stop(self):
        super().stop()
        if self._tmp is not None:
            self._tmp.cleanup()


def sleep_until(t):
    while True:
        left = t - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.25))


# -- one scenario ------------------------------------------------------------------------

def run_scenario(broker, key, client, mode, extra, label, args, logs):
    topic = f"/default/e2e-{key}-{uuid.uuid4().hex[:8]}"
    extra = dict(extra)
    consumer_client = extra.pop("consumer_client", client)
    base = {"url": broker.url, "topic": topic}
    pcfg = {**base, "role": "producer", "name": f"e2e-producer-{key}", "mode": mode, **extra}
    ccfg = {**base, "role": "consumer", "name": f"e2e-consumer-{key}", "sub": f"e2e-{key}",
            "ack": False}
    producer = consumer = None
    try:
        # The producer creates the topic; the consumer subscribes before anything is sent.
        producer = Worker(client, pcfg, logs / f"{key}.producer.log")
        producer.expect("ready", 60)
        consumer = Worker(consumer_client, ccfg, logs / f"{key}.consumer.log")
        consumer.expect("ready", 60)
        time.sleep(0.5)                       # let start-up CPU settle
        start = time.time() + 0.2
        ws = start + args.warmup
        we = ws + args.duration
        go = {"start": int(start * 1e9), "ws": int(ws * 1e9), "we": int(we * 1e9)}
        consumer.send(cmd="go", **go)
        producer.send(cmd="go", **go)
        pids = {"broker": broker.pid, "producer": producer.pid, "consumer": consumer.pid}
        sleep_until(ws)
        t_a = time.monotonic()
        cpu_a = {k: proc_cpu(pid) for k, pid in pids.items()}
        sys_a = system_busy()
        sleep_until(we)
        t_b = time.monotonic()
        cpu_b = {k: proc_cpu(pid) for k, pid in pids.items()}
        sys_b = system_busy()
        wall = t_b - t_a
        cores = {k: (cpu_b[k] - cpu_a[k]) / wall for k in pids}
        cores["machine"] = (sys_b - sys_a) / wall
        cores["other"] = cores["machine"] - sum(cores[k] for k in pids)
        prod = producer.expect("result", 60)
        consumer.send(cmd="expect", n=prod["attempted"])
        cons = consumer.expect("result", 60)
        metrics = broker.metrics(topic)
    finally:
        for w in (producer, consumer):
            if w is not None:
                w.stop()
    rate = cons["received_in_window"] / args.duration
    return {"key": key, "label": label, "client": client, "consumer_client": consumer_client,
            "mode": mode, "topic": topic,
            "producer_config": pcfg, "window_s": args.duration, "warmup_s": args.warmup,
            "cpu_window_wall_s": wall, "cores": cores,
            "msgs_per_s": rate, "sent_per_s": prod["sent_in_window"] / args.duration,
            "producer": prod, "consumer": cons, "broker_metrics": metrics}


# -- report ------------------------------------------------------------------------------

def _ms(v):
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def table(results):
    head = ["scenario", "e2e msg/s", "sent/s", "broker", "prod", "cons", "other", "total",
            "p50 ms", "p99 ms", "p99.9 ms", "max ms", "lost", "dup"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["label"], "skipped" if r.get("skipped") else "ERROR"]
                        + [""] * (len(head) - 2))
            continue
        lat = r["consumer"]["latency_ms"]
        c = r["cores"]
        rows.append([r["label"], f"{r['msgs_per_s']:,.0f}", f"{r['sent_per_s']:,.0f}",
                     f"{c['broker']:.2f}", f"{c['producer']:.2f}", f"{c['consumer']:.2f}",
                     f"{max(0.0, c['other']):.2f}", f"{c['machine']:.2f}", _ms(lat.get("p50")), _ms(lat.get("p99")),
                     _ms(lat.get("p99.9")), _ms(lat.get("max")),
                     str(r["consumer"]["missing"]), str(r["consumer"]["duplicates"])])
    return format_table(head, rows)


def targets(results):
    by = {r["key"]: r for r in results if "error" not in r}
    out = []

    def verdict(ok):
        return "met" if ok else "NOT met"

    for key in ("official_seq", "official_conc"):
        r = by.get(key)
        if r:
            b = r["cores"]["broker"]
            out.append((f"broker < {BROKER_CPU_TARGET} core at the official client's max "
                        f"rate ({r['label']}: {r['msgs_per_s']:,.0f} msg/s, broker "
                        f"{b:.2f} cores: the client is the bottleneck, not the broker)",
                        verdict(b < BROKER_CPU_TARGET)))
    r = by.get("project_batch")
    if r:
        out.append((f"project send_many >= {THROUGHPUT_TARGET:,} msg/s end to end "
                    f"({r['msgs_per_s']:,.0f} msg/s)",
                    verdict(r["msgs_per_s"] >= THROUGHPUT_TARGET)))
    r = by.get("project_paced")
    if r:
        p99 = r["consumer"]["latency_ms"].get("p99")
        rate_ok = r["msgs_per_s"] >= 0.99 * PACED_RATE
        out.append((f"project send() p99 < {PACED_P99_TARGET:g} ms at {PACED_RATE:,} msg/s "
                    f"(p99 {_ms(p99)} ms at {r['msgs_per_s']:,.0f} msg/s)",
                    verdict(p99 is not None and p99 < PACED_P99_TARGET and rate_ok)))
    done = [r for r in results if "error" not in r]
    if not done:
        # A sum over no measurement is no evidence: not met, and said so.
        why = f"all {len(results)} scenarios failed or were skipped" if results \
            else "no scenario ran"
        out.append((f"no message lost or duplicated, no send errors: nothing was measured "
                    f"({why})", "NOT met"))
    else:
        lost = sum(r["consumer"]["missing"] for r in done)
        dup = sum(r["consumer"]["duplicates"] for r in done)
        errs = sum(r["producer"]["errors"] for r in done)
        text = (f"no message lost or duplicated, no send errors (lost {lost}, "
                f"duplicated {dup}, send errors {errs})")
        notes = []
        for r in done:
            miss = r["consumer"]["missing"]
            if miss:
                dropped = int(r["broker_metrics"].get("danube_consumer_dropped_total", 0))
                notes.append(f"{r['label']}: {miss:,} lost, broker counted {dropped:,} "
                             "slow-consumer drops (the non-reliable overflow policy)")
        if notes:
            text += "\n      " + "\n      ".join(notes)
        out.append((text, verdict(lost == 0 and dup == 0 and errs == 0)))
    return out


def details(results):
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"{r['label']}: {'skipped' if r.get('skipped') else 'ERROR'}: "
                         f"{r['error']}")
            continue
        p, c = r["producer"], r["consumer"]
        rtt = p["send_rtt_ms"]
        what = "send_many() call" if r["mode"] == "batch" else "send() call"
        line = (f"{r['label']}: sent {p['sent']:,} (errors {p['errors']}), received "
                f"{c['received']:,} ({c['distinct']:,} distinct, reordered {c['reordered']}); "
                f"{what} p50 {_ms(rtt.get('p50'))} ms p99 {_ms(rtt.get('p99'))} ms")
        if r["mode"] == "batch":
            line += " (the producer saturates the pipeline: latency here is queueing)"
        if "pacer_lag_ms" in p:
            lag = p["pacer_lag_ms"]
            ls = c["latency_from_schedule_ms"]
            line += (f"; send() called late vs schedule p50 {_ms(lag.get('p50'))} / p99 "
                     f"{_ms(lag.get('p99'))} ms; latency from schedule p99 "
                     f"{_ms(ls.get('p99'))} ms")
            st = p["stalls"]
            line += (f"; producer stalls > 5 ms between send() calls: {st['count']} "
                     f"(longest {st['max_ms']:.1f} ms)")
            if rtt.get("mean") and r["producer_config"].get("inflight", 1) == 1:
                line += (f" (one send() at a time at this round trip caps the producer at "
                         f"~{1000 / rtt['mean']:,.0f} msg/s: after a stall it catches up "
                         f"at the difference)")
        dropped = r["broker_metrics"].get("danube_consumer_dropped_total")
        if dropped:
            line += f"; broker dropped {dropped:,.0f} (slow-consumer outbox)"
        lines.append(line)
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__)
    ap.add_argument("--duration", type=float, default=None,
                    help="measured seconds per scenario (default 10; 3 with --quick)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds of traffic before each window (default 1.5; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="short windows")
    ap.add_argument("--scenarios", default=",".join(s[0] for s in SCENARIOS if s[5]),
                    help="comma-separated list (default: all but the last) of: "
                         + ", ".join(s[0] for s in SCENARIOS))
    ap.add_argument("--json", default=str(RESULTS), help="where to write the results")
    args = ap.parse_args(argv)
    if args.duration is None:
        args.duration = 3.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 1.0 if args.quick else 1.5
    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(wanted) - {s[0] for s in SCENARIOS}
    if unknown:
        ap.error(f"unknown scenarios: {', '.join(sorted(unknown))}")

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    # Also when started in the background by a shell that ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    have_official = os.path.exists(OFFICIAL_PYTHON)
    scratch = Path(tempfile.mkdtemp(prefix="danube-e2e-"))
    logs = scratch / "logs"
    logs.mkdir()
    results = []
    env_info = {"python": sys.version.split()[0], "platform": platform.platform(),
                "cpus": os.cpu_count(), "loadavg_before": loadavg(),
                "official_python": OFFICIAL_PYTHON if have_official else None,
                "started": datetime.datetime.now().isoformat(timespec="seconds")}
    print(f"bench.e2e: {len(wanted)} scenarios x ({args.warmup:g} s warm-up + "
          f"{args.duration:g} s window), 100-byte payloads, non-reliable, {os.cpu_count()} "
          f"CPUs, load {' '.join(env_info['loadavg_before'])}", flush=True)
    broker = None
    try:
        broker = Broker(scratch / "data", logs / "broker.log")
        print(f"broker pid {broker.pid} at {broker.url}", flush=True)
        for key, client, mode, extra, label, _ in SCENARIOS:
            if key not in wanted:
                continue
            if "official" in (client, extra.get("consumer_client")) and not have_official:
                results.append({"key": key, "label": label, "client": client, "mode": mode,
                                "skipped": True,
                                "error": f"official client interpreter {OFFICIAL_PYTHON} "
                                         "not found (set DANUBE_OFFICIAL_PYTHON)"})
                print(f"  {label}: skipped (no official client)", flush=True)
                continue
            print(f"  {label} ...", end=" ", flush=True)
            try:
                r = run_scenario(broker, key, client, mode, extra, label, args, logs)
            except RuntimeError as exc:
                results.append({"key": key, "label": label, "client": client, "mode": mode,
                                "error": str(exc)})
                print("ERROR", flush=True)
                print(str(exc), file=sys.stderr)
                continue
            results.append(r)
            lat = r["consumer"]["latency_ms"]
            print(f"{r['msgs_per_s']:,.0f} msg/s, broker {r['cores']['broker']:.2f} cores, "
                  f"p99 {_ms(lat.get('p99'))} ms, lost {r['consumer']['missing']}",
                  flush=True)
            if broker.proc.poll() is not None:
                raise RuntimeError("the broker exited:\n" + tail(broker.log_path))
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the processes", file=sys.stderr)
        reap_all()
        shutil.rmtree(scratch, ignore_errors=True)
        return 130
    finally:
        reap_all()
        if broker is not None:
            broker.log.close()
    env_info["loadavg_after"] = loadavg()
    summary = table(results)
    checks = targets(results)
    print()
    print(summary)
    print()
    print(f"broker/prod/cons = each process's CPU cores in the window (utime+stime from "
          f"/proc/<pid>/stat, all threads); total = the whole machine's busy cores (of "
          f"{os.cpu_count()}, /proc/stat); other = total - the three (clamped at 0; the two "
          f"accountings differ by ~0.1).")
    print("latency = consumer's time.time_ns() at receipt - producer's time.time_ns() just "
          "before send()/send_many() (stamped in the payload); lost = sequence numbers "
          "never received.")
    print()
    print(details(results))
    busy = [r for r in results if "error" not in r and r["cores"]["other"] > 0.25]
    if busy:
        print()
        print("NOTE: other processes used CPU during "
              + ", ".join(f"{r['label']} ({r['cores']['other']:.2f} cores)" for r in busy)
              + "; those figures are depressed/noisy (load avg before/after: "
              + " ".join(env_info["loadavg_before"]) + " / "
              + " ".join(env_info["loadavg_after"]) + ").")
    print()
    print("targets:")
    for text, verdict in checks:
        print(f"  [{verdict}] {text}")
    out = {"config": {"duration_s": args.duration, "warmup_s": args.warmup,
                      "quick": args.quick, "payload_bytes": 100, "dispatch": "non-reliable",
                      "subscription": "exclusive", "consumer_ack": False,
                      "scenarios": wanted},
           "environment": env_info, "results": results,
           "targets": [{"target": t, "verdict": v} for t, v in checks],
           "summary_table": summary}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {path}")
    if any("error" in r and not r.get("skipped") for r in results):
        print(f"process logs kept in {logs}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0
