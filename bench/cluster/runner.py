"""`python -m bench.cluster`: cluster mode on etcd, with real processes (see bench/README.md).

Sections, each against a peer measured in the same run:

- ``failover``: a producer publishes to a reliable topic; the broker that owns it is killed
  (SIGKILL); the time until a publish is acknowledged again (by the new owner). Peer: the
  same producer against a standalone broker that is killed and started again at once.
- ``lookup``: TopicLookup latency on a cluster broker, for a topic it owns (Connect) and one
  another broker owns (Redirect). Peer: a standalone broker.
- ``assign``: 10,000 topics marked unassigned at once in etcd; the time until the leader has
  placed them all on 3 brokers, and the coefficient of variation of the topics per broker.
  Peer: the time to write the 10,000 markers themselves (etcd's own write cost).
- ``ingress``: proxy mode behind a real HAProxy (tests/support/ingress_failover.py): the
  official Python producer, given only the ingress, publishes to a reliable topic every
  5 ms while the owner is killed (SIGKILL); the time until its first acknowledged publish
  after the kill, against twice the lease (the target); what the consumers lost. Peer: the
  ``failover`` section (a producer that asks every broker, no ingress), run with it.
- ``roll``: a rolling restart (`danube cluster roll`) of 3 brokers from `danube cluster up`
  under our and the official client's producers and consumers on a 6-partition reliable
  topic (tests/support/rolling_restart.py): per restarted broker the longest gap between
  acknowledged publishes, the publish p99 during the roll against the same producers'
  before it (the peer), the roll's total time, and what the consumers lost (nothing).
- ``publish``: aggregate batched reliable publish (1000 x 100 B per batch, fsync before the
  ack) to 6 reliable topics from 3 load processes, on a 3-broker cluster and on a 1-broker
  cluster of the same etcd and configuration; rounds alternate the order.
- ``defaults``: the same load (4 reliable topics, 2 load processes) on what
  `danube cluster up` starts with its defaults (2 brokers, the write buffer on a Redis
  primary and replica, the S3 tier on SeaweedFS: nothing acknowledged is lost with a
  broker) against one standalone broker (fsync before the ack, nothing else) on the same
  machine; rounds alternate the order. Target: >= 0.7x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import grpc  # noqa: E402

from broker_process import BrokerProcess  # noqa: E402
from cluster_clients import ResilientProducer  # noqa: E402
from cluster_process import ClusterBrokers  # noqa: E402
from danube.metadata import keys  # noqa: E402
from danube.metadata.etcd import EtcdStore  # noqa: E402
from danube.proto import DanubeApi_pb2 as pb  # noqa: E402
from etcd_process import EtcdProcess  # noqa: E402
from grpc_calls import create_producer, unary  # noqa: E402
from ingress_failover import ingress_cluster, official_through_owner_kill  # noqa: E402
from rolling_restart import roll_under_load  # noqa: E402


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.005)


def lookup(addr, topic):
    with grpc.insecure_channel(addr) as ch:
        return unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=5)


def served_again_after_kill(cluster, topic, kill, producer):
    acked = len(producer.acked)
    wait(lambda: len(producer.acked) >= acked + 20, 30, "publishing")
    killed = kill()
    wait(lambda: producer.ack_times and producer.ack_times[-1] > killed, 60,
         "publishing after the kill")
    return next(t for t in producer.ack_times if t > killed) - killed


def bench_failover(workdir, runs, lease):
    etcd = EtcdProcess(workdir / "etcd").start()
    cluster = ClusterBrokers(etcd, workdir / "cluster", lease=lease)
    out = {"cluster": [], "standalone_restart": [], "lost": 0}
    try:
        cluster.start(3)
        for run in range(runs):
            topic = f"/default/failover-{run}"
            producer = ResilientProducer(cluster, topic)
            producer.start()
            try:
                wait(lambda: producer.acked, 30, "first publish")
                owner = cluster.by_url(lookup(cluster.brokers[0].client_addr,
                                              topic).broker_url)
                out["cluster"].append(served_again_after_kill(
                    cluster, topic, lambda: cluster.kill(owner), producer))
            finally:
                producer.stop()
            cluster.restart(owner)
            print(f"  failover run {run}: {out['cluster'][-1]:.2f}s", flush=True)
    finally:
        cluster.stop()
        etcd.stop()
    # The peer: one standalone broker, killed and started again by a supervisor at once.
    holder = _Standalone(workdir / "standalone")
    try:
        for run in range(runs):
            topic = f"/default/restart-{run}"
            producer = ResilientProducer(holder, topic)
            producer.start()
            try:
                wait(lambda: producer.acked, 30, "first publish")
                out["standalone_restart"].append(served_again_after_kill(
                    holder, topic, holder.kill_and_restart, producer))
            finally:
                producer.stop()
            print(f"  standalone restart run {run}: {out['standalone_restart'][-1]:.2f}s",
                  flush=True)
    finally:
        holder.stop()
    return out


class _Standalone:
    """One standalone broker on fixed ports, restarted by kill_and_restart (what a process
    supervisor does), looking like a ClusterBrokers to the resilient clients."""

    def __init__(self, workdir):
        from ports import free_port
        self.workdir = workdir
        self.addr = f"127.0.0.1:{free_port()}"
        self.broker = self._start()

    def _start(self):
        broker = BrokerProcess(data_dir=self.workdir)
        broker.args += ["--broker-addr", self.addr]
        return broker.start()

    @property
    def live(self):
        return [self.broker] if self.broker.proc.poll() is None else []

    def kill_and_restart(self):
        self.broker.proc.kill()
        killed = time.monotonic()
        self.broker.proc.wait()
        self.broker = self._start()
        return killed

    def stop(self):
        self.broker.stop()


def bench_lookup(workdir, n):
    etcd = EtcdProcess(workdir / "etcd").start()
    cluster = ClusterBrokers(etcd, workdir / "cluster")
    standalone = BrokerProcess(data_dir=workdir / "standalone").start()
    out = {}
    try:
        cluster.start(3)
        topic = "/default/looked-up"
        with grpc.insecure_channel(cluster.brokers[0].client_addr) as ch:
            try:
                create_producer(ch, topic, "p")
            except grpc.RpcError:
                pass
        wait(lambda: _owner(cluster, topic), 10, "placement")
        owner = cluster.by_url(_owner(cluster, topic))
        other = next(b for b in cluster.brokers if b is not owner)
        with grpc.insecure_channel(standalone.client_addr) as ch:
            create_producer(ch, topic, "p")
        for name, addr in (("cluster_connect", owner.client_addr),
                           ("cluster_redirect", other.client_addr),
                           ("standalone_connect", standalone.client_addr)):
            out[name] = _lookup_latencies(addr, topic, n)
    finally:
        standalone.stop()
        cluster.stop()
        etcd.stop()
    return out


def _owner(cluster, topic):
    try:
        return lookup(cluster.brokers[0].client_addr, topic).broker_url
    except grpc.RpcError:
        return None


def _lookup_latencies(addr, topic, n):
    with grpc.insecure_channel(addr) as ch:
        call = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)
        request = pb.TopicLookupRequest(request_id=1, topic=topic)
        for _ in range(50):
            call(request, timeout=5)
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            call(request, timeout=5)
            samples.append((time.perf_counter() - started) * 1e6)
    return {"p50_us": pct(samples, 50), "p99_us": pct(samples, 99),
            "mean_us": statistics.fmean(samples), "n": n}


def bench_assign(workdir, topics, strategy, lease):
    etcd = EtcdProcess(workdir / "etcd").start()
    cluster = ClusterBrokers(etcd, workdir / "cluster", strategy=strategy, lease=lease)
    try:
        cluster.start(3)
        return asyncio.run(_assign(etcd, cluster, topics))
    finally:
        cluster.stop()
        etcd.stop()


async def _assign(etcd, cluster, count):
    names = [f"/default/t{i:05d}" for i in range(count)]
    async with await EtcdStore.open([etcd.endpoint]) as store:
        # The topics themselves (as a creation writes them), then the markers, timed.
        for i in range(0, count, 100):
            chunk = names[i:i + 100]
            await store.put_many({keys.namespace_topic(t): None for t in chunk})
            await store.put_many({keys.topic_delivery(t): "NonReliable" for t in chunk})
        started = time.monotonic()
        for i in range(0, count, 100):
            await store.put_many({keys.cluster_unassigned(t): None for t in names[i:i + 100]})
        written = time.monotonic() - started
        while True:
            assigned = [k for k in await store.keys(keys.CLUSTER_BROKERS)
                        if k.count("/") == 5]
            if len(assigned) >= count:
                break
            await asyncio.sleep(0.25)
        placed = time.monotonic() - started
        per_broker = {}
        for key in assigned:
            broker = key.split("/")[3]
            per_broker[broker] = per_broker.get(broker, 0) + 1
        counts = list(per_broker.values())
        mean = statistics.fmean(counts)
        return {"topics": count, "markers_written_s": written, "all_placed_s": placed,
                "per_broker": per_broker,
                "cv": statistics.pstdev(counts) / mean if mean else 0.0}


def bench_publish(workdir, rounds, duration, topics, loaders, producers):
    from bench._proc import REPO, popen, proc_cpu, repo_env
    names = [f"/default/pub-{i}" for i in range(topics)]
    shares = [",".join(names[i::loaders]) for i in range(loaders)]
    out = {"1": [], "3": []}
    for r in range(rounds):
        for n in ((1, 3) if r % 2 == 0 else (3, 1)):
            etcd = EtcdProcess(workdir / f"etcd-{r}-{n}").start()
            cluster = ClusterBrokers(etcd, workdir / f"cluster-{r}-{n}")
            try:
                cluster.start(n)
                pids = [b.pid for b in cluster.brokers]
                cpu0, t0 = sum(proc_cpu(p) for p in pids), time.monotonic()
                procs = [popen([sys.executable, "-P", "-m", "bench.cluster.publish_worker",
                                "--url", f"http://{cluster.brokers[i % n].client_addr}",
                                "--topics", share, "--producers", str(producers),
                                "--duration", str(duration)],
                               stdout=subprocess.PIPE, text=True, env=repo_env(), cwd=REPO)
                         for i, share in enumerate(shares)]
                results = [json.loads(p.communicate(timeout=duration + 120)[0]) for p in procs]
                cpu = (sum(proc_cpu(p) for p in pids) - cpu0) / (time.monotonic() - t0)
                placed = {}
                for t in names:
                    owner = _owner(cluster, t)
                    placed[owner] = placed.get(owner, 0) + 1
                rate = sum(x["acked"] / x["seconds"] for x in results)
                out[str(n)].append({"msgs_per_s": rate, "broker_cores": cpu,
                                    "errors": sum(x["errors"] for x in results),
                                    "topics_per_broker": sorted(placed.values())})
                print(f"  round {r} {n} broker(s): {rate:,.0f} msgs/s, brokers used "
                      f"{cpu:.2f} cores, topics per broker {sorted(placed.values())}",
                      flush=True)
            finally:
                cluster.stop()
                etcd.stop()
    return out


def _publish_load(urls, names, loaders, producers, duration):
    from bench._proc import REPO, popen, repo_env
    shares = [",".join(names[i::loaders]) for i in range(loaders)]
    procs = [popen([sys.executable, "-P", "-m", "bench.cluster.publish_worker",
                    "--url", urls, "--topics", share, "--producers", str(producers),
                    "--duration", str(duration)],
                   stdout=subprocess.PIPE, text=True, env=repo_env(), cwd=REPO)
             for share in shares]
    results = [json.loads(p.communicate(timeout=duration + 180)[0]) for p in procs]
    return (sum(x["acked"] / x["seconds"] for x in results),
            sum(x["errors"] for x in results))


def _cores(pids, work):
    """(result of ``work()``, {name: cores each process tree used meanwhile})."""
    from bench._proc import tree_cpu
    before = {name: tree_cpu(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    result = work()
    seconds = time.monotonic() - t0
    return result, {name: round((tree_cpu(pid) - before[name]) / seconds, 2)
                    for name, pid in pids.items()}


def bench_defaults(workdir, rounds, duration, topics=4, loaders=2, producers=2):
    from bench._proc import REPO, repo_env
    out = {"cluster_up": [], "standalone": []}
    danube = [sys.executable, "-P", "-m", "danube", "cluster"]
    for r in range(rounds):
        for kind in (("cluster_up", "standalone") if r % 2 == 0
                     else ("standalone", "cluster_up")):
            names = [f"/default/defaults-{r}-{i}" for i in range(topics)]
            if kind == "standalone":
                broker = BrokerProcess(data_dir=workdir / f"standalone-{r}").start()
                try:
                    (rate, errors), cores = _cores({"broker": broker.pid}, lambda: _publish_load(
                        f"http://{broker.client_addr}", names, loaders, producers, duration))
                finally:
                    broker.stop()
            else:
                directory = workdir / f"cluster-{r}"
                up = subprocess.run([*danube, "up", "--dir", str(directory), "--free-ports"],
                                    capture_output=True, text=True, env=repo_env(), cwd=REPO,
                                    timeout=300)
                if up.returncode:
                    raise RuntimeError(f"danube cluster up failed: {up.stderr[-2000:]}")
                try:
                    state = json.loads((directory / "cluster.json").read_text())
                    urls = ",".join(p["broker_url"] for p in state["processes"]
                                    if p.get("broker_url"))
                    pids = {p["name"]: p["pid"] for p in state["processes"]}
                    (rate, errors), cores = _cores(pids, lambda: _publish_load(
                        urls, names, loaders, producers, duration))
                finally:
                    subprocess.run([*danube, "down", "--dir", str(directory), "--purge"],
                                   capture_output=True, env=repo_env(), cwd=REPO,
                                   timeout=300)
            out[kind].append({"msgs_per_s": rate, "errors": errors, "cores": cores})
            print(f"  round {r} {kind}: {rate:,.0f} msgs/s ({errors} errors); cores: "
                  + ", ".join(f"{n} {c:.2f}" for n, c in cores.items()), flush=True)
    return out


def bench_ingress(workdir, runs, lease):
    out = []
    for run in range(runs):
        base = workdir / str(run)
        dirs = [base / d for d in ("etcd", "haproxy", "cluster", "work")]
        for d in dirs:
            d.mkdir(parents=True)
        with ingress_cluster(*dirs[:3], lease=lease) as cluster:
            r = official_through_owner_kill(cluster, f"/default/bench-ingress-{run}", dirs[3])
        out.append({"served_again": r["served_again"], "acked": len(r["acked"]),
                    "lost": len(r["lost"]), "official_missing": r["official_missing"],
                    "errors": r["errors"]})
    return out


def bench_roll(workdir, runs, pause, official_backoff_ms=None):
    retry = None
    if official_backoff_ms:
        retry = {"max_retries": 5, "base_backoff_ms": official_backoff_ms,
                 "max_backoff_ms": 10 * official_backoff_ms}
    out = []
    for run in range(runs):
        (workdir / str(run)).mkdir(parents=True)
        figures = roll_under_load(workdir / str(run), f"/default/bench-roll-{run}",
                                  pause=pause, official_retry=retry)
        figures.pop("roll_output")
        for consumer in figures["consumers"].values():
            consumer["lost"] = len(consumer["lost"])
            consumer["stored_twice"] = len(consumer["stored_twice"])
        out.append(figures)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.cluster")
    parser.add_argument("--sections", default="failover,lookup,assign,publish")
    parser.add_argument("--runs", type=int, default=10, help="failover runs (default 10)")
    parser.add_argument("--lease", type=float, default=3, help="lease TTL seconds (3)")
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--strategy", default="fair")
    # 20,000 metadata writes and 10,000 topic loads on a small shared machine can hold
    # etcd's commits up for seconds: a 3 s lease would fence the brokers meanwhile.
    parser.add_argument("--assign-lease", type=float, default=10,
                        help="lease TTL seconds of the assign section (10)")
    parser.add_argument("--publish-rounds", type=int, default=3)
    parser.add_argument("--publish-duration", type=float, default=10)
    parser.add_argument("--ingress-runs", type=int, default=5)
    parser.add_argument("--roll-runs", type=int, default=3)
    parser.add_argument("--roll-pause", type=float, default=6,
                        help="seconds between a broker's drain and its stop (6)")
    parser.add_argument("--official-backoff-ms", type=int, default=None,
                        help="the official producer's base_backoff_ms in the roll (its "
                             "ProducerOptions; default: the client's own, 200 ms)")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "cluster.json"))
    args = parser.parse_args(argv)
    sections = args.sections.split(",")
    results = {"loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        tmp = Path(tmp)
        if "failover" in sections:
            print("failover (kill -9 of the owner, then the first acknowledged publish):")
            r = results["failover"] = bench_failover(tmp / "failover", args.runs, args.lease)
            for name in ("cluster", "standalone_restart"):
                print(f"  {name}: p50 {statistics.median(r[name]):.2f}s "
                      f"max {max(r[name]):.2f}s over {len(r[name])} runs")
        if "lookup" in sections:
            print("lookup latency:")
            r = results["lookup"] = bench_lookup(tmp / "lookup", args.lookups)
            for name, v in r.items():
                print(f"  {name}: p50 {v['p50_us']:.0f} us p99 {v['p99_us']:.0f} us")
        if "assign" in sections:
            print(f"assignment of {args.topics} topics over 3 brokers ({args.strategy}):")
            r = results["assign"] = bench_assign(tmp / "assign", args.topics, args.strategy,
                                                 args.assign_lease)
            print(f"  markers written in {r['markers_written_s']:.2f}s; all placed after "
                  f"{r['all_placed_s']:.2f}s; per broker {sorted(r['per_broker'].values())}; "
                  f"CV {r['cv']:.4f}")
        if "publish" in sections:
            print("aggregate reliable publish, 3 brokers against 1 (6 topics, 3 load "
                  "processes):")
            r = results["publish"] = bench_publish(tmp / "publish", args.publish_rounds,
                                                   args.publish_duration, 6, 3, 2)
            one = statistics.median(x["msgs_per_s"] for x in r["1"])
            three = statistics.median(x["msgs_per_s"] for x in r["3"])
            print(f"  median: 1 broker {one:,.0f} msgs/s, 3 brokers {three:,.0f} msgs/s, "
                  f"{three / one:.2f}x")
        if "defaults" in sections:
            print("batched reliable publish, `danube cluster up`'s defaults against one "
                  "standalone broker (4 topics, 2 load processes):")
            r = results["defaults"] = bench_defaults(tmp / "defaults", args.publish_rounds,
                                                     args.publish_duration)
            alone = statistics.median(x["msgs_per_s"] for x in r["standalone"])
            cluster = statistics.median(x["msgs_per_s"] for x in r["cluster_up"])
            ratio = cluster / alone
            print(f"  median: standalone {alone:,.0f} msgs/s, cluster up {cluster:,.0f} "
                  f"msgs/s: {ratio:.2f}x (target >= 0.7x: "
                  f"{'met' if ratio >= 0.7 else 'NOT met'})")
        if "ingress" in sections:
            print(f"official producer behind HAProxy, kill -9 of the owner (lease "
                  f"{args.lease:g} s, target {2 * args.lease:g} s):")
            runs = results["ingress"] = bench_ingress(tmp / "ingress", args.ingress_runs,
                                                      args.lease)
            times = [r["served_again"] for r in runs]
            print(f"  first acked publish after the kill: p50 {statistics.median(times):.2f}s "
                  f"max {max(times):.2f}s over {len(times)} runs; lost "
                  f"{sum(r['lost'] for r in runs)}, official consumer missing "
                  f"{sum(r['official_missing'] for r in runs)}")
        if "roll" in sections:
            print("rolling restart of 3 brokers under load (6 partitions, ours and the "
                  "official client):")
            runs = results["roll"] = bench_roll(tmp / "roll", args.roll_runs, args.roll_pause,
                                                args.official_backoff_ms)
            for i, r in enumerate(runs):
                for name, p in r["producers"].items():
                    gaps = ", ".join(f"{b} {g:.2f}s" for b, g in p["gaps"].items())
                    print(f"  run {i} {name}: longest publish gap per broker {gaps}; "
                          f"p99 {p['p99_before_ms']:.1f} ms before, "
                          f"{p['p99_during_ms']:.1f} ms during; {p['acked']} acked")
                lost = {n: c["lost"] for n, c in r["consumers"].items()}
                twice = {n: c["stored_twice"] for n, c in r["consumers"].items()}
                print(f"  run {i}: roll took {r['roll_seconds']:.1f} s; lost {lost}, "
                      f"stored twice {twice}")
    results["loadavg_after"] = os.getloadavg()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"load average before {results['loadavg_before']}, after {results['loadavg_after']}")
    return 0
