"""Orchestrates the RPC capacity benchmark (see bench/README.md).

Every server runs in its own subprocess, one at a time, so the server under test and the
load generator (h2load, or our own client for the idle-stream test) are the only busy
processes. CPU figures come from /proc/<pid>/stat (utime+stime, all threads).
"""

import argparse
import datetime
import json
import os
import platform
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._proc import CLK_TCK, children, popen, proc_cpu, reap, reap_all, repo_env, system_busy

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "rpc_capacity.json"
GRPC_HEADERS = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
MSG_WIRE = 105          # 5-byte gRPC prefix + 100-byte message
UNARY_C, UNARY_M = 4, 64

UNARY_TARGET = 3.0             # ours / grpc.aio unary calls/s
STREAM_TARGET = 1_000_000      # msgs/s on one server-streaming call
IDLE_TARGET = 0.10             # within 10%
LONE_VS_GRPC = 0.5             # lone calls: our server CPU per call <= 0.5x grpc.aio's
LONE_VS_BASE = 2.0             # ... and >= 2x better than the baseline's (--baseline-python)


# -- child processes ---------------------------------------------------------------------

def spawn(cmd, **kw):
    return popen(cmd, cwd=REPO, env=repo_env(), **kw)


def wait_child(p):
    """Wait for a child and return its total CPU seconds (from wait4's rusage)."""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p in children:
        children.remove(p)
    return ru.ru_utime + ru.ru_stime


def is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:data.rindex(b")") + 3] in (b"Z", b"X")
    except OSError:
        return True


def sleep_until(t, pid=None):
    """Sleep until monotonic time t; return early (False) if `pid` has exited."""
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return True
        if pid is not None and is_zombie(pid):
            return False
        time.sleep(min(left, 0.05))


