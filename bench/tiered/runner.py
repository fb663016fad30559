"""Orchestrates the tiered-storage benchmark (see bench/README.md, "bench.tiered").

Three sections, in this order, everything on 127.0.0.1 with ports chosen by the OS:

* storage: the same history read sequentially from the local WAL and, after upload_segment,
  through the broker's HistoryCursor from every object store (in this process, no broker
  running);
* replay: a broker process per case drains a reliable subscription whose whole history is
  in the local WAL (storage.mode local) or only in the durable store (storage.mode
  object_store, local retention deleted every uploaded segment), through our client;
* publish: unbatched reliable send() ack latency at a paced rate while a second producer
  pushes bulk batches into another topic, on two groups of brokers without tiered storage
  (their difference is the A/A noise band) and on brokers uploading every second to
  SeaweedFS and to an S3 endpoint that discards what it gets (the broker's own share),
  every group once per round, in orders balanced for position and predecessor.

The object-store servers (SeaweedFS, fake-gcs-server, Azurite) come from
tests/support/objstore_servers.py and are started once for the whole run and always stopped.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import yaml

from bench._proc import LineWorker, popen, proc_cpu, reap, reap_all, repo_env, system_busy
from bench.e2e.common import format_table, us_percentiles
from bench.e2e.runner import Broker as E2EBroker
from bench.e2e.runner import loadavg, sleep_until
from bench.reliable.runner import Worker as ReliableWorker
from bench.tiered import storage as storage_bench

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "tiered.json"

REPLAY_TARGET = 0.25            # replay from SeaweedFS >= 1/4 of the local WAL's rate
SECTIONS = ("storage", "replay", "publish")
STORE_PRIORITY = {"normal": (), "idle": ("chrt", "--idle", "0")}
LABELS = {"wal": "local WAL", "wal_verify": "local WAL, verify_reads",
          "local": "local WAL", "memory": "memory", "fs": "fs (directory)",
          "s3": "s3 (SeaweedFS)", "gcs": "gcs (fake-gcs-server)", "azblob": "azblob (Azurite)",
          "local-rotating": "local, rotating every 1 s", "s3-sink": "s3 (null sink)"}
CLOUD = ("s3", "gcs", "azblob", "s3-sink")
PUBLISH_ONLY = ("local-rotating", "s3-sink")


def _load_objstore_servers():
    """tests/support/objstore_servers.py (tests/ is not a package): the test servers and the
    storage.durable mappings that point at them."""
    path = REPO / "tests" / "support" / "objstore_servers.py"
    spec = importlib.util.spec_from_file_location("objstore_servers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["objstore_servers"] = module
    spec.loader.exec_module(module)
    return module


objstore_servers = _load_objstore_servers()


# -- processes ---------------------------------------------------------------------------

class Broker(E2EBroker):
    """`python -P -m danube broker --mode standalone --config-file F` (bench.e2e's launcher)
    with a config file written from `tree`, a fresh data directory, the Prometheus
    exporter on."""

    def __init__(self, name, tree, scratch, logs, *, probe=None):
        self.name = name
        self.data_dir = scratch / f"data-{name}"
        self.data_dir.mkdir(parents=True)
        self.config = scratch / f"broker-{name}.yml"
        self.config.write_text(yaml.safe_dump(tree, sort_keys=False))
        launcher = ("-m", "danube") if probe is None else \
            ("-m", "bench.tiered.broker_probe", str(probe))
        super().__init__(self.data_dir, logs / f"broker-{name}.log", launcher=launcher,
                         extra=("--config-file", str(self.config)))

    def scrape(self):
        """Every danube_ sample: {'name{labels}': value}."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError as exc:
            raise RuntimeError(f"{self.name}: cannot read its metrics: {exc!r}") from None
        out = {}
        for line in text.splitlines():
            if line.startswith("danube_"):
                key, _, value = line.rpartition(" ")
                # without the broker="<id>" label every series carries
                key = re.sub(r'broker="\d+",?', "", key).replace("{}", "")
                out[key] = float(value)
        return out

    def storage_metrics(self):
        """The broker-wide danube_storage_* counters ({} without tiered storage)."""
        return {k: v for k, v in self.scrape().items()
                if k.startswith("danube_storage_") and "{" not in k}

    def wal_files(self, topic):
        ns, name = topic.strip("/").split("/", 1)
        try:
            return sorted(n for n in os.listdir(self.data_dir / "wal" / ns / name)
                          if re.fullmatch(r"wal\.\d{20}\.log", n))
        except FileNotFoundError:
            return []

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()           # graceful: the broker handles SIGTERM
        reap(self.proc, 30.0)
        self.log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class Worker(LineWorker):
    """A bench.tiered.worker process (replay or bulk)."""

    def __init__(self, cfg, log_path):
        cmd = [sys.executable, "-P", "-m", "bench.tiered.worker", json.dumps(cfg)]
        self._start(cmd, env=repo_env(), cwd=REPO, log_path=log_path, label=cfg["role"])


def wait_for(what, predicate, timeout, interval=0.05):
    """Poll until predicate() is true; returns the seconds waited. Raises on timeout."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - t0


def cpu_of(pids):
    total = 0.0
    for pid in pids:
        try:
            total += proc_cpu(pid)
        except OSError:
            pass
    return total


class Servers:
    """The object-store servers, started in parallel, each in its own directory."""

    def __init__(self, kinds, scratch, prefix=()):
        self.running = {}
        self.skipped = {}
        errors = {}
        # The servers stand in for remote object storage: their data goes to tmpfs when there
        # is one, so their writes do not compete with the broker's WAL syncs for the disk
        # (a real S3 bucket is not on the broker's disk).
        shm = Path("/dev/shm")
        self.server_root = (Path(tempfile.mkdtemp(prefix="danube-bench-servers-", dir=shm))
                            if shm.is_dir() and os.access(shm, os.W_OK) else scratch)

        def start(kind):
            try:
                if kind == "s3-sink":
                    server = SinkServer()        # always idle priority: see SinkServer
                else:
                    server = objstore_servers.SERVER_CLASSES[kind](
                        self.server_root / f"server-{kind}")
                    server.launch_prefix = list(prefix)
                t0 = time.monotonic()
                server.start()
                server.start_s = time.monotonic() - t0
                self.running[kind] = server
            except objstore_servers.ServerNotInstalled as exc:
                self.skipped[kind] = str(exc)
            except Exception as exc:  # noqa: BLE001 - reported as skipped
                errors[kind] = exc
                self.skipped[kind] = f"did not start: {exc}"

        if "s3-sink" in kinds:
            start("s3-sink")
        threads = [threading.Thread(target=start, args=(k,)) for k in kinds if k != "s3-sink"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def pids(self, kind):
        server = self.running.get(kind)
        return [p.pid for p in server.procs] if server else []

    def close(self):
        for server in self.running.values():
            try:
                server.close()
            except Exception:  # noqa: BLE001 - cleanup goes on
                pass
        self.running.clear()
        if self.server_root.parent == Path("/dev/shm"):
            shutil.rmtree(self.server_root, ignore_errors=True)


def durable_for(kind, servers, scratch, name, **overrides):
    if kind == "s3-sink":
        server = servers.running.get(kind)
        return dict({"backend": "s3", "root": f"s3://sink/{name}", "endpoint": server.endpoint,
                     "region": "us-east-1", "access_key": "sink", "secret_key": "sink",
                     "connect_timeout_seconds": 2, "read_timeout_seconds": 10, "retries": 1},
                    **overrides)
    return objstore_servers.durable_config(kind, servers.running.get(kind), scratch, name,
                                           **overrides)


class SinkServer:
    """bench/tiered/s3sink.py: an S3 endpoint that reads every PUT and keeps nothing (the
    `s3-sink` publish backend: the broker's whole upload path without a store's work).

    It always runs SCHED_IDLE, whatever --store-priority says: taking the bytes off the
    socket is the receiving store's work, which a store on other hosts does on its own CPUs;
    at normal priority the sink, asleep between PUTs, preempts the broker's threads when a
    PUT wakes it. The sending side (the kernel's loopback work included) stays the broker's."""

    def __init__(self):
        self.procs = []
        self.endpoint = None

    def start(self):
        # Started from the main thread (see Servers): popen's parent-death signal fires
        # when the thread that started the child ends.
        proc = popen([*STORE_PRIORITY["idle"], sys.executable, "-P", "-m",
                      "bench.tiered.s3sink"],
                     env=repo_env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
        self.procs = [proc]
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError("the S3 sink did not start")
        self.endpoint = f"http://127.0.0.1:{int(line)}"

    def close(self):
        for proc in self.procs:
            reap(proc, 5.0)


# -- section 2: replay through a broker ---------------------------------------------------

def replay_tree(kind, durable):
    tree = {"dispatch": {"max_unacked_messages": 10000}}
    if kind == "local":
        tree["storage"] = {"mode": "local"}
    else:
        tree["storage"] = {"mode": "object_store",
                           "durable": dict(durable, upload_interval_seconds=1),
                           "local_retention": {"time_minutes": 0,
                                               "check_interval_minutes": 0.01}}
    return tree


def run_replay(kind, tag, servers, args, scratch, logs):
    name = f"replay-{tag}"
    durable = None if kind == "local" else durable_for(kind, servers, scratch, name)
    broker = Broker(name, replay_tree(kind, durable), scratch, logs)
    topic = f"/default/{name}-{uuid.uuid4().hex[:6]}"
    n = args.messages
    w = None
    try:
        w = Worker({"role": "replay", "url": broker.url, "topic": topic, "sub": "replay",
                    "name": name, "n": n, "size": args.size, "batch": 1000},
                   logs / f"{name}.worker.log")
        w.expect("ready", 60)
        waits = {}
        waits["consumer_gone_s"] = wait_for(
            "the broker to see the first consumer's stream end",
            lambda: broker.metrics(topic).get("danube_subscription_active_consumers", 1) == 0,
            30)
        w.send(cmd="publish")
        pub = w.expect("published", 300)
        if kind != "local":
            waits["uploaded_s"] = wait_for(
                f"offset {n - 1} in the durable tier",
                lambda: broker.metrics(topic).get("danube_storage_durable_offset", -1) >= n - 1,
                180)
            active = f"wal.{n:020d}.log"
            waits["local_deleted_s"] = wait_for(
                "local retention to delete the uploaded segments",
                lambda: broker.wal_files(topic) == [active], 120)
        else:
            time.sleep(1.0)
        files = broker.wal_files(topic)
        m_a = broker.storage_metrics()
        pids = {"broker": broker.pid, "consumer": w.pid, "server": servers.pids(kind)}
        t_a, sys_a = time.monotonic(), system_busy()
        cpu_a = {k: cpu_of(v if isinstance(v, list) else [v]) for k, v in pids.items()}
        w.send(cmd="drain")
        d = w.expect("drained", 600)
        t_b, sys_b = time.monotonic(), system_busy()
        cpu_b = {k: cpu_of(v if isinstance(v, list) else [v]) for k, v in pids.items()}
        m_b = broker.storage_metrics()
    finally:
        if w is not None:
            w.stop()
        broker.stop()
    wall = t_b - t_a
    cores = {k: (cpu_b[k] - cpu_a[k]) / wall for k in pids}
    cores["machine"] = (sys_b - sys_a) / wall
    cores["other"] = cores["machine"] - cores["broker"] - cores["consumer"] - cores["server"]
    hist = (m_b.get("danube_storage_history_messages_total", 0)
            - m_a.get("danube_storage_history_messages_total", 0))
    gets = (m_b.get("danube_storage_history_reads_total", 0)
            - m_a.get("danube_storage_history_reads_total", 0))
    return {"kind": kind, "tag": tag, "label": LABELS[kind], "topic": topic, "messages": n,
            "payload_bytes": args.size, "durable": _redact(durable),
            "publish_s": pub["seconds"], "waits": waits, "wal_files_before_drain": files,
            "drain": d, "msgs_per_s": d["received"] / d["seconds"] if d["seconds"] else 0.0,
            "history_messages_from_store": hist, "history_reads": gets,
            "read_failures": (m_b.get("danube_storage_history_read_failures_total", 0)
                              - m_a.get("danube_storage_history_read_failures_total", 0)),
            "drain_wall_s": wall, "cores": cores}


def _redact(durable):
    if durable is None:
        return None
    return {k: ("***" if "key" in k and k != "access_key" else v) for k, v in durable.items()}


# -- section 3: publish latency while uploads run ------------------------------------------

def publish_tree(kind, durable):
    if kind == "local":
        return {"storage": {"mode": "local"}}
    if kind == "local-rotating":
        return {"storage": {"mode": "local", "wal": {"rotation": {"max_hours": 1 / 3600}}}}
    return {"storage": {"mode": "object_store",
                        "durable": dict(durable, upload_interval_seconds=1)}}


def publish_kind(group):
    """'local#1' -> 'local': the broker kind of a publish group."""
    return group.split("#", 1)[0]


def publish_label(group):
    kind = publish_kind(group)
    if kind == "local":
        return f"local (no uploads) {group[len(kind):]}".rstrip()
    if kind.startswith("local"):
        return LABELS[kind]
    return f"{LABELS[kind]}, uploads every 1 s"


def run_publish(group, rnd, servers, args, scratch, logs):
    kind = publish_kind(group)
    name = f"publish-{group.replace('#', '')}-{rnd}"
    durable = None if kind.startswith("local") else durable_for(kind, servers, scratch, name)
    probe = scratch / f"probe-{name}.json" if args.probe else None
    broker = Broker(name, publish_tree(kind, durable), scratch, logs, probe=probe)
    lat_topic = f"/default/{name}-latency-{uuid.uuid4().hex[:6]}"
    bulk_topic = f"/default/{name}-bulk-{uuid.uuid4().hex[:6]}"
    bulk = lat = None
    try:
        bulk = Worker({"role": "bulk", "url": broker.url, "topic": bulk_topic,
                       "name": f"{name}-bulk", "size": args.bulk_size,
                       "batch": args.bulk_batch, "rate_bytes": args.bulk_mbps * 1e6},
                      logs / f"{name}.bulk.log")
        lat = ReliableWorker({"role": "producer", "url": broker.url, "topic": lat_topic,
                              "name": f"{name}-latency", "mode": "paced", "size": args.size,
                              "rate": args.rate, "inflight": 256, "source_base": 0},
                             logs / f"{name}.latency.log")
        bulk.expect("ready", 60)
        lat.expect("ready", 60)
        time.sleep(0.5)                         # let start-up CPU settle
        start = time.time() + 0.2
        ws = start + args.warmup
        we = ws + args.duration
        go = {"start": int(start * 1e9), "ws": int(ws * 1e9), "we": int(we * 1e9)}
        bulk.send(cmd="go", **go)
        lat.send(cmd="go", **go)
        pids = {"broker": [broker.pid], "latency": [lat.pid], "bulk": [bulk.pid],
                "server": servers.pids(kind)}
        sleep_until(ws)
        t_a, sys_a = time.monotonic(), system_busy()
        cpu_a = {k: cpu_of(v) for k, v in pids.items()}
        m_a = broker.storage_metrics()
        sleep_until(we)
        t_b, sys_b = time.monotonic(), system_busy()
        cpu_b = {k: cpu_of(v) for k, v in pids.items()}
        m_b = broker.storage_metrics()
        lr = lat.expect("result", 60 + args.duration)
        br = bulk.expect("result", 60 + args.duration)
        listing = None
        if durable is not None and kind != "s3-sink":
            listing = _listing(durable, [lat_topic, bulk_topic])
    finally:
        for w in (lat, bulk):
            if w is not None:
                w.stop()
        broker.stop()
    wall = t_b - t_a
    cores = {k: (cpu_b[k] - cpu_a[k]) / wall for k in pids}
    cores["machine"] = (sys_b - sys_a) / wall
    cores["other"] = cores["machine"] - sum(cores[k] for k in pids)

    def delta(key):
        return m_b.get(key, 0) - m_a.get(key, 0) if m_b else None
    return {"kind": kind, "group": group, "round": rnd, "label": publish_label(group),
            "probe": None if probe is None else probe_summary(probe, ws, we),
            "probe_raw": None if probe is None else probe_raw(probe, lr, ws, we),
            "durable": _redact(durable), "rate": args.rate,
            "window_s": args.duration, "warmup_s": args.warmup,
            "latency_ms": us_percentiles(lr["rtt_us"]), "rtt_us": lr["rtt_us"],
            "acked_in_window": lr["acked_in_window"], "send_errors": lr["errors"],
            "pacer_lag_ms": us_percentiles(lr["lag_us"]), "cap_waits": lr["cap_waits"],
            "stalls": lr["stalls"],
            "bulk": {"mb_per_s": br["bytes_in_window"] / args.duration / 1e6,
                     "errors": br["errors"], "first_error": br["first_error"],
                     "late_batches": br["late_batches"],
                     "call_ms": us_percentiles(br["call_us"])},
            "uploaded_bytes_in_window": delta("danube_storage_uploaded_bytes_total"),
            "uploaded_segments_in_window": delta("danube_storage_uploaded_segments_total"),
            "upload_failures_in_window": delta("danube_storage_upload_failures_total"),
            "storage_metrics_end": m_b, "listing": listing,
            "cpu_window_wall_s": wall, "cores": cores}


def probe_raw(path, lr, ws, we):
    """--probe: the raw material for correlating slow sends with what the broker did: the
    window, the sends' latencies and pacer lags in completion order (= send order: one
    producer's sends are acknowledged in order), the probe's timed events and lags."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return {"ws": ws, "we": we, "rtt_us": lr["rtt_us"], "lag_us": lr.get("lag_us"),
            "events": [e for e in data.get("events", ()) if ws - 1 <= e[0] < we],
            "lags": [x for x in data["lags"] if ws - 1 <= x[0] < we]}


def probe_summary(path, ws, we):
    """What bench.tiered.broker_probe saw inside the window [ws, we] (wall-clock seconds):
    loop lags (wake-ups of a 1 ms sleep that came late) and the slow calls on the loop
    thread by function; totals of every call since start-up."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        return {"error": f"no probe output: {exc!r}"}
    lags = [lag for t, lag in data["lags"] if ws <= t < we]
    slow = {}
    for t, name, dt in data["slow"]:
        if ws <= t < we:
            c = slow.setdefault(name, {"n": 0, "ms": 0.0, "max_ms": 0.0})
            c["n"] += 1
            c["ms"] += dt * 1000
            c["max_ms"] = max(c["max_ms"], dt * 1000)
    return {"lags_over_0.5ms": len(lags),
            "lags_over_1ms": sum(1 for v in lags if v >= 0.001),
            "lags_over_2ms": sum(1 for v in lags if v >= 0.002),
            "lags_over_5ms": sum(1 for v in lags if v >= 0.005),
            "lag_ms_total": sum(lags) * 1000, "lag_max_ms": max(lags, default=0) * 1000,
            "slow_calls": dict(sorted(slow.items(), key=lambda kv: -kv[1]["ms"])),
            "calls_since_start": {k: {"n": v[0], "ms": v[1] * 1000, "max_ms": v[2] * 1000}
                                  for k, v in data["calls"].items()},
            "lag_hist_since_start": data["lag_hist"]}


def _listing(durable, topics):
    """Objects (count, bytes) the durable store holds for each topic, as a check that the
    uploads happened."""
    from danube.storage.tiered.catalog import topic_object_prefix
    store = objstore_servers.store_from_config(durable)
    try:
        out = {}
        for topic in topics:
            infos = store.list(topic_object_prefix(topic))
            out[topic] = {"objects": len(infos), "bytes": sum(i.size for i in infos)}
        return out
    except Exception as exc:  # noqa: BLE001 - informational
        return {"error": repr(exc)}
    finally:
        store.close()


# -- report ------------------------------------------------------------------------------

def _ms(v):
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def storage_table(results):
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["label"], "ERROR"] + [""] * 7)
            continue
        rows.append([r["label"], f"{r['messages']:,}", str(r["segments"]),
                     str(r.get("gets", "-")), f"{r['msgs_per_s']:,.0f}",
                     f"{r['mb_per_s']:,.0f}",
                     f"{r['vs_wal']:.2f}" if "vs_wal" in r else "1",
                     f"{r['get_only_mb_per_s']:,.0f}" if "get_only_mb_per_s" in r else "-",
                     f"{r['upload_mb_per_s']:,.0f}" if "upload_mb_per_s" in r else "-"])
    return format_table(["read from", "msgs", "segs", "GETs", "msgs/s", "MB/s", "vs WAL",
                   "GET-only MB/s", "upload MB/s"], rows)


def local_rate(replays):
    local = [r["msgs_per_s"] for r in replays if r.get("kind") == "local" and "error" not in r]
    return sum(local) / len(local) if local else None


def replay_table(replays):
    base = local_rate(replays)
    rows = []
    for r in replays:
        label = r["label"] + (f" ({r['tag'].split('-')[-1]})" if r.get("kind") == "local"
                              else "")
        if "error" in r:
            rows.append([label, "ERROR"] + [""] * 8)
            continue
        d, c = r["drain"], r["cores"]
        ratio = "-" if r["kind"] == "local" or not base else f"{r['msgs_per_s'] / base:.2f}"
        rows.append([label, f"{r['msgs_per_s']:,.0f}", ratio,
                     _ms(d["first_message_s"] * 1000 if d["first_message_s"] else None),
                     f"{d['seconds']:.2f}", f"{c['broker']:.2f}", f"{c['consumer']:.2f}",
                     f"{c['server']:.2f}" if r["kind"] in CLOUD else "-",
                     f"{max(0.0, c['other']):.2f}",
                     f"{r['history_messages_from_store']:,.0f}"
                     + ("" if d["complete"] and not d["out_of_order_or_wrong"] else " BAD")])
    return format_table(["history in", "msgs/s", "cloud/local", "1st msg ms", "drain s",
                   "broker", "consumer", "server", "other", "from store"], rows)


def publish_table(pubs):
    rows = []
    for r in pubs:
        label = f"#{r['round']} {r['label']}"
        if "error" in r:
            rows.append([label, "ERROR"] + [""] * 10)
            continue
        lat, c = r["latency_ms"], r["cores"]
        up = r["uploaded_bytes_in_window"]
        rows.append([label, f"{r['acked_in_window'] / r['window_s']:,.0f}",
                     _ms(lat.get("p50")), _ms(lat.get("p99")), _ms(lat.get("p99.9")),
                     _ms(lat.get("max")), f"{r['bulk']['mb_per_s']:.1f}",
                     "-" if up is None else
                     f"{up / 1e6:,.0f} ({r['uploaded_segments_in_window']:.0f})",
                     f"{c['broker']:.2f}",
                     f"{c['server']:.2f}" if r["kind"] in CLOUD else "-",
                     f"{max(0.0, c['other']):.2f}", f"{c['machine']:.2f}"])
    return format_table(["broker", "acked/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms",
                   "bulk MB/s", "uploaded MB (segs)", "broker", "server", "other", "total"],
                  rows)


def publish_order(groups, rounds):
    """[(group, round)]: every group once per round, in the rows of a Williams Latin square:
    over len(groups) rounds (2 x len(groups) for an odd count) each group runs once in every
    position, so drift of the machine during the run favours none, and right after every
    other group equally often, so what one run leaves behind (a store still busy, writeback
    of its data) does not always land on the same group. A plain rotation of one order kept
    each group's predecessor fixed: the null sink always ran right after SeaweedFS."""
    n = len(groups)
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(k + r) % n for k in first] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    order = []
    for i in range(rounds):
        order += [(groups[k], i + 1) for k in rows[i % len(rows)]]
    return order


