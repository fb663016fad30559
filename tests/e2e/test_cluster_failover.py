"""Failover with real processes: three brokers on one etcd with a 3 s lease, sharing the
durable tier and the WAL root (storage.mode shared_fs). The broker owning a reliable topic
is killed (SIGKILL) while a producer and a consumer run; the leader moves the topic, the
new owner continues from the WAL its predecessor acknowledged from, the clients find it by
lookup, and the consumer receives every message whose publish was acknowledged. Five
times, each time with a new topic and the killed broker restarted (same id) afterwards."""

import time

import grpc
import pytest

from cluster_clients import ResilientConsumer, ResilientProducer
from cluster_process import ClusterBrokers
from danube.proto import DanubeApi_pb2 as pb
from etcd_process import EtcdProcess
from grpc_calls import unary
from official_client import unique_topic
from waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    etcd = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    brokers = ClusterBrokers(etcd, tmp_path_factory.mktemp("cluster"), lease=3)
    try:
        brokers.start(3)
        yield brokers
    finally:
        brokers.stop()
        etcd.stop()


def owner(cluster, topic):
    for broker in cluster.live:
        with grpc.insecure_channel(broker.client_addr) as ch:
            answer = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
                pb.TopicLookupRequest(request_id=1, topic=topic), timeout=5)
        return cluster.by_url(answer.broker_url)


@pytest.mark.parametrize("run", range(5))
def test_kill_owner_of_reliable_topic_loses_no_acked_message(cluster, run):
    topic = unique_topic(f"failover{run}")
    producer = ResilientProducer(cluster, topic)
    producer.go.clear()
    producer.start()
    consumer = ResilientConsumer(cluster, topic)
    try:
        wait_for(lambda: producer.reconnects, what="the producer (and the topic) created")
        consumer.start()
        wait_for(lambda: consumer.reconnects, what="the consumer subscribed")
        producer.go.set()
        wait_for(lambda: len(consumer.received) >= 50, what="the consumer receiving")
        victim = owner(cluster, topic)
        acked_before = len(producer.acked)
        killed = cluster.kill(victim)
        wait_for(lambda: producer.ack_times and producer.ack_times[-1] > killed and
                 len(producer.acked) >= acked_before + 100, timeout=30,
                 what="publishing to resume on the new owner")
        served_again = next(t for t in producer.ack_times if t > killed) - killed
        producer.stop()
        try:
            wait_for(lambda: consumer.has_all(producer.acked), timeout=30,
                     what="every acknowledged message to reach the consumer")
        except AssertionError:
            missing = [p for p in producer.acked if p not in set(consumer.received)]
            raise AssertionError(
                f"{len(missing)} acknowledged messages never received (first {missing[:5]}, "
                f"last {missing[-5:]}); {len(producer.acked)} acked, "
                f"{len(consumer.received)} received, consumer reconnects "
                f"{consumer.reconnects}, errors {consumer.errors[-5:]}; new owner log:\n"
                + owner(cluster, topic).log()[-3000:]) from None
    finally:
        producer.stop()
        consumer.stop()
    new_owner = owner(cluster, topic)
    assert new_owner is not victim
    missing = set(producer.acked) - set(consumer.received)
    assert not missing
    # Per producer, in order: the first delivery of each payload follows publish order.
    first_seen = list(dict.fromkeys(consumer.received))
    order = {p: i for i, p in enumerate(producer.acked)}
    ranks = [order[p] for p in first_seen if p in order]
    assert ranks == sorted(ranks)
    assert served_again < 15, served_again
    print(f"run {run}: served again {served_again:.2f}s after kill -9, "
          f"{len(producer.acked)} acked, {len(consumer.received)} received")
    cluster.restart(victim)
    time.sleep(0.5)