class ServerProc:
    """`python -m bench.rpc_capacity.server --impl IMPL --port 0` in its own process."""

    def __init__(self, impl, python=None):
        self.impl = impl
        # -P: the server imports the installed danube (of `python`: another checkout's for
        # a baseline), never the source tree in the working directory.
        self.proc = spawn([python or sys.executable, "-P", "-m", "bench.rpc_capacity.server",
                           "--impl", impl, "--host", "127.0.0.1", "--port", "0"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 60
        line = b""
        while not line.endswith(b"\n"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{impl} server did not report its port")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 64)
                if not chunk:
                    raise RuntimeError(f"{impl} server exited with {self.proc.wait()}")
                line += chunk
        self.port = int(line.strip())
        time.sleep(0.3)  # let start-up CPU settle

    def cpu(self):
        return proc_cpu(self.pid)

    def stop(self):
        reap(self.proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# -- h2load ------------------------------------------------------------------------------

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "m": 60.0, "h": 3600.0}


def parse_h2load(out):
    r = {}
    m = re.search(r"finished in ([\d.]+)(ns|us|ms|s|m|h), ([\d.]+) req/s", out)
    if m:
        r["finished_s"] = float(m.group(1)) * _UNITS[m.group(2)]
        r["req_per_s"] = float(m.group(3))
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    if m:
        for k, v in zip(("total", "started", "done", "succeeded", "failed", "errored",
                         "timeout"), m.groups()):
            r[k] = int(v)
    m = re.search(r"traffic: .*?\((\d+)\) total, .*?\((\d+)\) headers.*?, .*?\((\d+)\) data",
                  out)
    if m:
        r["traffic_total"], r["traffic_headers"], r["traffic_data"] = map(int, m.groups())
    m = re.search(r"status codes: (\d+) 2xx", out)
    if m:
        r["status_2xx"] = int(m.group(1))
    return r


def h2load_cmd(h2load, port, path, body, extra):
    return [h2load, *extra, "-d", str(body), *GRPC_HEADERS, f"http://127.0.0.1:{port}{path}"]


def grpc_body(payload):
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def run_unary(h2load, server, body, duration, warmup):
    """h2load -D for `duration` (after `warmup`) against the unary echo; server and h2load
    CPU are sampled inside the measured window."""
    cmd = h2load_cmd(h2load, server.port, "/bench.Bench/Unary", body,
                     ["-D", f"{duration:g}", "--warm-up-time", f"{warmup:g}",
                      "-c", str(UNARY_C), "-m", str(UNARY_M), "-t", "1"])
    cpu_start = server.cpu()
    p = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    margin = min(0.3, duration * 0.1)
    window = None
    if sleep_until(t0 + warmup + margin, p.pid):
        a = (time.monotonic(), server.cpu(), proc_cpu(p.pid), system_busy())
        if sleep_until(t0 + warmup + duration - margin, p.pid):
            b = (time.monotonic(), server.cpu(), proc_cpu(p.pid), system_busy())
            window = [y - x for x, y in zip(a, b)]
    out = p.stdout.read().decode("utf-8", "replace")
    h2load_cpu = wait_child(p)
    cpu_total = server.cpu() - cpu_start
    r = parse_h2load(out)
    r["cmd"] = shlex.join(cmd)
    r["h2load_rc"] = p.returncode
    r["server_cpu_total_s"] = cpu_total
    r["h2load_cpu_total_s"] = h2load_cpu
    rate = r.get("req_per_s")
    if window and rate:
        wall, scpu, hcpu, busy = window
        r["window_s"] = wall
        r["server_cpu_util"] = scpu / wall
        r["h2load_cpu_util"] = hcpu / wall
        r["other_cpu_util"] = max(0.0, (busy - scpu - hcpu) / wall)
        r["server_cpu_us_per_call"] = scpu / wall / rate * 1e6
    ok = (p.returncode == 0 and r.get("succeeded", 0) > 0 and r.get("failed", 1) == 0
          and r.get("errored", 1) == 0 and r.get("timeout", 1) == 0)
    # h2load resets request counters after warm-up but not traffic counters, so the data
    # bytes cover warm-up too: they must be whole responses and at least `succeeded` of them.
    data = r.get("traffic_data", 0)
    r["data_check"] = ok and data % MSG_WIRE == 0 and data >= r["succeeded"] * MSG_WIRE
    if not r["data_check"]:
        r["h2load_output"] = out
    return r


def _user_sys(pid):
    """(user, system) CPU seconds of a whole process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def run_lone(server, connections, procs, duration, warmup):
    """`procs` grpc.aio client processes with `connections` connections between them, each
    connection one unary call in flight at a time (bench.rpc_capacity.lone_client): calls
    that arrive alone in their TCP segments. Server CPU is sampled over the same wall-clock
    window the clients count calls in."""
    start_at = time.time() + warmup + 1.0       # the clients' connection set-up first
    end_at = start_at + duration
    per = [connections // procs + (1 if i < connections % procs else 0) for i in range(procs)]
    clients = [spawn([sys.executable, "-P", "-m", "bench.rpc_capacity.lone_client",
                      "--port", str(server.port), "--connections", str(n),
                      "--start-at", repr(start_at), "--end-at", repr(end_at)],
                     stdout=subprocess.PIPE) for n in per if n]
    mono = time.monotonic() - time.time()
    sleep_until(start_at + mono)
    a = (time.monotonic(), *_user_sys(server.pid), system_busy())
    sleep_until(end_at + mono)
    b = (time.monotonic(), *_user_sys(server.pid), system_busy())
    wall, user, kernel, busy = [y - x for x, y in zip(a, b)]
    scpu = user + kernel
    results = []
    for p in clients:
        out = p.stdout.read().decode()
        cpu = wait_child(p)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        r = json.loads(lines[-1]) if p.returncode == 0 and lines else {"error": p.returncode}
        r["cpu_s"] = cpu
        results.append(r)
    calls = sum(r.get("calls", 0) for r in results)
    return {"connections": connections, "procs": len(clients), "window_s": wall,
            "calls": calls, "calls_per_s": calls / wall if wall else 0.0,
            "errors": sum(r.get("errors", 0) for r in results),
            "wrong": sum(r.get("wrong", 0) for r in results),
            "failed_clients": sum(1 for r in results if "error" in r),
            "server_cpu_util": scpu / wall if wall else 0.0,
            "other_cpu_util": max(0.0, (busy - scpu) / wall) if wall else 0.0,
            "server_cpu_us_per_call": 1e6 * scpu / calls if calls else None,
            # The kernel's share is mostly the two syscalls per call (read, write), and on
            # loopback a write also runs the receiving side's TCP input.
            "server_user_us_per_call": 1e6 * user / calls if calls else None,
            "server_sys_us_per_call": 1e6 * kernel / calls if calls else None,
            "clients": results}


def run_stream(h2load, server, path, n, tmpdir):
    """One server-streaming call of n 100-byte messages; rate = n / h2load's elapsed time."""
    body = Path(tmpdir) / f"stream_{n}.bin"
    body.write_bytes(grpc_body(str(n).encode()))
    cmd = h2load_cmd(h2load, server.port, path, body, ["-n", "1", "-c", "1", "-m", "1"])
    cpu0, busy0, t0 = server.cpu(), system_busy(), time.monotonic()
    p = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read().decode("utf-8", "replace")
    h2load_cpu = wait_child(p)
    scpu, busy, wall = server.cpu() - cpu0, system_busy() - busy0, time.monotonic() - t0
    r = parse_h2load(out)
    r["n"] = n
    r["cmd"] = shlex.join(cmd)
    r["h2load_rc"] = p.returncode
    elapsed = r.get("finished_s")
    r["data_expected"] = n * MSG_WIRE
    r["data_check"] = (p.returncode == 0 and r.get("succeeded") == 1
                       and r.get("traffic_data") == n * MSG_WIRE)
    if elapsed:
        r["msgs_per_s"] = n / elapsed
        r["server_cpu_s"] = scpu
        r["server_cpu_ns_per_msg"] = scpu / n * 1e9
        r["server_cpu_util"] = scpu / elapsed
        r["h2load_cpu_util"] = h2load_cpu / elapsed
        r["other_cpu_util"] = max(0.0, (busy - scpu - h2load_cpu) / wall)
    if not r["data_check"]:
        r["h2load_output"] = out
    return r


def _round_n(x):
    """Two significant digits, for readable message counts."""
    if x <= 0:
        return 0
    digits = len(str(int(x))) - 2
    step = 10 ** max(digits, 0)
    return max(step, int(round(x / step)) * step)


def stream_case(h2load, server, path, probe_n, target_s, tmpdir, log):
    """Probe with probe_n messages, then size N so the measured run takes ~target_s."""
    probe = run_stream(h2load, server, path, probe_n, tmpdir)
    rate = probe.get("msgs_per_s") or 0
    n = _round_n(min(max(rate * target_s, probe_n), 200_000_000)) if rate else probe_n
    log(f"    probe: {probe_n:,} msgs at {rate:,.0f} msg/s -> N = {n:,}")
    r = run_stream(h2load, server, path, n, tmpdir)
    r["probe"] = {k: probe.get(k) for k in ("n", "finished_s", "msgs_per_s", "data_check")}
    return r


# -- formatting --------------------------------------------------------------------------

def f_num(x, nd=0):
    if x is None:
        return "-"
    return f"{x:,.{nd}f}"


def f_ratio(a, b):
    if not a or not b:
        return None
    return a / b


def table(headers, rows, aligns=None):
    cols = len(headers)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(cols)]
    aligns = aligns or ["<"] + [">"] * (cols - 1)
    lines = []
    for r in [headers, *rows]:
        lines.append("  ".join(f"{str(c):{a}{w}}" for c, a, w in zip(r, aligns, widths)).rstrip())
        if r is headers:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def met(ok):
    return "met" if ok else "NOT met"


def summarize(res):
    out = []
    cfg = res["config"]
    out.append(f"RPC capacity summary  ({cfg['started']}, {res['env']['cpus']} CPUs, "
               f"Python {res['env']['python']}, grpcio {res['env']['grpcio']}, "
               f"{res['env']['h2load']})")
    out.append(f"load average before/after: {res['env'].get('loadavg_before')} / "
               f"{res['env'].get('loadavg_after')}; 'other procs' = machine CPU busy minus "
               "the server and load generator (noise from anything else running)")
    u = res.get("unary")
    if u:
        o, g = u.get("ours", {}), u.get("grpcio", {})
        ratio = f_ratio(o.get("req_per_s"), g.get("req_per_s"))
        cpu_ratio = f_ratio(o.get("server_cpu_us_per_call"), g.get("server_cpu_us_per_call"))
        out.append("")
        out.append(f"1. Unary echo, 100-byte payload: h2load -D {cfg['duration']:g} "
                   f"--warm-up-time {cfg['warmup']:g} -c {UNARY_C} -m {UNARY_M} -t 1")
        out.append(table(
            ["", "ours", "grpc.aio", "ours/grpc.aio", "target"],
            [["calls/s", f_num(o.get("req_per_s")), f_num(g.get("req_per_s")),
              f"{ratio:.2f}x" if ratio else "-",
              f">= {UNARY_TARGET:g}x ({met(ratio and ratio >= UNARY_TARGET)})"],
             ["server CPU us/call", f_num(o.get("server_cpu_us_per_call"), 1),
              f_num(g.get("server_cpu_us_per_call"), 1),
              f"{cpu_ratio:.2f}x" if cpu_ratio else "-", ""],
             ["server CPU (cores)", f_num(o.get("server_cpu_util"), 2),
              f_num(g.get("server_cpu_util"), 2), "", ""],
             ["h2load CPU (cores)", f_num(o.get("h2load_cpu_util"), 2),
              f_num(g.get("h2load_cpu_util"), 2), "", ""],
             ["other procs (cores)", f_num(o.get("other_cpu_util"), 2),
              f_num(g.get("other_cpu_util"), 2), "", ""],
             ["calls ok / failed", f"{o.get('succeeded', 0):,}/{o.get('failed', '-')}",
              f"{g.get('succeeded', 0):,}/{g.get('failed', '-')}", "", ""],
             ["data check", "ok" if o.get("data_check") else "FAIL",
              "ok" if g.get("data_check") else "FAIL", "", ""]]))
    s = res.get("stream")
    if s:
        g_rate = (s.get("grpcio") or {}).get("msgs_per_s")
        rows = []
        for key, label in (("ours_batch", "ours, write_batch"),
                           ("ours_gen", "ours, async generator"),
                           ("grpcio", "grpc.aio, async generator")):
            r = s.get(key)
            if not r:
                continue
            rate = r.get("msgs_per_s")
            vs = f_ratio(rate, g_rate)
            rows.append([label, f_num(r.get("n")), f_num(r.get("finished_s"), 3),
                         f_num(rate), f_num(r.get("server_cpu_ns_per_msg")),
                         f_num(r.get("server_cpu_util"), 2), f_num(r.get("h2load_cpu_util"), 2),
                         f_num(r.get("other_cpu_util"), 2),
                         "ok" if r.get("data_check") else "FAIL",
                         f"{vs:.1f}x" if vs else "-",
                         met(rate and rate >= STREAM_TARGET)])
        out.append("")
        out.append("2. Server streaming: one call, N x 100-byte messages "
                   f"(h2load -n 1 -c 1 -m 1); target >= {STREAM_TARGET:,} msg/s")
        out.append(table(["", "N", "seconds", "msgs/s", "srv CPU ns/msg", "srv cores",
                          "h2load cores", "other", "data=N*105", "vs grpc.aio", "target"], rows))
    i = res.get("idle")
    if i and "baseline" in i:
        b, w = i["baseline"], i["with_streams"]
        rr = f_ratio(w["calls_per_s"], b["calls_per_s"])
        cr = f_ratio(w.get("server_cpu_us_per_call"), b.get("server_cpu_us_per_call"))
        n = i["streams"]
        out.append("")
        out.append(f"3. Idle-stream cost: our Channel (uvloop, own process), 1 connection, "
                   f"{i['concurrency']} unary calls in flight, {i['duration_s']:g} s per phase")
        out.append(table(
            ["", "0 idle streams", f"{n:,} idle streams", "ratio", "target"],
            [["calls/s", f_num(b["calls_per_s"]), f_num(w["calls_per_s"]),
              f"{rr:.3f}" if rr else "-",
              f">= {1 - IDLE_TARGET:.2f} ({met(rr and rr >= 1 - IDLE_TARGET)})"],
             ["server CPU us/call", f_num(b.get("server_cpu_us_per_call"), 1),
              f_num(w.get("server_cpu_us_per_call"), 1), f"{cr:.3f}" if cr else "-",
              f"<= {1 + IDLE_TARGET:.2f} ({met(cr and cr <= 1 + IDLE_TARGET)})"],
             ["server CPU (cores)", f_num(b["server_cpu_util"], 2),
              f_num(w["server_cpu_util"], 2), "", ""],
             ["client CPU (cores)", f_num(b["client_cpu_util"], 2),
              f_num(w["client_cpu_util"], 2), "", ""],
             ["other procs (cores)", f_num(b.get("other_cpu_util"), 2),
              f_num(w.get("other_cpu_util"), 2), "", ""],
             ["call errors", str(b["errors"]), str(w["errors"]), "", ""]]))
        sb, sa = i.get("server_before", {}), i.get("server_after", {})
        out.append(f"   Hang handlers running on the server: {sb.get('hang')} before, "
                   f"{sa.get('hang')} after the loaded phase (open HTTP/2 streams "
                   f"{sb.get('streams')}/{sa.get('streams')}, connections "
                   f"{sa.get('connections')}); opened in {i.get('open_s', 0):.2f} s")
    elif i:
        out.append("")
        out.append(f"3. Idle-stream cost: FAILED ({i.get('error')})")
    lone = res.get("lone")
    if lone:
        g = (lone.get("grpcio") or {}).get("server_cpu_us_per_call")
        base = (lone.get("baseline") or {}).get("server_cpu_us_per_call")
        rows = []
        for key, label in (("ours", "ours"), ("baseline", "ours, baseline"),
                           ("grpcio", "grpc.aio")):
            r = lone.get(key)
            if not r:
                continue
            us = r.get("server_cpu_us_per_call")
            rows.append([label, f_num(r.get("calls_per_s")), f_num(us, 1),
                         f"{f_num(r.get('server_user_us_per_call'), 1)} / "
                         f"{f_num(r.get('server_sys_us_per_call'), 1)}",
                         f_num(r.get("server_cpu_util"), 2), f_num(r.get("other_cpu_util"), 2),
                         f"{r['errors']}/{r['wrong']}/{r['failed_clients']}",
                         f"{f_ratio(us, g):.2f}x" if f_ratio(us, g) else "-"])
        out.append("")
        out.append(f"4. Lone unary calls: {cfg.get('lone_connections')} grpc.aio connections in "
                   f"{cfg.get('lone_procs')} processes, one call in flight each, "
                   f"{cfg['duration']:g} s")
        out.append(table(["", "calls/s", "server CPU us/call", "user / sys", "server cores",
                          "other procs",
                          "errors/wrong/failed", "vs grpc.aio"], rows))
        o = (lone.get("ours") or {}).get("server_cpu_us_per_call")
        if o and g:
            line = (f"   target: ours <= {LONE_VS_GRPC:g}x grpc.aio: {o / g:.2f}x "
                    f"({met(o / g <= LONE_VS_GRPC)})")
            if base:
                line += (f"; >= {LONE_VS_BASE:g}x better than the baseline: {base / o:.2f}x "
                         f"({met(base / o >= LONE_VS_BASE)})")
            out.append(line)
    return "\n".join(out)


# -- main --------------------------------------------------------------------------------

def _env(h2load):
    try:
        import grpc
        grpc_version = grpc.__version__
    except ImportError:
        grpc_version = "?"
    try:
        h2v = subprocess.run([h2load, "--version"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        h2v = "h2load ?"
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "grpcio": grpc_version, "h2load": h2v, "machine": platform.machine(),
            "kernel": platform.release(), "loadavg_before": _loadavg()}


def _loadavg():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.rpc_capacity",
                                 description="gRPC capacity: our server vs grpc.aio "
                                             "(unary, server streaming, idle-stream cost)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds per measured unary run / idle-test phase (default 10; "
                         "3 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="short run: 3 s phases, ~1 s streaming calls")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds (default 1)")
    ap.add_argument("--stream-seconds", type=float, default=None,
                    help="target length of each streaming call (default 4; 1 with --quick)")
    ap.add_argument("--idle-streams", type=int, default=5000)
    ap.add_argument("--idle-concurrency", type=int, default=64)
    ap.add_argument("--sections", default="unary,stream,idle,lone",
                    help="comma-separated subset of unary,stream,idle,lone")
    ap.add_argument("--lone-connections", type=int, default=200)
    ap.add_argument("--lone-procs", type=int, default=4,
                    help="client processes the lone section's connections are spread over")
    ap.add_argument("--baseline-python", default=None,
                    help="lone section: also measure the server of this interpreter (another "
                         "checkout's .venv/bin/python): 'before' figures in the same run")
    ap.add_argument("--h2load", default=shutil.which("h2load") or "/usr/bin/h2load")
    ap.add_argument("--json", default=str(RESULTS), help=f"results file (default {RESULTS})")
    args = ap.parse_args(argv)
    duration = args.duration if args.duration is not None else (3.0 if args.quick else 10.0)
    stream_s = args.stream_seconds or (1.0 if args.quick else 4.0)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if sections & {"unary", "stream"} and not os.path.exists(args.h2load):
        sys.exit(f"h2load not found at {args.h2load} (apt-get install nghttp2-client)")

    signal.signal(signal.SIGTERM, _on_sigterm)

    def log(msg):
        print(msg, flush=True)

    res = {"config": {"duration": duration, "warmup": args.warmup, "quick": args.quick,
                      "stream_seconds": stream_s, "idle_streams": args.idle_streams,
                      "idle_concurrency": args.idle_concurrency, "sections": sorted(sections),
                      "lone_connections": args.lone_connections, "lone_procs": args.lone_procs,
                      "baseline_python": args.baseline_python,
                      "started": datetime.datetime.now().isoformat(timespec="seconds")},
           "env": _env(args.h2load)}
    try:
        with tempfile.TemporaryDirectory(prefix="rpc_capacity_") as tmpdir:
            unary_body = Path(tmpdir) / "unary.bin"
            unary_body.write_bytes(grpc_body(b"x" * 100))

            if "unary" in sections:
                res["unary"] = {}
                for impl in ("ours", "grpcio"):
                    log(f"[unary] {impl}: h2load {duration:g} s + {args.warmup:g} s warm-up ...")
                    with ServerProc(impl) as srv:
                        r = run_unary(args.h2load, srv, unary_body, duration, args.warmup)
                    res["unary"][impl] = r
                    log(f"    {f_num(r.get('req_per_s'))} calls/s, "
                        f"{f_num(r.get('server_cpu_us_per_call'), 1)} server CPU-us/call, "
                        f"{r.get('succeeded', 0):,} ok, {r.get('failed', '?')} failed, "
                        f"data check {'ok' if r['data_check'] else 'FAIL'}")
                    if not r["data_check"]:
                        log(r.get("h2load_output", ""))

            if "stream" in sections:
                res["stream"] = {}
                cases = [("ours_batch", "ours", "/bench.Bench/Stream", 1_000_000),
                         ("ours_gen", "ours", "/bench.Bench/StreamGen", 100_000),
                         ("grpcio", "grpcio", "/bench.Bench/Stream", 20_000)]
                for key, impl, path, probe_n in cases:
                    log(f"[stream] {key}: {path} ...")
                    with ServerProc(impl) as srv:
                        r = stream_case(args.h2load, srv, path, probe_n, stream_s, tmpdir, log)
                    res["stream"][key] = r
                    log(f"    N={r['n']:,} in {f_num(r.get('finished_s'), 3)} s = "
                        f"{f_num(r.get('msgs_per_s'))} msg/s, data "
                        f"{r.get('traffic_data', 0):,} B (expected {r['data_expected']:,}): "
                        f"{'ok' if r['data_check'] else 'FAIL'}")
                    if not r["data_check"]:
                        log(r.get("h2load_output", ""))

            if "idle" in sections:
                log(f"[idle] our server, {args.idle_streams:,} Hang streams, "
                    f"2 x ({args.warmup:g} s warm-up + {duration:g} s) ...")
                with ServerProc("ours") as srv:
                    p = spawn([sys.executable, "-m", "bench.rpc_capacity.load_client",
                               "--port", str(srv.port), "--server-pid", str(srv.pid),
                               "--duration", f"{duration:g}", "--warmup", f"{args.warmup:g}",
                               "--concurrency", str(args.idle_concurrency),
                               "--streams", str(args.idle_streams)],
                              stdout=subprocess.PIPE)
                    out = p.stdout.read().decode()
                    wait_child(p)
                if p.returncode == 0 and out.strip():
                    res["idle"] = json.loads(out.strip().splitlines()[-1])
                    b, w = res["idle"]["baseline"], res["idle"]["with_streams"]
                    log(f"    {f_num(b['calls_per_s'])} -> {f_num(w['calls_per_s'])} calls/s; "
                        f"server CPU-us/call {f_num(b['server_cpu_us_per_call'], 1)} -> "
                        f"{f_num(w['server_cpu_us_per_call'], 1)}")
                else:
                    res["idle"] = {"error": f"load client exited with {p.returncode}"}
                    log(f"    load client failed (exit {p.returncode})")
            if "lone" in sections:
                res["lone"] = {}
                impls = [("ours", "ours", None), ("grpcio", "grpcio", None)]
                if args.baseline_python:
                    impls.insert(1, ("baseline", "ours", args.baseline_python))
                for key, impl, python in impls:
                    log(f"[lone] {key}: {args.lone_connections} connections, one call in "
                        f"flight each, {args.warmup:g} s warm-up + {duration:g} s ...")
                    with ServerProc(impl, python) as srv:
                        r = run_lone(srv, args.lone_connections, args.lone_procs, duration,
                                     args.warmup)
                    res["lone"][key] = r
                    log(f"    {f_num(r['calls_per_s'])} calls/s, "
                        f"{f_num(r['server_cpu_us_per_call'], 1)} server CPU-us/call, "
                        f"errors {r['errors']}, wrong {r['wrong']}")
    except KeyboardInterrupt:
        reap_all()
        print("\ninterrupted; all benchmark processes stopped", file=sys.stderr)
        sys.exit(130)
    finally:
        reap_all()

    res["env"]["loadavg_after"] = _loadavg()
    summary = summarize(res)
    res["summary"] = summary.splitlines()
    print()
    print(summary)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nresults written to {path}")


if __name__ == "__main__":
    main()
