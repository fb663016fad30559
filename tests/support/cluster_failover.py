"""One failover under load, shared by the cluster tests: a producer and a consumer run on a
reliable topic, the broker that owns it is killed (SIGKILL), and the consumer must receive
every payload whose publish was acknowledged, first deliveries in publish order."""

from __future__ import annotations

import grpc

from cluster_clients import ResilientConsumer, ResilientProducer
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import unary
from waiting import wait_for


def owner(cluster, topic):
    """The broker process that serves ``topic``, by a lookup through a live broker."""
    for broker in cluster.live:
        with grpc.insecure_channel(broker.client_addr) as ch:
            answer = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
                pb.TopicLookupRequest(request_id=1, topic=topic), timeout=5)
        return cluster.by_url(answer.broker_url)


def in_publish_order(producer, consumer) -> bool:
    first_seen = list(dict.fromkeys(consumer.received))
    order = {p: i for i, p in enumerate(producer.acked)}
    ranks = [order[p] for p in first_seen if p in order]
    return ranks == sorted(ranks)


def kill_owner_under_load(cluster, topic: str) -> dict:
    """Run the failover; return ``victim``, ``new_owner``, ``served_again`` (seconds from the
    kill to the first acknowledged publish after it), ``acked`` and ``received``."""
    producer = ResilientProducer(cluster, topic)
    producer.go.clear()
    producer.start()
    consumer = ResilientConsumer(cluster, topic)
    try:
        wait_for(lambda: producer.reconnects, what="the producer (and the topic) created")
        consumer.start()
        wait_for(lambda: consumer.reconnects, what="the consumer subscribed")
        producer.go.set()
        try:
            # Deadlines, not budgets: the whole suite on 2 cores has taken over a minute here.
            wait_for(lambda: len(consumer.received) >= 50, timeout=180,
                     what="the consumer receiving")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {len(producer.acked)} acked, {len(consumer.received)} received, "
                f"producer errors {producer.errors[-5:]}, consumer errors "
                f"{consumer.errors[-5:]}; live brokers' logs:\n" + "\n".join(
                    b.log()[-2500:] for b in cluster.live)) from None
        victim = owner(cluster, topic)
        acked_before = len(producer.acked)
        killed = cluster.kill(victim)
        try:
            wait_for(lambda: producer.ack_times and producer.ack_times[-1] > killed and
                     len(producer.acked) >= acked_before + 100, timeout=180,
                     what="publishing to resume on the new owner")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {len(producer.acked) - acked_before} acked since the kill, producer "
                f"errors {producer.errors[-8:]}; live brokers' logs:\n" + "\n".join(
                    b.log()[-2500:] for b in cluster.live)) from None
        served_again = next(t for t in producer.ack_times if t > killed) - killed
        producer.stop()
        try:
            wait_for(lambda: consumer.has_all(producer.acked), timeout=90,
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
    assert in_publish_order(producer, consumer)
    return {"victim": victim, "new_owner": owner(cluster, topic),
            "served_again": served_again, "acked": producer.acked,
            "received": consumer.received, "consumer": consumer}
