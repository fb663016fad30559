"""The write buffer in a cluster whose brokers keep their WALs on their own disks (three
brokers on a real etcd, the durable tier on a real SeaweedFS, the buffer on a real
redis-server primary with one replica, ``WAIT 1``): ``kill -9`` of a topic's owner under
load, three times, loses nothing acknowledged, never gives one offset to two messages, and
keeps the subscription's cursor (the new owner's log ends exactly where the acknowledged log
did, so no cursor is past its end)."""

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
    assert "is past the end of the log" not in new_log
    assert "from the write buffer" in new_log
    print(f"run {run}: served again {result['served_again']:.2f}s after kill -9, "
          f"{len(result['acked'])} acked, {len(consumer.by_offset)} offsets")
    cluster.restart(result["victim"])