def probe_line(p):
    if "error" in p:
        return p["error"]
    top = ", ".join(f"{name} {c['n']}x {c['ms']:.0f} ms (max {c['max_ms']:.1f})"
                    for name, c in list(p["slow_calls"].items())[:4])
    return (f"loop lag in window: {p['lags_over_1ms']} >1 ms, {p['lags_over_2ms']} >2 ms, "
            f"{p['lags_over_5ms']} >5 ms, max {p['lag_max_ms']:.1f} ms; slow calls: "
            f"{top or 'none'}")


def pooled(pubs, group):
    samples = [v for r in pubs if r.get("group") == group and "error" not in r
               for v in r["rtt_us"]]
    return us_percentiles(samples) if samples else None


BOOTSTRAP = 1000
#: An A/A band wider than this share of the p99 without uploads makes "within the band"
#: meaningless: the machine was too noisy to tell.
NOISY_BAND = 0.2


def publish_stats(pubs, groups):
    """Pooled percentiles per group; the A/A comparison (local#2 vs local#1) and each
    upload group vs the two local groups together, as pooled p99 differences (ms) with a
    bootstrap over rounds: rounds drawn with replacement (the same rounds for every group),
    BOOTSTRAP times, give the 5-95% range of each difference. The A/A noise band is the 95th
    percentile of |A/A difference|: a difference the noise alone makes 1 time in 20."""
    import numpy as np
    out = {"pooled": {g: pooled(pubs, g) for g in groups}, "aa": None, "effects": {}}
    ok = [r for r in pubs if "error" not in r]
    rounds = sorted({r["round"] for r in ok
                     if all(any(q["round"] == r["round"] and q["group"] == g for q in ok)
                            for g in groups)})
    if len(rounds) < 1 or "local#1" not in groups or "local#2" not in groups:
        return out
    data = {g: [np.asarray(next(r["rtt_us"] for r in ok
                                if r["group"] == g and r["round"] == n), dtype=np.int64)
                for n in rounds] for g in groups}

    def p99_ms(group_list, idx):
        x = np.concatenate([data[g][i] for g in group_list for i in idx])
        return float(np.percentile(x, 99, method="inverted_cdf")) / 1000 if len(x) else 0.0

    rng = np.random.default_rng(12345)
    draws = [rng.integers(0, len(rounds), len(rounds)) for _ in range(BOOTSTRAP)]
    everything = list(range(len(rounds)))
    base = ["local#1", "local#2"]

    def diff(b_groups, a_groups):
        point = p99_ms(b_groups, everything) - p99_ms(a_groups, everything)
        boot = np.array([p99_ms(b_groups, d) - p99_ms(a_groups, d) for d in draws])
        return point, boot

    aa, aa_boot = diff(["local#2"], ["local#1"])
    band = float(np.percentile(np.abs(aa_boot), 95))
    out["aa"] = {"rounds": rounds, "p99_diff_ms": aa,
                 "p99_diff_ms_5_95": [float(np.percentile(aa_boot, 5)),
                                      float(np.percentile(aa_boot, 95))],
                 "band_ms": band,
                 "per_round_p99_ms": {g: [p99_ms([g], [i]) for i in everything]
                                      for g in groups}}
    for g in groups:
        if g in base:
            continue
        eff, boot = diff([g], base)
        out["effects"][g] = {"p99_ms": p99_ms([g], everything),
                             "p99_without_ms": p99_ms(base, everything),
                             "p99_diff_ms": eff,
                             "p99_diff_ms_5_95": [float(np.percentile(boot, 5)),
                                                  float(np.percentile(boot, 95))],
                             "within_aa_band": abs(eff) <= band,
                             # The target is "no effect", i.e. no slower: a p99 lower with
                             # uploads than without, by more than the band, is noise the band
                             # underestimated, not an effect of the uploads.
                             "no_worse": eff <= band,
                             "conclusive": abs(eff) > band
                             or band <= NOISY_BAND * p99_ms(base, everything)}
    return out


