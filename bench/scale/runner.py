"""bench.scale: a broker with many topics, many active topics and many connections (issue
53), against a baseline build's broker in the same run. See bench/README.md, "bench.scale".

    .venv/bin/python -m bench.scale [--quick] [--sections topics,active,batched,connections,idle]
        [--baseline-python /path/to/baseline/.venv/bin/python] [--max 100000]

Every section starts its own standalone brokers (fresh data directories under a scratch
directory) with this interpreter ("ours") and, when given, with --baseline-python's; the load
generators and the measuring code are this checkout's for both.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench._proc import reap_all
from bench.scale import active, batched, connections, idle, topics
from bench.scale.common import REPO, Broker, loadavg

SECTIONS = ("topics", "active", "batched", "connections", "idle")
RESULTS = os.path.join(REPO, "bench", "results", "scale.json")
PLOT = os.path.join(REPO, "bench", "results", "scale.png")

# The targets (issue 53, "Targets").
T_TOPICS = 100_000
T_FDS = 2_000
T_DISK_FIXED = 100 * 2**20        # disk under 100 MB plus twice the data
T_RSS = 2 * 2**30
T_CREATE_RATE = 1_000             # topics/s
T_SIGTERM = 10.0                  # s
T_READY = 10.0                    # s
T_ACTIVE_K = 1_000
T_ACTIVE_RATE = 30_000            # msgs/s in all
T_ACTIVE_P99 = 50.0               # ms
T_BATCHED = 0.95                  # x the baseline's
T_ONE_P50 = 0.42                  # ms: the "today"
T_CONNECTIONS = 10_000
T_CONN_RSS = 30                   # KB of RSS per connection
MESSAGE = 100                     # bytes per message


def _ints(text):
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="topics,active,batched,connections",
                    help="comma-separated subset of: " + ", ".join(SECTIONS))
    ap.add_argument("--quick", action="store_true",
                    help="small sizes to check the harness: topics 1,000; K 1,10,100; 5 s "
                         "windows; connections 1,000; idle 1,000")
    ap.add_argument("--baseline-python", default=None,
                    help="also run every section against a broker of this interpreter (a "
                         "checkout of the baseline with its own venv)")
    ap.add_argument("--steps", default=None,
                    help="topics: the sweep's steps (default 1000,5000,10000,20000,50000,"
                         "100000, up to --max)")
    ap.add_argument("--max", type=int, default=None,
                    help="topics: the largest step (default 100,000; 1,000 with --quick)")
    ap.add_argument("--create-procs", type=int, default=2)
    ap.add_argument("--create-inflight", type=int, default=16,
                    help="topics being created at a time per process")
    ap.add_argument("--keep-producers", action="store_true",
                    help="topics: keep the creating connections open until the step is "
                         "measured (the protocol has no call closing a producer: closing "
                         "one is closing its connection, the default right after creating)")
    ap.add_argument("--active", default=None,
                    help="active: the values of K (default 1,10,100,1000; 1,10,100 with "
                         "--quick)")
    ap.add_argument("--procs", type=int, default=2, help="active: generator processes")
    ap.add_argument("--connections", type=int, default=8,
                    help="active: generator connections in all (at most K)")
    ap.add_argument("--duration", type=float, default=None,
                    help="active and batched: seconds per window (default 10; 5 with "
                         "--quick)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--conn-counts", default=None,
                    help="connections: the counts (default 1000,10000; 1000 with --quick)")
    ap.add_argument("--conn-procs", type=int, default=4)
    ap.add_argument("--conn-reliable", action="store_true",
                    help="connections: reliable producers (default non-reliable)")
    ap.add_argument("--topics", type=int, default=None,
                    help="idle: topics with a producer and an idle consumer (default "
                         "10,000; 1,000 with --quick)")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory")
    ap.add_argument("--json", default=RESULTS)
    ap.add_argument("--plot", default=PLOT)
    args = ap.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    q = args.quick
    args.max = args.max or (1_000 if q else T_TOPICS)
    steps = _ints(args.steps) if args.steps else [1_000, 5_000, 10_000, 20_000, 50_000,
                                                   100_000]
    args.steps = sorted({s for s in steps if s <= args.max} | {args.max})
    args.active = _ints(args.active) if args.active else ([1, 10, 100] if q
                                                          else [1, 10, 100, 1_000])
    args.duration = args.duration or (5.0 if q else 10.0)
    args.conn_counts = _ints(args.conn_counts) if args.conn_counts else (
        [1_000] if q else [1_000, 10_000])
    args.topics = args.topics or (1_000 if q else 10_000)
    return args


def builds(args):
    out = [("ours", sys.executable)]
    if args.baseline_python:
        out.append(("baseline", args.baseline_python))
    return out


def git_head():
    try:
        return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


# -- tables ------------------------------------------------------------------------------

def _n(v, fmt="{:,.0f}"):
    return "-" if v is None else fmt.format(v)


def _mib(b):
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def topics_table(res):
    lines = ["| build | topics | created/s | errors | RSS | descriptors | disk (du) | "
             "disk (apparent) | SIGTERM | restart to serving |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for build, rows in res.items():
        for r in rows:
            if "skipped" in r:
                lines.append(f"| {build} | {r['topics']:,} | skipped: {r['skipped']} "
                             "| | | | | | | |")
                continue
            err = f"{r['errors']:,}" + (f" ({r['first_error'][:80]})" if r["errors"] else "")
            lines.append(
                f"| {build} | {r['created_total']:,} | {_n(r['topics_per_s'])} | {err} | "
                f"{_n(r['rss_mib'])} MiB | {_n(r['fds'])} | {_mib(r['disk_bytes'])} | "
                f"{_mib(r['disk_apparent_bytes'])} | "
                f"{_n(r['sigterm_s'], '{:.2f} s') if r['sigterm_s'] is not None else '> 60 s (killed)'} | "
                f"{_n(r['restart_serving_s'], '{:.2f} s') if r['restart_serving_s'] is not None else 'not serving'} |")
    return "\n".join(lines)


def active_table(res, ceiling=None):
    lines = ["| build | K | msgs/s | p50 | p99 | broker CPU | generator CPU | errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for build, rows in list(res.items()) + ([("no-op server (generator ceiling)", ceiling)]
                                            if ceiling else []):
        for r in rows:
            if "error" in r:
                lines.append(f"| {build} | {r['topics']:,} | error: {r['error'][:80]} "
                             "| | | | | |")
                continue
            lines.append(f"| {build} | {r['topics']:,} | {r['msgs_per_s']:,.0f} | "
                         f"{_n(r.get('p50_ms'), '{:.2f} ms')} | "
                         f"{_n(r.get('p99_ms'), '{:.2f} ms')} | "
                         f"{r['broker_cores']:.2f} cores | {r['generator_cores']:.2f} cores | "
                         f"{r['errors']} |")
    return "\n".join(lines)


def batched_table(res):
    lines = ["| build | 100 B x 1000, 1 producer | 4 producers | one in flight: msgs/s | "
             "p50 | p99 |", "|---|---:|---:|---:|---:|---:|"]
    for build, r in res.items():
        rel = r.get("reliable", {})

        def rate(key):
            v = rel.get(key) if isinstance(rel, dict) else None
            if rel.get("error"):
                return "error"
            return "-" if not v or "error" in v else f"{v['msgs_per_s']:,.0f}"
        one = r.get("one_in_flight") or {}
        lines.append(f"| {build} | {rate('b100_1000_p1')} | {rate('b100_1000_p4')} | "
                     f"{_n(one.get('msgs_per_s'))} | {_n(one.get('p50_ms'), '{:.3f} ms')} | "
                     f"{_n(one.get('p99_ms'), '{:.3f} ms')} |")
    return "\n".join(lines)


def connections_table(res):
    lines = ["| build | connections | served | errors | seconds | RSS before | RSS after | "
             "RSS per connection |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for build, rows in res.items():
        for r in rows:
            if "error" in r and "count" not in r:
                lines.append(f"| {build} | {r.get('requested', '-')} | error: "
                             f"{r['error'][:80]} | | | | | |")
                continue
            lines.append(f"| {build} | {r['count']:,} | {r['served']:,} | {r['errors']:,} | "
                         f"{r['seconds']:.1f} | {r['rss_before_kb'] / 1024:,.0f} MiB | "
                         f"{r['rss_after_kb'] / 1024:,.0f} MiB | {r['rss_per_conn_kb']:.1f} KB |")
    return "\n".join(lines)


# -- targets (judged on "ours"; a target over nothing measured is NOT met) -----------------

def targets(results):
    """[(text, verdict)]: verdict "met", "NOT met", or "not judged" (a --quick run or a
    section that did not run)."""
    out = []
    t = (results.get("topics") or {}).get("ours")
    if t is not None:
        done = [r for r in t if "created_total" in r]
        last = done[-1] if done else None
        if last is None:
            out.append((f"{T_TOPICS:,} reliable topics: nothing was measured", "NOT met"))
        else:
            data = last["created_total"] * MESSAGE
            rates = [r["topics_per_s"] or 0 for r in done]
            at = f" at {last['created_total']:,} topics"
            reached = last["created_total"] >= T_TOPICS
            errors = sum(r["errors"] for r in done)
            if reached or last.get("stopped_here"):
                out.append((f"{T_TOPICS:,} topics with 0 errors (made "
                            f"{last['created_total']:,}, {errors} errors)",
                            _v(reached and not errors)))
            else:
                out.append((f"{T_TOPICS:,} reliable topics: the sweep ended at "
                            f"{last['topics']:,} (--max)", "not judged"))
            checks = [
                (f"descriptors < {T_FDS:,} ({last['fds']}{at})",
                 last["fds"] is not None and last["fds"] < T_FDS),
                (f"disk < 100 MiB + 2 x data ({last['disk_bytes'] / 2**20:,.0f} MiB{at}, "
                 f"limit {(T_DISK_FIXED + 2 * data) / 2**20:,.0f})",
                 last["disk_bytes"] < T_DISK_FIXED + 2 * data),
                (f"RSS < 2 GiB ({last['rss_mib']:,.0f} MiB{at})",
                 last["rss_mib"] * 2**20 < T_RSS),
                (f"created at >= {T_CREATE_RATE:,} topics/s (slowest step "
                 f"{min(rates):,.0f}/s)", min(rates) >= T_CREATE_RATE),
                (f"SIGTERM < {T_SIGTERM:g} s (slowest "
                 f"{_worst([r['sigterm_s'] for r in done])})",
                 all(r["sigterm_s"] is not None and r["sigterm_s"] < T_SIGTERM for r in done)),
                (f"serving again < {T_READY:g} s after a restart (slowest "
                 f"{_worst([r['restart_serving_s'] for r in done])})",
                 all(r["restart_serving_s"] is not None and r["restart_serving_s"] < T_READY
                     for r in done)),
            ]
            # Below 100,000 topics a miss is already a miss; a pass proves nothing yet.
            out += [(text, "met" if ok and reached else "NOT met" if not ok
                     else "not judged") for text, ok in checks]
    a = (results.get("active") or {}).get("ours")
    if a is not None:
        row = next((r for r in a if r.get("topics") == T_ACTIVE_K and "msgs_per_s" in r), None)
        if row is None:
            verdict = "not judged" if all(r.get("topics", 0) < T_ACTIVE_K for r in a) and a \
                else "NOT met"
            out.append((f"{T_ACTIVE_K:,} active topics: not measured", verdict))
        else:
            out.append((f"{T_ACTIVE_K:,} active topics >= {T_ACTIVE_RATE:,} msgs/s "
                        f"({row['msgs_per_s']:,.0f})", _v(row["msgs_per_s"] >= T_ACTIVE_RATE)))
            out.append((f"{T_ACTIVE_K:,} active topics p99 < {T_ACTIVE_P99:g} ms "
                        f"({_n(row.get('p99_ms'), '{:.1f}')} ms)",
                        _v(row.get("p99_ms") is not None and row["p99_ms"] < T_ACTIVE_P99)))
    b = results.get("batched") or {}
    if "ours" in b:
        ours_rel, base_rel = b["ours"].get("reliable") or {}, \
            (b.get("baseline") or {}).get("reliable") or {}
        for key, label in (("b100_1000_p1", "1 producer"), ("b100_1000_p4", "4 producers")):
            o = (ours_rel.get(key) or {}).get("msgs_per_s")
            base = (base_rel.get(key) or {}).get("msgs_per_s")
            if o is None:
                out.append((f"batched, {label}: not measured", "NOT met"))
            elif base is None:
                out.append((f"batched, {label}: no baseline figure", "not judged"))
            else:
                out.append((f"batched 100 B x 1000, {label} >= {T_BATCHED}x the baseline "
                            f"({o:,.0f} vs {base:,.0f}: {o / base:.2f}x)",
                            _v(o >= T_BATCHED * base)))
        one = (b["ours"].get("one_in_flight") or {}).get("p50_ms")
        base_one = ((b.get("baseline") or {}).get("one_in_flight") or {}).get("p50_ms")
        if one is None:
            out.append(("one message in flight p50: not measured", "NOT met"))
        else:
            ref = base_one if base_one is not None else T_ONE_P50
            out.append((f"one message in flight p50 no worse than "
                        f"{'the baseline' if base_one is not None else 'the issue'}'s "
                        f"({one:.3f} vs {ref:.3f} ms)", _v(one <= ref)))
    c = (results.get("connections") or {}).get("ours")
    if c is not None:
        row = next((r for r in c if r.get("count") == T_CONNECTIONS), None)
        if row is None:
            verdict = "not judged" if c and all(r.get("count", r.get("requested", 0))
                                                < T_CONNECTIONS for r in c) else "NOT met"
            out.append((f"{T_CONNECTIONS:,} connections: not measured", verdict))
        else:
            out.append((f"{T_CONNECTIONS:,} connections all served ({row['served']:,})",
                        _v(row["served"] == T_CONNECTIONS and not row["errors"])))
            out.append((f"< {T_CONN_RSS} KB of RSS per connection "
                        f"({row['rss_per_conn_kb']:.1f})", _v(row["rss_per_conn_kb"] < T_CONN_RSS)))
    return out


def _v(ok):
    return "met" if ok else "NOT met"


def _worst(values):
    if any(v is None for v in values):
        return "killed / never"
    return f"{max(values):.2f} s" if values else "-"


# -- the run -----------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    t_start = time.monotonic()

    def log(text):
        print(f"[{time.monotonic() - t_start:6.0f} s] {text}", flush=True)

    scratch = tempfile.mkdtemp(prefix="danube-scale-", dir=args.dir)
    env = {"started": datetime.datetime.now().isoformat(timespec="seconds"),
           "commit": git_head(), "python": sys.executable,
           "baseline_python": args.baseline_python, "cpus": os.cpu_count(),
           "loadavg_before": loadavg(), "scratch": scratch}
    results = {}
    log(f"bench.scale: sections {','.join(args.sections)}; builds "
        f"{', '.join(f'{n} ({p})' for n, p in builds(args))}; {os.cpu_count()} CPUs shared "
        f"with other work, load {env['loadavg_before']}")
    try:
        if "topics" in args.sections:
            log(f"topics: steps {args.steps}, {args.create_procs} processes x "
                f"{args.create_inflight} at a time, producers "
                f"{'kept' if args.keep_producers else 'closed'}")
            results["topics"] = {
                name: topics.sweep(py, scratch, name, args.steps, procs=args.create_procs,
                                   inflight=args.create_inflight, keep=args.keep_producers,
                                   log=log) for name, py in builds(args)}
        if "active" in args.sections:
            log(f"active: K {args.active}, {args.procs} generator processes, "
                f"{args.warmup:g} s warm-up + {args.duration:g} s per point")
            results["active_generator_ceiling"] = active.generator_ceiling(
                [max(args.active)], procs=args.procs, connections=args.connections,
                warmup=args.warmup, duration=args.duration, log=log)
            results["active"] = {
                name: active.sweep(py, scratch, name, args.active, procs=args.procs,
                                   connections=args.connections, warmup=args.warmup,
                                   duration=args.duration, log=log)
                for name, py in builds(args)}
        if "batched" in args.sections:
            log("batched: bench.reliable b100_1000_p1,b100_1000_p4, then one message in "
                "flight")
            results["batched"] = {}
            for name, py in builds(args):
                results["batched"][name] = {
                    "reliable": batched.reliable_batched(py, scratch, name, args.duration,
                                                         log),
                    "one_in_flight": batched.one_in_flight(py, scratch, name,
                                                           warmup=args.warmup,
                                                           duration=args.duration, log=log)}
        if "connections" in args.sections:
            results["connections"] = {name: connections_sweep(py, scratch, name, args, log)
                                      for name, py in builds(args)}
        if "idle" in args.sections:
            log(f"idle: {args.topics:,} topics with a producer and an idle consumer each")
            results["idle"] = {}
            for name, py in builds(args):
                results["idle"][name] = idle.measure(py, scratch, name, args.topics)
                log(f"  {name}: {json.dumps(results['idle'][name])}")
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        reap_all()
        shutil.rmtree(scratch, ignore_errors=True)
    env["loadavg_after"] = loadavg()
    env["total_s"] = round(time.monotonic() - t_start, 1)
    report(args, env, results)
    return 0


def connections_sweep(python, workdir, name, args, log):
    """bench/scale/connections.py's measure() per count, a fresh broker each."""
    rows = []
    for count in args.conn_counts:
        broker = Broker(python, workdir, f"conns-{name}-{count}").start()
        try:
            row = connections.measure("127.0.0.1", broker.port, broker.pid, count,
                                      procs=args.conn_procs, reliable=args.conn_reliable)
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row = {"requested": count, "error": f"{type(exc).__name__}: {exc}"[:1000]}
            log(f"  {name}: {count:,} connections: ERROR {row['error'][:200]}")
        else:
            log(f"  {name}: {count:,} connections: {row['served']:,} served, "
                f"{row['errors']:,} errors, {row['rss_per_conn_kb']:.1f} KB RSS each, "
                f"{row['seconds']:.1f} s")
        finally:
            broker.stop()
            shutil.rmtree(broker.data, ignore_errors=True)
        rows.append(row)
    return rows


