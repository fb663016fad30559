"""A cluster whose brokers keep their WALs on their own disks (three brokers on a real etcd,
the durable tier on a real SeaweedFS) loses nothing acknowledged when a topic's owner is
killed (``kill -9``, under load, three times), in either of the two ways docs/cluster.md
offers:

- the write buffer on a real redis-server primary with one replica (``WAIT 1``): nothing
  acknowledged is lost, no offset is given to two messages, and the subscription's cursor is
  kept (the new owner's log ends exactly where the acknowledged log did, so no cursor is
  past its end);
- no write buffer, durability ``uploaded``: a publish is acknowledged once it is in S3.

Without either named, a cluster acknowledges once in the durable tier (``uploaded``); only
``storage.failover: lossy_local_wal`` acknowledges what is on the owner's disk alone, and
each broker then says once at start what that risks."""

import contextlib
import json

import pytest

from cluster_failover import kill_owner_under_load
from cluster_process import ClusterBrokers
from etcd_process import EtcdProcess
from objstore_servers import durable_config
from official_client import unique_topic
from redis_servers import RedisPair, redis_server_binary

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server not installed (bash bin/test installs it)")

STORAGE = """\
storage:
  mode: object_store
  durable: {durable}
  write_buffer:
    backend: redis
    endpoints: ["{redis}"]
    wait_replicas: 1
    wait_timeout_ms: 2000
    on_wait_timeout: fail
    max_cached_closed_segments: 2
"""


@contextlib.contextmanager
def cluster_with_buffer(tmp_path_factory, seaweedfs):
    redis = RedisPair(str(tmp_path_factory.mktemp("redis")), replicas=1)
    etcd = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    workdir = tmp_path_factory.mktemp("cluster")
    durable = durable_config("s3", seaweedfs, name="wbcluster", upload_interval_seconds=1)
    # No local_wal_root: each broker keeps its WAL under its own data directory.
    brokers = ClusterBrokers(etcd, workdir, lease=3,
                             storage=STORAGE.format(durable=json.dumps(durable),
                                                    redis=redis.url))
    try:
        brokers.start(3)
        yield brokers, redis
    finally:
        brokers.stop()
        etcd.stop()
        redis.stop()


@pytest.fixture(scope="module")
def buffered_cluster(tmp_path_factory, seaweedfs_server):
    with cluster_with_buffer(tmp_path_factory, seaweedfs_server) as pair:
        yield pair


UPLOADED = """\
storage:
  mode: object_store
  durable: {durable}
  wal:
    durability: uploaded
"""

PLAIN = """\
storage:
  mode: object_store
  durable: {durable}
"""

LOSSY = """\
storage:
  mode: object_store
  failover: lossy_local_wal
  durable: {durable}
"""


@contextlib.contextmanager
def cluster_without_buffer(tmp_path_factory, seaweedfs, storage):
    etcd = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    workdir = tmp_path_factory.mktemp("cluster")
    durable = durable_config("s3", seaweedfs, name="upcluster", upload_interval_seconds=1)
    brokers = ClusterBrokers(etcd, workdir, lease=3,
                             storage=storage.format(durable=json.dumps(durable)))
    try:
        brokers.start(3)
        yield brokers
    finally:
        brokers.stop()
        etcd.stop()


@pytest.fixture(scope="module")
def uploaded_cluster(tmp_path_factory, seaweedfs_server):
    with cluster_without_buffer(tmp_path_factory, seaweedfs_server, UPLOADED) as brokers:
        yield brokers


WARNING = "storage.failover: lossy_local_wal: a reliable topic's acknowledged messages"


def test_the_lossy_choice_is_explicit_and_each_broker_warns_once(tmp_path_factory,
                                                                 seaweedfs_server):
    with cluster_without_buffer(tmp_path_factory, seaweedfs_server, LOSSY) as brokers:
        for broker in brokers.brokers:
            assert broker.log().count(WARNING) == 1
    # Without a choice: acknowledged once uploaded, and nothing to warn about.
    with cluster_without_buffer(tmp_path_factory, seaweedfs_server, PLAIN) as brokers:
        for broker in brokers.brokers:
            assert WARNING not in broker.log()
            assert "storage.failover: uploaded" in broker.log()


@pytest.mark.parametrize("run", range(3))
def test_uploaded_durability_kill_owner_loses_no_acked_message(uploaded_cluster, run):
    cluster = uploaded_cluster
    assert all(WARNING not in b.log() for b in cluster.live)
    result = kill_owner_under_load(cluster, unique_topic(f"up-failover{run}"))
    assert result["new_owner"] is not result["victim"]
    lost = set(result["acked"]) - set(result["received"])
    assert not lost, f"{len(lost)} acknowledged messages lost"
    doubled = {o: p for o, p in result["consumer"].by_offset.items() if len(p) > 1}
    assert not doubled, f"offsets given to two messages: {sorted(doubled)[:10]}"
    print(f"run {run}: served again {result['served_again']:.2f}s after kill -9, "
          f"{len(result['acked'])} acked")
    cluster.restart(result["victim"])


@pytest.mark.parametrize("run", range(3))
def test_own_wals_kill_owner_loses_no_acked_message(buffered_cluster, run):
    cluster, _ = buffered_cluster
    result = kill_owner_under_load(cluster, unique_topic(f"wb-failover{run}"))
    assert result["new_owner"] is not result["victim"]
    lost = set(result["acked"]) - set(result["received"])
    assert not lost, f"{len(lost)} acknowledged messages lost"
    consumer = result["consumer"]
    doubled = {o: p for o, p in consumer.by_offset.items() if len(p) > 1}
    assert not doubled, f"offsets given to two messages: {sorted(doubled)[:10]}"
    new_log = result["new_owner"].log()
    assert WARNING not in new_log
    assert "is past the end of the log" not in new_log
    assert "from the write buffer" in new_log
    print(f"run {run}: served again {result['served_again']:.2f}s after kill -9, "
          f"{len(result['acked'])} acked, {len(consumer.by_offset)} offsets")
    cluster.restart(result["victim"])
