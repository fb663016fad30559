"""`python -m bench.consume`: drain a reliable topic with our client (batched acks, and one
Ack per message), the official client, and NATS JetStream's pull consumer (nats-py), in the
same run; the broker's CPU per delivered message; the redelivery path (10 % nacked). See
bench/README.md. Reported, never asserted."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._proc import REPO, popen, proc_cpu, reap, reap_all, repo_env, tail
from danube.devcluster.procs import free_port

OFFICIAL_PY = Path(REPO) / ".venv-official" / "bin" / "python"
TARGET_RATE = 300_000
TARGET_VS_NATS = 10.0


class Broker:
    """A standalone broker (`python -P -m danube broker`) of interpreter `python`, local
    WAL, dispatch.max_unacked_messages `window`."""

    def __init__(self, python, scratch, name, window):
        self.data = scratch / f"data-{name}"
        cfg = scratch / f"{name}.yml"
        cfg.write_text(f"dispatch:\n  max_unacked_messages: {window}\nstorage:\n  mode: local\n")
        self.log_path = scratch / f"{name}.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(self.log_path, "w")
        self.proc = popen([python, "-P", "-m", "danube", "broker", "--mode", "standalone",
                           "--config-file", str(cfg), "--data-dir", str(self.data),
                           "--broker-addr", f"127.0.0.1:{port}",
                           "--admin-addr", f"127.0.0.1:{free_port()}"],
                          stdout=self.log, stderr=subprocess.STDOUT, env=repo_env(), cwd=REPO)
        deadline = time.monotonic() + 60
        while "broker ready" not in self.log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"broker {name} did not start:\n{tail(self.log_path)}")
            time.sleep(0.1)

    def cpu(self):
        return proc_cpu(self.proc.pid)

    def stop(self):
        reap(self.proc, 20.0)
        self.log.close()


class NoopServer:
    """bench.consume.noop_server: our transport answering with no broker behind it."""

    def __init__(self, scratch, window):
        self.log_path = scratch / "noop.log"
        self.log = open(self.log_path, "w")
        self.proc = popen([sys.executable, "-P", "-m", "bench.consume.noop_server",
                           str(window)], stdout=self.log, stderr=subprocess.STDOUT,
                          env=repo_env(), cwd=REPO)
        deadline = time.monotonic() + 30
        while not self.log_path.read_text().startswith("ready "):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no-op server did not start:\n{tail(self.log_path)}")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{self.log_path.read_text().split()[1]}"

    def cpu(self):
        return proc_cpu(self.proc.pid)

    def stop(self):
        reap(self.proc, 10.0)
        self.log.close()


class Nats:
    def __init__(self, scratch):
        exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
        port = free_port()
        self.url = f"nats://127.0.0.1:{port}"
        self.log_path = scratch / "nats.log"
        self.log = open(self.log_path, "w")
        self.proc = popen([exe, "-js", "-sd", str(scratch / "nats"), "-a", "127.0.0.1",
                           "-p", str(port)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "Server is ready" not in self.log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not start:\n{tail(self.log_path)}")
            time.sleep(0.1)

    def cpu(self):
        return proc_cpu(self.proc.pid)

    def stop(self):
        reap(self.proc, 10.0)
        self.log.close()


def run_worker(cmd, cfg, timeout):
    out = subprocess.run([*cmd, json.dumps(cfg)], capture_output=True, text=True,
                         timeout=timeout, env=repo_env(), cwd=REPO)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{cmd[-1]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


OURS = [sys.executable, "-P", "-m", "bench.consume.worker"]
NATS = [sys.executable, "-P", "-m", "bench.consume.nats_worker"]


def official_cmd():
    return [str(OFFICIAL_PY), "-I", str(Path(REPO) / "bench" / "consume" / "official_worker.py")]


def drain_case(label, server, fill_cmd, fill_cfg, drain_cmd, drain_cfg, n, timeout):
    if fill_cmd:
        run_worker(fill_cmd, fill_cfg, timeout)
        time.sleep(0.5)
    cpu0 = server.cpu()
    r = run_worker(drain_cmd, drain_cfg, timeout)
    r["server_cpu_s"] = server.cpu() - cpu0
    r["case"] = label
    r["msgs_per_s"] = r["distinct"] / r["seconds"] if r["seconds"] else 0.0
    r["lost"] = n - r["distinct"]
    r["server_us_per_msg"] = 1e6 * r["server_cpu_s"] / max(1, r["received"])
    print(f"  {label}: {r['msgs_per_s']:,.0f} msgs/s, lost {r['lost']}, duplicates "
          f"{r['duplicates']}, server {r['server_us_per_msg']:.2f} us/msg", flush=True)
    return r


SLOW_CASES = ("each", "official", "nack10", "noop", "olddefault")


def ours_cases(broker, tag, n, slow_n, size, window, cases, timeout, cli_n=200_000):
    out = []
    for case in cases:
        n_case = cli_n if case == "cli" else slow_n if case in SLOW_CASES else n
        topic = f"/default/{tag.replace(' ', '-')}-{case}-{os.getpid()}"
        fill = {"role": "fill", "url": broker.url, "topic": topic, "sub": "s", "n": n_case,
                "size": size}
        drain = {"role": "drain", "url": broker.url, "topic": topic, "sub": "s", "n": n_case}
        if case == "official":
            label, cmd = f"official client ({tag})", official_cmd()
            drain = dict(drain, ack_window=1000)
        elif case == "cli":
            out.append(cli_case(broker, tag, fill, n_case, timeout))
            continue
        elif case in ("default", "receive", "olddefault"):
            cmd = OURS
            # olddefault: the options that were the defaults before issue 35 (the broker's
            # window, one Ack per message) with a plain loop awaiting each ack.
            drain.update({"default": dict(acks="default"),
                          "receive": dict(acks="default", receive="one"),
                          # 10: the broker's default window (upstream's), which the
                          # bench's broker config replaces with --window.
                          "olddefault": dict(acks="each", window=10,
                                             sequential_acks=True)}[case])
            label = {"default": f"our client, no options, receive_many ({tag})",
                     "receive": f"our client, no options, receive() one at a time ({tag})",
                     "olddefault": f"our client, the defaults before issue 35 ({tag})"}[case]
        else:
            cmd = OURS
            acks = "each" if case == "each" else "batched"
            drain.update(acks=acks, window=window, nack_every=10 if case == "nack10" else 0)
            if case in ("shared", "key_shared"):
                fill["sub_type"] = drain["sub_type"] = case
            label = {"batched": f"our client, batched acks, window {window} ({tag})",
                     "shared": f"our client, batched acks, Shared subscription ({tag})",
                     "key_shared": f"our client, batched acks, KeyShared subscription "
                                   f"({tag})",
                     "each": f"our client, one Ack per message ({tag})",
                     "nack10": f"our client, batched acks, 10 % nacked ({tag})"}[case]
        out.append(drain_case(label, broker, OURS, fill, cmd, drain, n_case, timeout))
    return out


def cli_case(broker, tag, fill, n, timeout):
    """`danube consume --quiet` of an n-message reliable backlog (its own summary gives the
    rate from its first message to its last; the wall time includes start-up)."""
    run_worker(OURS, fill, timeout)
    time.sleep(0.5)
    cmd = [sys.executable, "-P", "-m", "danube", "consume", "-s", broker.url, "-t",
           fill["topic"], "-m", fill["sub"], "-n", "bench-c", "--sub-type", "exclusive",
           "--count", str(n), "--quiet", "--output", "json"]
    cpu0, t0 = broker.cpu(), time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=repo_env(), cwd=REPO)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"danube consume failed ({out.returncode}):\n{out.stderr[-3000:]}")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    r = {"case": f"danube consume --quiet ({tag})", "received": summary["received"],
         "distinct": summary["received"], "duplicates": 0, "lost": n - summary["received"],
         "seconds": summary["elapsed_s"], "msgs_per_s": summary["msgs_per_sec"],
         "wall_s": wall, "server_cpu_s": broker.cpu() - cpu0}
    r["server_us_per_msg"] = 1e6 * r["server_cpu_s"] / max(1, r["received"])
    print(f"  {r['case']}: {r['msgs_per_s']:,.0f} msgs/s (first to last message; "
          f"{n / wall:,.0f} msgs/s over the process's {wall:.2f} s), lost {r['lost']}",
          flush=True)
    return r


def noop_case(scratch, slow_n, window, timeout):
    """The official client against the no-op server: the ceiling of its drain."""
    server = NoopServer(scratch, window)
    try:
        drain = {"url": server.url, "topic": "/default/noop", "sub": "s", "n": slow_n,
                 "ack_window": 1000}
        return drain_case("official client, no-op server (its ceiling)", server, None, None,
                          official_cmd(), drain, slow_n, timeout)
    finally:
        server.stop()


def nats_cases(server, n, size, window, timeout):
    out = []
    for acks in ("each", "all"):
        stream = f"B{acks}{os.getpid()}"
        base = {"url": server.url, "stream": stream, "subject": f"bench.{acks}", "n": n}
        label = {"each": "NATS JetStream pull, ack per message",
                 "all": "NATS JetStream pull, ack-all per 1,000"}[acks]
        out.append(drain_case(label, server, NATS, dict(base, role="fill", size=size), NATS,
                              dict(base, role="drain", acks=acks, durable=f"d{acks}",
                                   window=window), n, timeout))
    return out


def table(results, nats_best):
    lines = ["| case | messages | msgs/s | vs best NATS | lost | duplicates | redelivered | "
             "server CPU us/msg |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = f"{r['msgs_per_s'] / nats_best:.1f}x" if nats_best else "-"
        redeliv = r["received"] - r["distinct"] - r["duplicates"]
        lines.append(f"| {r['case']} | {r['distinct'] + r['lost']:,} | "
                     f"{r['msgs_per_s']:,.0f} | {ratio} | {r['lost']} | "
                     f"{r['duplicates']} | {redeliv} | {r['server_us_per_msg']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.consume", description=__doc__)
    ap.add_argument("--messages", type=int, default=None,
                    help="messages per drain (1,000,000; 100,000 with --quick)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--slow-messages", type=int, default=None,
                    help="messages for the cases that cost an RPC per message (one Ack per "
                         "message, the official client, 10 %% nacked): min(messages, "
                         "100,000), as 1,000,000 would take many minutes each")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--cases",
                    default="default,receive,batched,shared,key_shared,each,olddefault,"
                            "cli,official,nack10,noop,nats",
                    help="noop: the official client against a server that only answers "
                         "(bench.consume.noop_server), the ceiling any broker could give it; "
                         "default/receive: our client with no options (receive_many / "
                         "receive()); olddefault: the options that were the defaults before "
                         "issue 35; cli: danube consume --quiet of a --cli-messages backlog")
    ap.add_argument("--cli-messages", type=int, default=200_000)
    ap.add_argument("--baseline-python", default=None,
                    help="also run the official client (and one-Ack-per-message) against a "
                         "broker of this interpreter (e.g. main's .venv/bin/python): "
                         "'before' figures in the same run")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    n = args.messages or (100_000 if args.quick else 1_000_000)
    slow_n = args.slow_messages or min(n, 100_000)
    cases = [c for c in args.cases.split(",") if c]
    scratch = Path(tempfile.mkdtemp(prefix="danube-bench-consume-"))
    results = []
    print(f"bench.consume: {n:,} x {args.size} B per drain ({slow_n:,} for the cases with "
          f"an RPC per message), window {args.window} "
          f"(machine: {os.cpu_count()} CPUs, shared with other work)", flush=True)
    try:
        broker = Broker(sys.executable, scratch, "ours", args.window)
        try:
            results += ours_cases(broker, "this branch", n, slow_n, args.size, args.window,
                                  [c for c in cases if c not in ("nats", "noop")], args.timeout,
                                  args.cli_messages)
        finally:
            broker.stop()
        if args.baseline_python:
            base = Broker(args.baseline_python, scratch, "baseline", args.window)
            try:
                results += ours_cases(base, "baseline broker", n, slow_n, args.size,
                                      args.window,
                                      [c for c in ("official", "each", "shared",
                                                   "key_shared") if c in cases],
                                      args.timeout)
            finally:
                base.stop()
        if "noop" in cases:
            results.append(noop_case(scratch, slow_n, args.window, args.timeout))
        nats_best = 0.0
        if "nats" in cases:
            server = Nats(scratch)
            try:
                nres = nats_cases(server, n, args.size, args.window, args.timeout)
            finally:
                server.stop()
            results += nres
            nats_best = max(r["msgs_per_s"] for r in nres)
    finally:
        reap_all()
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(table(results, nats_best))
    ours = [r for r in results if r["case"].startswith("our client, batched acks, window")]
    if ours and nats_best:
        rate = ours[0]["msgs_per_s"]
        met = rate >= TARGET_RATE and rate >= TARGET_VS_NATS * nats_best
        print(f"\ntarget: our batched drain >= {TARGET_RATE:,} msgs/s and >= "
              f"{TARGET_VS_NATS:g}x NATS: {rate:,.0f} msgs/s, {rate / nats_best:.1f}x -> "
              f"{'met' if met else 'NOT met'}")
    out = Path(REPO) / "bench" / "results" / "consume.json"
    out.write_text(json.dumps({"messages": n, "size": args.size, "window": args.window,
                               "results": results}, indent=1))
    return 0