def publish_noise_lines(st):
    aa = st.get("aa")
    if not aa:
        return ["A/A: needs local#1 and local#2 in at least one complete round"]
    lo, hi = aa["p99_diff_ms_5_95"]
    lines = [f"A/A (local#2 - local#1, no uploads on either): p99 {aa['p99_diff_ms']:+.2f} ms "
             f"(bootstrap over {len(aa['rounds'])} rounds: 5-95% {lo:+.2f}..{hi:+.2f}); "
             f"noise band +-{aa['band_ms']:.2f} ms"]
    for g, e in st["effects"].items():
        lo, hi = e["p99_diff_ms_5_95"]
        lines.append(f"{publish_label(g)} - both local: p99 {e['p99_ms']:.2f} vs "
                     f"{e['p99_without_ms']:.2f} ms = {e['p99_diff_ms']:+.2f} ms (5-95% "
                     f"{lo:+.2f}..{hi:+.2f}): "
                     + ("within" if e["within_aa_band"] else
                        "ABOVE" if e["p99_diff_ms"] > 0 else "below")
                     + " the A/A noise band"
                     + ("" if e["conclusive"] else
                        f" (INCONCLUSIVE: the band is over {NOISY_BAND:.0%} of the p99 "
                        "without uploads; the machine was too noisy)"))
    return lines


