"""The cluster when etcd goes away: a broker cut off from etcd (a TCP proxy between it and
etcd is cut) fences itself and stops serving before its topics are given to another broker,
and serves again once it reaches etcd; etcd killed and restarted under load: the brokers
recover by themselves and nothing acknowledged is lost. Real processes, 3 s leases."""

import datetime
import re
import time

import grpc
import pytest

from cluster_clients import ResilientConsumer, ResilientProducer
from cluster_process import ClusterBrokers
from danube.proto import DanubeApi_pb2 as pb
from etcd_process import EtcdProcess
from grpc_calls import create_producer, unary
from official_client import unique_topic
from tcp_proxy import TcpProxy
from waiting import wait_for

LEASE = 3        # seconds: meta_store.lease_ttl_seconds of the cluster
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.stop()


@pytest.fixture
def cluster(etcd, tmp_path):
    etcd.start()
    brokers = ClusterBrokers(etcd, tmp_path, lease=LEASE)
    yield brokers
    brokers.stop()


def lookup_url(broker, topic):
    with grpc.insecure_channel(broker.client_addr) as ch:
        return unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=5).broker_url


def topic_on(cluster, broker, prefix):
    """A new reliable topic that the leader placed on `broker`."""
    for i in range(30):
        topic = unique_topic(f"{prefix}{i}")
        with grpc.insecure_channel(broker.client_addr) as ch:
            try:
                create_producer(ch, topic, "p", pb.Reliable)
            except grpc.RpcError:
                pass
        owner = wait_for(lambda: _lookup_or_none(cluster.brokers[0], topic),
                         what=f"{topic} placed")
        if owner == f"http://{broker.client_addr}":
            return topic
    raise AssertionError(f"no topic landed on {broker.client_addr}")


def _lookup_or_none(broker, topic):
    try:
        return lookup_url(broker, topic)
    except grpc.RpcError:
        return None


def log_time(broker, pattern):
    """Wall-clock time of the first log line of `broker` matching `pattern`."""
    for line in broker.lines:
        if re.search(pattern, line):
            stamp = LOG_TIME.match(line).group(1)
            return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def run_clients(cluster, topic):
    producer = ResilientProducer(cluster, topic)
    producer.go.clear()
    producer.start()
    consumer = ResilientConsumer(cluster, topic)
    wait_for(lambda: producer.reconnects, what="the producer")
    consumer.start()
    wait_for(lambda: consumer.reconnects, what="the consumer")
    producer.go.set()
    wait_for(lambda: len(consumer.received) >= 30, what="messages flowing")
    return producer, consumer


def finish(producer, consumer):
    producer.stop()
    try:
        wait_for(lambda: consumer.has_all(producer.acked), timeout=30,
                 what="every acknowledged message received")
    except AssertionError:
        received = set(consumer.received)
        missing = [(p, via) for p, via in zip(producer.acked, producer.acked_via)
                   if p not in received]
        raise AssertionError(f"{len(missing)} acknowledged messages not received: "
                             f"{missing[:3]} ... {missing[-3:]}; consumer errors "
                             f"{consumer.errors[-5:]}") from None
    finally:
        consumer.stop()


def test_broker_cut_off_from_etcd_stops_serving_before_its_topic_moves(cluster, etcd):
    proxy = TcpProxy(etcd.client_port)
    try:
        cluster.start(2)
        isolated = cluster.add("isolated", "--etcd-endpoints", proxy.endpoint)
        topic = topic_on(cluster, isolated, "fence")
        producer, consumer = run_clients(cluster, topic)
        try:
            cut_at = time.time()
            proxy.cut()
            assert isolated.wait_for_log("fenced: no registration renewed", 10), \
                isolated.log()[-4000:]
            # The promise (cluster/membership.py): fenced before its lease can run out,
            # by the broker's own clock (at 3/4 of the TTL after its last renewal was sent,
            # which was before the cut), whenever the others move the topic.
            fenced_at = log_time(isolated, "fenced:")
            assert fenced_at < cut_at + LEASE, (
                f"fenced {fenced_at - cut_at:.2f} s after the cut, the lease is {LEASE} s")
            wait_for(lambda: _lookup_or_none(cluster.brokers[0], topic) not in
                     (None, f"http://{isolated.client_addr}"), timeout=15,
                     what="the topic to move")
            new_owner = cluster.by_url(lookup_url(cluster.brokers[0], topic))
            assert new_owner.wait_for_log(f"serving topic {re.escape(topic)}", 15)
            wait_for(lambda: sum(1 for _, via in producer.acked_via
                                 if via == new_owner.client_addr) >= 50, timeout=20,
                     what="publishing on the new owner")
            served_at = log_time(new_owner, f"serving topic {re.escape(topic)}")
            assert fenced_at is not None and served_at is not None
            assert fenced_at < served_at
            late = [t for t, via in producer.acked_via
                    if via == isolated.client_addr and t > served_at]
            assert not late, "the fenced broker acknowledged publishes after the move"
        finally:
            try:
                finish(producer, consumer)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\nisolated {isolated.client_addr} fenced at "
                    f"{log_time(isolated, 'fenced:')}; logs:\n" + "\n".join(
                        f"--- {b.client_addr}\n" + "".join(
                            line for line in b.lines if "fence" in line or topic in line
                            or "WARN" in line or "ERROR" in line)[-2500:]
                        for b in cluster.brokers)) from None
        proxy.heal()
        assert isolated.wait_for_log("registered again after being fenced", 15)
        with grpc.insecure_channel(cluster.brokers[0].admin_addr) as ch:
            from danube.proto import DanubeAdmin_pb2 as adm
            brokers = unary(ch, "/danube_admin.BrokerAdmin/ListBrokers",
                            adm.BrokerListResponse)(adm.Empty(), timeout=5).brokers
        assert isolated.broker_id in {b.broker_id for b in brokers}
    finally:
        proxy.close()


def test_etcd_restart_under_load_loses_nothing(cluster, etcd):
    cluster.start(3)
    topic = unique_topic("etcd-restart")
    producer, consumer = run_clients(cluster, topic)
    try:
        etcd.kill()
        acked = len(producer.acked)
        etcd.start()
        wait_for(lambda: len(producer.acked) >= acked + 100, timeout=30,
                 what="publishing after etcd came back")
    finally:
        finish(producer, consumer)
    assert all(b.proc.poll() is None for b in cluster.brokers)
