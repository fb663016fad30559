"""A cluster of real `danube broker --mode cluster` processes on one real etcd, for the cluster
tests and benchmarks.

Every broker gets its own data directory and free ports, and shares with the others the
durable tier (``storage.mode: shared_fs``) and the WAL root, the way brokers of a cluster
share a network file system: a topic that moves to another broker continues from the very
WAL its previous owner acknowledged from (docs/cluster.md). Brokers are stopped (or
killed) at teardown; the etcd belongs to the caller.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from pathlib import Path

from broker_process import BrokerProcess
from etcd_process import EtcdProcess

BROKER_ID = re.compile(r"broker (\d+) joined the cluster")

CONFIG = """\
cluster_name: test-cluster
meta_store:
  etcd_endpoints: ["{etcd}"]
  lease_ttl_seconds: {lease}
  etcd_tls: {etcd_tls}
  etcd_auth: {etcd_auth}
load_manager:
  assignment_strategy: {strategy}
  load_report_interval_seconds: 1
  rebalancing: {rebalancing}
{storage}
{extra}
"""

SHARED_STORAGE = """\
storage:
  mode: shared_fs
  failover: shared_wal_root
  local_wal_root: "{shared}/wal"
  durable: {{backend: fs, root: "{shared}/durable", upload_interval_seconds: 1}}
"""


class ClusterBrokers:
    def __init__(self, etcd, workdir, *, lease: float = 3, strategy: str = "fair",
                 rebalancing: dict | None = None, storage: str | None = None,
                 etcd_tls: dict | None = None, etcd_auth: dict | None = None,
                 extra_config: str = ""):
        """``rebalancing``: the ``load_manager.rebalancing`` section (default: off);
        ``storage``: the whole ``storage:`` section (default: everything shared);
        ``etcd_tls``: ``meta_store.etcd_tls`` (default: none, http); ``etcd_auth``:
        ``meta_store.etcd_auth`` (default: none); ``extra_config``: more top-level YAML
        (``auth:``, ``admin_tls:``)."""
        self.etcd = etcd
        self.workdir = Path(workdir)
        self.shared = self.workdir / "shared"
        self.shared.mkdir(parents=True, exist_ok=True)
        self.config = self.workdir / "broker.yml"
        self.config.write_text(CONFIG.format(
            etcd=etcd.endpoint, lease=lease, strategy=strategy,
            etcd_tls=json.dumps(etcd_tls), etcd_auth=json.dumps(etcd_auth),
            rebalancing=json.dumps(rebalancing or {"enabled": False}),
            storage=storage or SHARED_STORAGE.format(shared=self.shared), extra=extra_config))
        self.brokers: list[BrokerProcess] = []

    def add(self, name: str | None = None, *extra, timeout: float = 30) -> BrokerProcess:
        """Start a broker (``name`` picks its data directory: the same name, the same
        broker id)."""
        name = name or f"b{len(self.brokers)}"
        broker = BrokerProcess(data_dir=self.workdir / name)
        broker.name = name
        broker.args += ["--mode", "cluster", "--config-file", str(self.config),
                        "--prom-exporter", "127.0.0.1:0", *extra]
        self.brokers.append(broker)
        broker.start(timeout)
        match = BROKER_ID.search(broker.log())
        broker.broker_id = match.group(1) if match else None
        return broker

    def start(self, n: int) -> ClusterBrokers:
        for _ in range(n):
            self.add()
        return self

    @property
    def live(self) -> list[BrokerProcess]:
        return [b for b in self.brokers if b.proc is not None and b.proc.poll() is None]

    def by_url(self, broker_url: str) -> BrokerProcess:
        port = int(broker_url.rsplit(":", 1)[1])
        return next(b for b in self.brokers if b.client_port == port)

    def restart(self, broker: BrokerProcess) -> BrokerProcess:
        """Start a stopped or killed broker again, with its data directory and id."""
        self.brokers.remove(broker)
        return self.add(broker.name)

    def kill(self, broker: BrokerProcess) -> float:
        """SIGKILL; returns the monotonic time of the kill."""
        broker.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        broker.proc.wait()
        return killed

    def stop(self) -> None:
        for broker in self.brokers:
            try:
                broker.stop()
            except Exception:  # noqa: BLE001 - a broker that will not stop is killed
                if broker.proc is not None and broker.proc.poll() is None:
                    broker.proc.kill()
                    broker.proc.wait()


@contextlib.contextmanager
def etcd_cluster(tmp_path_factory, n: int = 3, **options):
    """A fresh etcd and ``n`` brokers on it (ClusterBrokers ``options``), all stopped at
    exit: the module fixture of the cluster tests."""
    etcd = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    brokers = ClusterBrokers(etcd, tmp_path_factory.mktemp("cluster"), **options)
    try:
        brokers.start(n)
        yield brokers
    finally:
        brokers.stop()
        etcd.stop()