def targets(storage, replays, pubs, pstats=None):
    out = []

    def verdict(ok):
        return "met" if ok else "NOT met"
    wal = next((r for r in storage if r.get("kind") == "wal"), None)
    s3 = next((r for r in storage if r.get("kind") == "s3" and "error" not in r), None)
    if wal and s3:
        out.append((f"storage layer: history from SeaweedFS >= {REPLAY_TARGET:g} x "
                    f"WAL.read ({s3['msgs_per_s']:,.0f} vs {wal['msgs_per_s']:,.0f} msgs/s "
                    f"= {s3['vs_wal']:.2f})", verdict(s3["vs_wal"] >= REPLAY_TARGET)))
    base = local_rate(replays)
    s3r = next((r for r in replays if r.get("kind") == "s3" and "error" not in r), None)
    if base and s3r:
        ratio = s3r["msgs_per_s"] / base
        out.append((f"end to end: replay from SeaweedFS >= {REPLAY_TARGET:g} x local WAL "
                    f"replay ({s3r['msgs_per_s']:,.0f} vs {base:,.0f} msgs/s = {ratio:.2f})",
                    verdict(ratio >= REPLAY_TARGET)))
    st = pstats or {}
    for g, e in (st.get("effects") or {}).items():
        # Reported, not judged (the target is the null sink's and the fs store's): a store
        # server on this machine, whose effect includes the store's own work on the broker's
        # CPUs, which a store on other hosts does not do; and the memory store, not a durable
        # tier, whose "upload" is by definition the broker copying every byte into its own
        # RAM, lost at the next restart (tests and development only).
        if publish_kind(g) in objstore_servers.SERVER_CLASSES:
            reference = "the store runs on the broker's CPUs"
        elif publish_kind(g) == "memory":
            reference = "the memory store copies into the broker's own RAM"
        else:
            reference = None
        if reference:
            out.append((f"publish p99 while {publish_label(g)}: {e['p99_ms']:.2f} ms vs "
                        f"{e['p99_without_ms']:.2f} ms without ({e['p99_diff_ms']:+.2f} ms)",
                        f"reference: {reference}"))
            continue
        ups = [r for r in pubs if r.get("group") == g and "error" not in r]
        # Over no window, "in every window" would hold of nothing: MISSING.
        uploaded = bool(ups) and all((r["uploaded_segments_in_window"] or 0) > 0
                                     for r in ups)
        uploads = not publish_kind(g).startswith("local")
        if uploads:
            what = (f"uploads {'happened in every window' if uploaded else 'MISSING'}")
        else:
            what = "no uploads"
        out.append((f"zero effect on publish p99 while {publish_label(g)}: p99 "
                    f"{e['p99_ms']:.2f} ms vs {e['p99_without_ms']:.2f} ms without "
                    f"({e['p99_diff_ms']:+.2f} ms; A/A noise band +-{st['aa']['band_ms']:.2f} "
                    f"ms; {what})",
                    "inconclusive (noisy A/A)" if not e["conclusive"] else
                    "met" if e["no_worse"] and (uploaded or not uploads) else "NOT met"))
    return out


