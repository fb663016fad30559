"""`storage.failover: lossy_local_wal`, the one setting that acknowledges what is on the
owner's disk alone: when the owner is killed before uploading, the next owner continues
without what it acknowledged. That loss is not silent: the killed broker, back on its intact
disk, names the topic and the offsets its WAL held (a warning, a metric,
`orphaned.json`), and `danube admin topics republish-orphaned` publishes them into the topic
again (at least once, at new offsets), where a subscription that had not read them yet
receives them. Three brokers on a real etcd, each WAL on its own disk, nothing uploaded
(the upload interval is an hour)."""

import json
import subprocess
import sys

import grpc
import pytest

from cluster_clients import ResilientConsumer, ResilientProducer
from cluster_failover import owner
from cluster_process import ClusterBrokers
from configured_broker import metric
from danube.proto import DanubeApi_pb2 as pb
from etcd_process import EtcdProcess
from grpc_calls import subscribe
from official_client import unique_topic
from waiting import wait_for

STORAGE = """\
storage:
  mode: shared_fs
  failover: lossy_local_wal
  durable: {{backend: fs, root: "{root}", upload_interval_seconds: 3600}}
"""


@pytest.fixture
def cluster(tmp_path):
    etcd = EtcdProcess(tmp_path / "etcd").start()
    brokers = ClusterBrokers(etcd, tmp_path / "cluster", lease=3,
                             storage=STORAGE.format(root=tmp_path / "durable"))
    try:
        brokers.start(3)
        yield brokers
    finally:
        brokers.stop()
        etcd.stop()


def received_all(cluster, topic, subscription, payloads, timeout=60):
    """Whether a consumer of ``subscription`` receives (and acks) every one of ``payloads``
    within ``timeout``; and the consumer."""
    consumer = ResilientConsumer(cluster, topic, subscription)
    consumer.start()
    try:
        wait_for(lambda: consumer.has_all(payloads), timeout=timeout)
        return True, consumer
    except AssertionError:
        return False, consumer
    finally:
        consumer.stop()


def test_a_returning_broker_names_and_republishes_what_the_next_owner_lacks(cluster):
    topic = unique_topic("orphans")
    warning = "storage.failover: lossy_local_wal: a reliable topic's acknowledged messages"
    assert all(warning in b.log() for b in cluster.brokers)
    producer = ResilientProducer(cluster, topic)
    producer.go.clear()
    producer.start()
    try:
        wait_for(lambda: producer.reconnects, what="the producer (and the topic) created")
        # A subscription that reads nothing until the end.
        with grpc.insecure_channel(owner(cluster, topic).client_addr) as ch:
            subscribe(ch, topic, "late", "late")
        producer.go.set()
        wait_for(lambda: len(producer.acked) >= 60, timeout=60, what="acknowledged publishes")
        victim = owner(cluster, topic)
        before = len(producer.acked)
        killed = cluster.kill(victim)
        wait_for(lambda: producer.ack_times and producer.ack_times[-1] > killed and
                 len(producer.acked) >= before + 40, timeout=90,
                 what="publishing on the next owner")
    finally:
        producer.stop()
    acked = list(producer.acked)
    lost_before = [p for t, p in zip(producer.ack_times, acked) if t <= killed]
    after = [p for t, p in zip(producer.ack_times, acked) if t > killed]
    # What the next owner acknowledged all comes (however slow the machine); what only the
    # killed owner held does not.
    got, consumer = received_all(cluster, topic, "late", after, timeout=120)
    assert got, f"{len(set(after) - set(consumer.received))} acknowledged by the next owner " \
                f"never came"
    missing = set(acked) - set(consumer.received)
    assert missing, "nothing was lost: the scenario did not happen"
    assert missing <= set(lost_before)

    back = cluster.restart(victim)
    wait_for(lambda: "that the topic's next owner never had" in back.log(), timeout=30,
             what="the returning broker naming the orphaned messages")
    line = next(x for x in back.log().splitlines() if "next owner never had" in x)
    assert topic in line and "offsets 0.." in line
    assert metric(back, "danube_orphaned_messages_total", topic=topic) >= len(missing)

    urls = ",".join(f"http://{b.client_addr}" for b in cluster.live)
    command = [sys.executable, "-P", "-m", "danube", "admin", "topics", "republish-orphaned",
               topic, "--data-dir", str(back.data_dir), "-s", urls]
    dry = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"{topic}: offsets 0.." in dry.stdout
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "republished" in done.stdout
    # What the subscription had not received comes now, at new offsets.
    got, consumer = received_all(cluster, topic, "late", missing, timeout=60)
    assert got, f"{len(missing - set(consumer.received))} acknowledged still missing"
    # Done once: a second run finds nothing left.
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no orphaned messages" in again.stdout
    print(f"{len(missing)} acknowledged messages lost with the killed owner, named at its "
          f"return and republished: {done.stdout.strip().splitlines()[-1]}")
