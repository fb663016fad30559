"""A broker that fences itself although its registration never lapsed (its renewals stalled
past the fence threshold but succeeded before the lease could run out: a loaded machine, a
long pause) serves its topics again from its own WAL once it is registered again, instead of
handing them to a broker that would continue from the durable tier behind what it
acknowledged. Each broker's WAL on its own disk, the durable tier uploading rarely, so a
hand-over would lose every acknowledged message: the consumer must receive them all.

The pause is a SIGSTOP of the owner for a little more than the fence threshold (75 % of the
lease) and well under the lease; real processes, real etcd."""

import base64
import json
import os
import re
import signal
import time
import urllib.request

import pytest

from cluster_clients import ResilientConsumer, ResilientProducer, _lookup
from cluster_process import ClusterBrokers
from danube.metadata import keys
from etcd_process import EtcdProcess
from official_client import unique_topic
from waiting import wait_for

# Renewals every 10 s; the fence after 22.5 s without one; "never lapsed" if renewed within
# 27 s of the last renewal sent before the fence; the lease runs out at 30 s.
LEASE = 30
PAUSE = LEASE * 0.75 + 0.5

STORAGE = """\
storage:
  mode: shared_fs
  failover: lossy_local_wal
  durable: {{backend: fs, root: "{root}", upload_interval_seconds: 3600}}
"""


def registration_revision(etcd, broker_id):
    """The mod_revision of the broker's registration (changes at each renewal)."""
    key = base64.b64encode(keys.cluster_register(broker_id).encode()).decode()
    request = urllib.request.Request(f"http://{etcd.endpoint}/v3/kv/range",
                                     data=json.dumps({"key": key}).encode())
    with urllib.request.urlopen(request, timeout=5) as answer:
        kvs = json.loads(answer.read()).get("kvs") or [{}]
    return kvs[0].get("mod_revision")


@pytest.fixture
def cluster(tmp_path):
    etcd = EtcdProcess(tmp_path / "etcd").start()
    # No local_wal_root: each broker's WAL is under its own data directory.
    brokers = ClusterBrokers(etcd, tmp_path / "cluster", lease=LEASE,
                             storage=STORAGE.format(root=tmp_path / "durable"))
    try:
        yield brokers
    finally:
        brokers.stop()
        etcd.stop()


def test_fenced_broker_whose_registration_never_lapsed_loses_nothing(cluster):
    cluster.start(2)
    topic = unique_topic("fence-recover")
    producer = ResilientProducer(cluster, topic)
    consumer = ResilientConsumer(cluster, topic)
    # A subscription whose consumer comes back only after the fence: it needs every
    # message from the log (a consumer keeping up has them already, whatever the log lost).
    late = ResilientConsumer(cluster, topic, "late")
    producer.go.clear()
    producer.start()
    wait_for(lambda: producer.reconnects, what="the producer")
    late.start()
    wait_for(lambda: late.reconnects, what="the late consumer")
    late.stop()
    consumer.start()
    wait_for(lambda: consumer.reconnects, what="the consumer")
    producer.go.set()
    late = ResilientConsumer(cluster, topic, "late")
    try:
        wait_for(lambda: len(consumer.received) >= 50, what="messages flowing")
        owner = cluster.by_url(producer.owner())
        # Right after a renewal, so that the fence comes PAUSE - 22.5 s after the resume
        # and the renewal after it well within the lease.
        before = registration_revision(cluster.etcd, owner.broker_id)
        wait_for(lambda: registration_revision(cluster.etcd, owner.broker_id) != before,
                 timeout=30, interval=0.01, what="a renewal")
        os.kill(owner.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(PAUSE)       # the stall itself, not a wait for a condition
        finally:
            os.kill(owner.proc.pid, signal.SIGCONT)
        assert owner.wait_for_log("fenced: no registration renewed", 30), owner.log()[-3000:]
        assert owner.wait_for_log("registered again after being fenced", 30)
        acked = len(producer.acked)
        wait_for(lambda: len(producer.acked) >= acked + 50, timeout=60,
                 what="publishing again after the fence")
    finally:
        producer.stop()
    late.start()
    try:
        for c in (consumer, late):
            wait_for(lambda: c.has_all(producer.acked), timeout=60,
                     what=f"every acknowledged message received on {c.subscription}")
    except AssertionError:
        missing = sorted(set(producer.acked) - set(late.received))
        raise AssertionError(f"{len(missing)} of {len(producer.acked)} acknowledged messages "
                             f"not received: {missing[:5]}; logs:\n" + "\n".join(
                                 f"--- {b.name}\n" + "".join(
                                     line for line in b.lines if "WARN" in line or
                                     "ERROR" in line or topic in line)[-2500:]
                                 for b in cluster.brokers)) from None
    finally:
        consumer.stop()
        late.stop()
    assert owner.wait_for_log("the registration never lapsed", 30), owner.log()[-3000:]
    # the topic stayed where it was
    other = next(b for b in cluster.brokers if b is not owner)
    assert _lookup(other.client_addr, topic) == owner.client_addr