def report(args, env, results):
    tables = {}
    if "topics" in results:
        tables["topics"] = topics_table(results["topics"])
    if "active" in results:
        tables["active"] = active_table(results["active"],
                                        results.get("active_generator_ceiling"))
    if "batched" in results:
        tables["batched"] = batched_table(results["batched"])
    if "connections" in results:
        tables["connections"] = connections_table(results["connections"])
    for name, table in tables.items():
        print(f"\n{name}:\n{table}")
    if "idle" in results:
        print("\nidle:\n" + json.dumps(results["idle"], indent=2))
    checks = targets(results)
    print("\ntargets (judged on ours):")
    for text, verdict in checks:
        print(f"  [{verdict}] {text}")
    print(f"\nload average before {env['loadavg_before']}, after {env['loadavg_after']}; "
          f"{env['cpus']} CPUs shared with other work: figures are noisy; "
          f"total {env['total_s']:.0f} s")
    if results.get("active"):
        from bench.scale.plot import active_plot
        os.makedirs(os.path.dirname(args.plot), exist_ok=True)
        active_plot(results["active"], args.plot, rate_target=T_ACTIVE_RATE,
                    p99_target=T_ACTIVE_P99,
                    title=f"bench.scale active topics, {env['started'][:10]}, "
                          f"{env['commit']} (ours: the installed build), load "
                          f"{env['loadavg_before'][0]:.1f}")
        print(f"wrote {args.plot}")
    out = {"config": {k: v for k, v in vars(args).items()}, "environment": env,
           "results": results, "targets": [{"target": t, "verdict": v} for t, v in checks],
           "tables": tables}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"wrote {args.json}")
