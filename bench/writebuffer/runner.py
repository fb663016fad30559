"""`python -m bench.writebuffer`: reliable publish with the write buffer
(``storage.write_buffer`` on a real redis-server primary with one replica, ``WAIT 1``)
against the same broker without it, in the same run (see bench/README.md).

Each round starts a standalone broker of each kind (order alternating), both in durability
``always`` (fsync before the ack), then measures:

- ``batched``: aggregate acknowledged msgs/s of reliable producers sending 1000 x 100 B
  batches back to back (bench.cluster's publish worker); target: with >= 0.5x without;
- ``send``: p50/p99 ack latency of unbatched ``send()`` calls, one at a time.

With ``--uploaded``, a third broker in durability ``uploaded`` (acknowledged once in S3 on a
real SeaweedFS, no write buffer) is measured the same way: its throughput and ack latency.

Failover time with recovery from the buffer is measured by
tests/e2e/test_cluster_write_buffer.py (it prints the time until publishing resumed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))

from broker_process import BrokerProcess  # noqa: E402
from redis_servers import RedisPair  # noqa: E402

BUFFER = """\
storage:
  write_buffer:
    backend: redis
    endpoints: ["{url}"]
    wait_replicas: 1
    wait_timeout_ms: 2000
    on_wait_timeout: fail
"""


UPLOADED = """\
storage:
  mode: object_store
  durable: {durable}
  wal:
    durability: uploaded
"""


def start_broker(workdir: Path, name: str, redis_url: str | None,
                 durable: dict | None = None) -> BrokerProcess:
    d = workdir / name
    d.mkdir(parents=True)
    args = []
    text = BUFFER.format(url=redis_url) if redis_url else \
        UPLOADED.format(durable=json.dumps(durable)) if durable else None
    if text:
        cfg = d / "broker.yml"
        cfg.write_text(text)
        args = ["--config-file", str(cfg)]
    return BrokerProcess(*args, data_dir=d / "data").start()


def run_worker(module, *args, timeout):
    from bench._proc import REPO, repo_env

    out = subprocess.run([sys.executable, "-P", "-m", module, *args], capture_output=True,
                         text=True, env=repo_env(), cwd=REPO, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{module} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(broker: BrokerProcess, tag: str, duration: float, n: int) -> dict:
    url = f"http://127.0.0.1:{broker.client_port}"
    batched = run_worker("bench.cluster.publish_worker", "--url", url, "--topics",
                         f"/default/wb-{tag}-a,/default/wb-{tag}-b", "--producers", "2",
                         "--duration", str(duration), timeout=duration + 120)
    send = run_worker("bench.writebuffer.latency_worker", "--url", url, "--topic",
                      f"/default/wb-{tag}-lat", "--n", str(n), timeout=600)
    return {"batched_msgs_s": batched["acked"] / batched["seconds"],
            "batched_errors": batched["errors"], **send}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.writebuffer", description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("--appendonly", action="store_true",
                    help="run both redis-servers with an append-only file")
    ap.add_argument("--uploaded", action="store_true",
                    help="also a broker in durability uploaded on a real SeaweedFS")
    args = ap.parse_args(argv)
    results = {"with": [], "without": []}
    kinds = ["with", "without"]
    seaweed = durable = None
    with tempfile.TemporaryDirectory(prefix="bench-wb-") as tmp:
        workdir = Path(tmp)
        if args.uploaded:
            from objstore_servers import SeaweedFS, durable_config
            seaweed = SeaweedFS(workdir / "seaweedfs")
            seaweed.start()
            durable = durable_config("s3", seaweed, name="bench-uploaded",
                                     upload_interval_seconds=300)
            results["uploaded"] = []
            kinds.append("uploaded")
        # What the ack waits for is the replica's copy (WAIT 1), so no append-only file:
        # with one, each Redis also writes every entry to its disk.
        redis = RedisPair(str(workdir / "redis"), replicas=1, appendonly=args.appendonly)
        try:
            for r in range(args.rounds):
                order = kinds if r % 2 == 0 else kinds[::-1]
                for kind in order:
                    broker = start_broker(workdir, f"{kind}-{r}",
                                          redis.url if kind == "with" else None,
                                          durable if kind == "uploaded" else None)
                    try:
                        results[kind].append(measure(broker, f"{kind}{r}", args.duration,
                                                     args.sends))
                    finally:
                        broker.stop()
                    print(f"round {r} {kind:7}: {results[kind][-1]}", flush=True)
        finally:
            redis.stop()
            if seaweed is not None:
                seaweed.close()
    med = {k: {m: statistics.median(x[m] for x in v) for m in
               ("batched_msgs_s", "p50_us", "p99_us")} for k, v in results.items()}
    ratio = med["with"]["batched_msgs_s"] / med["without"]["batched_msgs_s"]
    print()
    print("| median of rounds | batched msgs/s | send() p50 us | send() p99 us |")
    print("|---|---|---|---|")
    for k in kinds[::-1] if args.uploaded else ("without", "with"):
        m = med[k]
        label = "durability uploaded (S3)" if k == "uploaded" else f"{k} write buffer"
        print(f"| {label} | {m['batched_msgs_s']:,.0f} | {m['p50_us']:,.0f} | "
              f"{m['p99_us']:,.0f} |")
    print(f"\nbatched with / without: {ratio:.2f}x (target >= 0.5x): "
          f"{'met' if ratio >= 0.5 else 'NOT met'}")
    return 0