# -- main --------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tiered", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller history, shorter windows")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma-separated subset of: " + ", ".join(SECTIONS))
    ap.add_argument("--messages", type=int, default=None,
                    help="history length for storage and replay (200000; 50000 --quick)")
    ap.add_argument("--size", type=int, default=100, help="payload bytes (100)")
    ap.add_argument("--storage-backends", default="memory,fs,s3,gcs,azblob")
    ap.add_argument("--replay-backends", default="fs,s3,gcs,azblob")
    ap.add_argument("--publish-backends", default="s3,s3-sink",
                    help="stores the uploading brokers of the publish section use, each "
                         "compared with the two local brokers (s3,s3-sink: SeaweedFS, and an "
                         "S3 endpoint that discards what it gets, i.e. the broker's whole "
                         "upload path without the store's own work on this machine; memory "
                         "uploads in-process, fs (a directory on the same disk) from the "
                         "upload child; local-rotating is a local broker sealing "
                         "a segment every second, the cost of rotation alone)")
    ap.add_argument("--segment-mb", type=float, default=8,
                    help="WAL segment size of the storage section (8 MiB)")
    ap.add_argument("--repeats", type=int, default=5, help="timed reads per store (best of)")
    ap.add_argument("--rate", type=int, default=2000, help="paced send()s per second")
    ap.add_argument("--bulk-mbps", type=float, default=5.0,
                    help="bulk producer payload MB/s (5)")
    ap.add_argument("--bulk-size", type=int, default=1024)
    ap.add_argument("--bulk-batch", type=int, default=500)
    ap.add_argument("--duration", type=float, default=None,
                    help="publish window seconds (10; 5 --quick)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="publish warm-up seconds (2; 1.5 --quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="publish rounds; each runs local#1, the --publish-backends and "
                         "local#2 once, in orders balanced for position and predecessor "
                         "(6; 3 --quick)")
    ap.add_argument("--probe", action="store_true",
                    help="publish section: run the brokers under bench.tiered.broker_probe "
                         "(event-loop lag and slow calls on the loop thread, per window; "
                         "costs the broker ~1-2%% of a core, so not for headline figures)")
    ap.add_argument("--store-priority", choices=sorted(STORE_PRIORITY), default="normal",
                    help="CPU priority of the object-store servers")
    ap.add_argument("--dir", default=None, help="parent of the scratch directory")
    ap.add_argument("--json", default=str(RESULTS), help="where to write the results")
    args = ap.parse_args(argv)
    if args.messages is None:
        args.messages = 50_000 if args.quick else 200_000
    if args.duration is None:
        args.duration = 5.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 1.5 if args.quick else 2.0
    if args.rounds is None:
        args.rounds = 3 if args.quick else 6
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if set(sections) - set(SECTIONS):
        ap.error(f"unknown sections: {', '.join(sorted(set(sections) - set(SECTIONS)))}")
    sbackends = [b for b in args.storage_backends.split(",") if b] if "storage" in sections \
        else []
    rbackends = [b for b in args.replay_backends.split(",") if b] if "replay" in sections \
        else []
    pbackends = [b for b in args.publish_backends.split(",") if b] if "publish" in sections \
        else []
    # Two groups without uploads, run like any other, give the A/A noise band.
    pgroups = ["local#1"] + pbackends + ["local#2"]
    for b in sbackends + rbackends + pbackends:
        if b not in LABELS or b in ("wal", "wal_verify", "local"):
            ap.error(f"unknown backend {b!r}")
    for b in sbackends + rbackends:
        if b in PUBLISH_ONLY:
            ap.error(f"{b} is a publish backend only")
    need = sorted({b for b in sbackends + rbackends + pbackends if b in CLOUD})

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    scratch = Path(tempfile.mkdtemp(prefix="danube-tiered-", dir=args.dir))
    logs = scratch / "logs"
    logs.mkdir()
    env_info = {"python": sys.version.split()[0], "platform": platform.platform(),
                "cpus": os.cpu_count(), "loadavg_before": loadavg(), "scratch": str(scratch),
                "started": datetime.datetime.now().isoformat(timespec="seconds")}
    print(f"bench.tiered: {args.messages:,} x {args.size} B history; sections "
          f"{', '.join(sections)}; {os.cpu_count()} CPUs, load "
          f"{' '.join(env_info['loadavg_before'])}; scratch {scratch}", flush=True)
    t_start = time.monotonic()
    storage, replays, pubs = [], [], []
    storage_other = 0.0
    servers = None
    failed = False

    def progress(text):
        print(text, end="", flush=True)

    try:
        if need:
            print(f"starting {', '.join(need)} servers ...", end=" ", flush=True)
            servers = Servers(need, scratch, STORE_PRIORITY[args.store_priority])
            print(", ".join(f"{k} {s.start_s:.1f} s" for k, s in servers.running.items())
                  or "none", flush=True)
            for kind, why in servers.skipped.items():
                print(f"  {kind}: SKIPPED ({why})", flush=True)
        else:
            servers = Servers([], scratch)

        if "storage" in sections:
            print("storage layer (no broker running):", flush=True)
            stores = []
            for kind in sbackends:
                if kind in CLOUD and kind not in servers.running:
                    storage.append({"label": LABELS[kind], "kind": kind,
                                    "error": f"skipped: {servers.skipped.get(kind)}"})
                    continue
                stores.append((LABELS[kind], kind, objstore_servers.store_from_config(
                    durable_for(kind, servers, scratch, "bench-storage"))))
            at_line_start = [True]

            def indented(text):
                if at_line_start[0]:
                    text = "  " + text
                at_line_start[0] = text.endswith("\n")
                progress(text)
            ours = [os.getpid()] + [p for k in servers.running for p in servers.pids(k)]
            t_a, sys_a, cpu_a = time.monotonic(), system_busy(), cpu_of(ours)
            try:
                storage[:0] = storage_bench.run(
                    stores, scratch / "storage-wal", args.messages, args.size,
                    int(args.segment_mb * (1 << 20)), args.repeats, indented)
                wall = time.monotonic() - t_a
                storage_other = ((system_busy() - sys_a) - (cpu_of(ours) - cpu_a)) / wall
            finally:
                for _, _, store in stores:
                    store.close()
                shutil.rmtree(scratch / "storage-wal", ignore_errors=True)

        if "replay" in sections:
            print(f"replay through a broker ({args.messages:,} messages, our client, "
                  f"receive + ack):", flush=True)
            cases = [("local", "local-1")] + [(b, b) for b in rbackends]
            if len(rbackends) > 1:
                cases.append(("local", "local-2"))
            for kind, tag in cases:
                print(f"  {LABELS[kind]} ...", end=" ", flush=True)
                if kind in CLOUD and kind not in servers.running:
                    replays.append({"kind": kind, "tag": tag, "label": LABELS[kind],
                                    "error": f"skipped: {servers.skipped.get(kind)}"})
                    print("skipped", flush=True)
                    continue
                try:
                    r = run_replay(kind, tag, servers, args, scratch, logs)
                except RuntimeError as exc:
                    failed = True
                    replays.append({"kind": kind, "tag": tag, "label": LABELS[kind],
                                    "error": str(exc)})
                    print("ERROR", flush=True)
                    print(str(exc), file=sys.stderr)
                    continue
                replays.append(r)
                d = r["drain"]
                extra = "" if kind == "local" else \
                    (f" (upload wait {r['waits']['uploaded_s']:.1f} s, local delete "
                     f"{r['waits']['local_deleted_s']:.1f} s, "
                     f"{r['history_messages_from_store']:,.0f} msgs from the store)")
                print(f"{r['msgs_per_s']:,.0f} msgs/s, first after "
                      f"{(d['first_message_s'] or 0) * 1000:.0f} ms"
                      f"{'' if d['complete'] else ', INCOMPLETE'}{extra}", flush=True)

        if "publish" in sections:
            print(f"publish latency: send() at {args.rate:,}/s + bulk {args.bulk_mbps:g} "
                  f"MB/s into another topic, {args.warmup:g} s warm-up + {args.duration:g} s "
                  f"window" + (", store servers SCHED_IDLE" if args.store_priority == "idle"
                               else "") + ":", flush=True)
            for group, rnd in publish_order(pgroups, args.rounds):
                kind = publish_kind(group)
                label = publish_label(group)
                print(f"  #{rnd} {label} ...", end=" ", flush=True)
                if kind in CLOUD and kind not in servers.running:
                    pubs.append({"kind": kind, "group": group, "round": rnd, "label": label,
                                 "error": f"skipped: {servers.skipped.get(kind)}"})
                    print("skipped", flush=True)
                    continue
                try:
                    r = run_publish(group, rnd, servers, args, scratch, logs)
                except RuntimeError as exc:
                    failed = True
                    pubs.append({"kind": kind, "group": group, "round": rnd, "label": label,
                                 "error": str(exc)})
                    print("ERROR", flush=True)
                    print(str(exc), file=sys.stderr)
                    continue
                pubs.append(r)
                lat = r["latency_ms"]
                up = r["uploaded_bytes_in_window"]
                print(f"p50 {_ms(lat.get('p50'))} p99 {_ms(lat.get('p99'))} ms, "
                      f"{r['acked_in_window'] / r['window_s']:,.0f} acked/s, bulk "
                      f"{r['bulk']['mb_per_s']:.1f} MB/s"
                      + ("" if up is None else
                         f", uploaded {up / 1e6:.0f} MB in "
                         f"{r['uploaded_segments_in_window']:.0f} segments in the window"),
                      flush=True)
                if r["probe"] is not None:
                    print("      " + probe_line(r["probe"]), flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the processes", file=sys.stderr)
        reap_all()
        if servers is not None:
            servers.close()
        shutil.rmtree(scratch, ignore_errors=True)
        return 130
    finally:
        reap_all()
        if servers is not None:
            servers.close()
    env_info["loadavg_after"] = loadavg()
    env_info["total_s"] = time.monotonic() - t_start

    tables = {}
    pstats = publish_stats(pubs, pgroups) if pubs else {}
    print()
    if storage:
        tables["storage"] = storage_table(storage)
        print(f"storage layer: {args.messages:,} x {args.size} B read sequentially, best of "
              f"{args.repeats}")
        print(tables["storage"])
        print(textwrap.fill(
            f"WAL.read(offset, {storage_bench.READ_BATCH}) loops over the sealed segments "
            "(mmap, page cache) vs a HistoryCursor (the broker's reader of durable history) "
            "over the descriptors upload_segment() returned for the same segments "
            f"({args.segment_mb:g} MiB each), read({storage_bench.READ_BATCH}) at a time: "
            f"ranged GETs of up to {storage_bench.READ_CHUNK >> 20} MiB, "
            f"{storage_bench.MAX_IN_FLIGHT} in flight, frames CRC-checked as they are read; "
            "MB/s of segment bytes (frames with their 16-byte headers); GET-only MB/s = the "
            "same bytes fetched with plain ranged GETs one after another and not decoded; "
            "upload MB/s = upload_segment() of all of them.",
            100))
        print()
    if replays:
        tables["replay"] = replay_table(replays)
        print(f"replay through a broker: {args.messages:,} x {args.size} B, one reliable "
              f"subscription drained with receive() + ack()")
        print(tables["replay"])
        print(textwrap.fill(
            "msgs/s = messages / (subscribe() call to the last message received); "
            "cloud/local = msgs/s / the mean of the local WAL runs; broker/consumer/server = "
            "CPU cores of each during the drain (server = the object-store server's "
            "processes); other = the rest of the machine; from store = messages the broker "
            "read from the durable store (danube_storage_history_messages_total).", 100))
        print()
    if pubs:
        tables["publish"] = publish_table(pubs)
        print(f"publish latency: reliable send() paced {args.rate:,}/s (open loop, 100 B) "
              f"+ bulk send_many {args.bulk_mbps:g} MB/s ({args.bulk_batch} x "
              f"{args.bulk_size} B) into another topic")
        print(tables["publish"])
        print(textwrap.fill(
            "p50..max = send() ack latency of the calls started in the window; uploaded = "
            "danube_storage_uploaded_bytes_total / _segments_total growth inside the window; "
            "broker/server/other/total = CPU cores (server = SeaweedFS's processes).", 100))
        print(f"pooled over {args.rounds} round(s):")
        for group, a in pstats["pooled"].items():
            if a:
                print(f"  {publish_label(group)}: p50 {_ms(a['p50'])} / p99 {_ms(a['p99'])} / "
                      f"p99.9 {_ms(a['p99.9'])} ms ({a['n']:,} sends)")
        for line in publish_noise_lines(pstats):
            print(line)
        print()
    busy = [f"the storage section ({storage_other:.2f})"] if storage_other > 0.25 else []
    busy += [f"replay {r['label']} ({r['cores']['other']:.2f})" for r in replays
            if "error" not in r and r["cores"]["other"] > 0.25]
    busy += [f"publish {r['label']} #{r['round']} ({r['cores']['other']:.2f})"
             for r in pubs if "error" not in r and r["cores"]["other"] > 0.25]
    if busy:
        print(textwrap.fill(
            "NOTE: other processes used CPU during " + ", ".join(busy) + " cores; those "
            "figures are depressed/noisy (load avg before/after: "
            + " ".join(env_info["loadavg_before"]) + " / "
            + " ".join(env_info["loadavg_after"]) + ").", 100))
        print()
    checks = targets(storage, replays, pubs, pstats)
    if checks:
        print("targets:")
        for text, verdict in checks:
            print(f"  [{verdict}] {text}")
    print(f"\ntotal {env_info['total_s']:.0f} s")
    pooled_ms = pstats
    for r in pubs:
        r.pop("rtt_us", None)
    out = {"config": {k: v for k, v in vars(args).items() if k != "json"},
           "environment": env_info, "storage_other_cores": storage_other,
           "servers": {"skipped": servers.skipped if servers else {}},
           "storage": storage, "replay": replays, "publish": pubs,
           "publish_stats": pooled_ms,
           "targets": [{"target": t, "verdict": v} for t, v in checks],
           "summary_tables": tables}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    if failed:
        print(f"process logs kept in {logs}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0
