"""End to end with the OFFICIAL Python client: partitioned topics, Key-Shared affinity and key
filters, Failover (upstream danube-broker/tests partitioned_basic, partitioned_variants,
partitioning_validation, key_shared_basic, key_shared_filtering; reference (b.5), (c), (h)).
TopicPartitions and the admin calls use grpcio with our generated modules."""

import collections

import grpc
import pytest

from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.proto import DanubeApi_pb2 as pb
from official_client import (broker_url, official_python, run_scenario, start_broker,
                             unique_topic)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    official_python()  # fail fast, before starting a broker, if the client is missing
    b = start_broker(tmp_path_factory.mktemp("e2e-partitions") / "data")
    yield b
    b.stop()


def consumer(name, subscription, kind, key_filters=()):
    return {"name": name, "subscription": subscription, "kind": kind,
            "key_filters": list(key_filters)}


def topic_partitions(broker, topic):
    with grpc.insecure_channel(broker.client_addr) as ch:
        call = ch.unary_unary("/danube.Discovery/TopicPartitions",
                              request_serializer=pb.TopicLookupRequest.SerializeToString,
                              response_deserializer=pb.TopicPartitionsResponse.FromString)
        return list(call(pb.TopicLookupRequest(request_id=7, topic=topic), timeout=5).partitions)


def test_partitioned_topic_exclusive_and_shared_receive_everything(broker):
    topic = unique_topic("part-basic")
    sent = [f"pm-{i}" for i in range(30)]
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic,
        "producer": {"name": "part-producer", "partitions": 3},
        "consumers": [consumer("px", "sub-excl", "exclusive"),
                      consumer("ps", "sub-shared", "shared")],
        "messages": [{"payload": p} for p in sent],
        "expect": {"px": 30, "ps": 30}})
    partitions = [f"{topic}-part-{i}" for i in range(3)]
    assert len(set(result["producer_ids"])) == 3
    for name in ("px", "ps"):
        got = result["received"][name]
        assert sorted(m["payload"] for m in got) == sorted(sent), name
        assert {m["topic"] for m in got} == set(partitions), name
        # Round robin over the partitions: message i went to partition i % 3.
        for m in got:
            assert m["topic"] == partitions[int(m["payload"].split("-")[1]) % 3]
        # Per partition, publish order is kept.
        for p in partitions:
            seq = [int(m["payload"].split("-")[1]) for m in got if m["topic"] == p]
            assert seq == sorted(seq)
        assert result["ack_errors"][name] == []
    # The producer created the partitions; TopicPartitions lists them in order.
    assert topic_partitions(broker, topic) == partitions


def test_partitioned_topic_three_shared_consumers(broker):
    topic = unique_topic("part-shared3")
    names = ["s1", "s2", "s3"]
    sent = [f"ps3-{i}" for i in range(60)]
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic,
        "producer": {"name": "p3", "partitions": 3},
        "consumers": [consumer(n, "shared-sub", "shared") for n in names],
        "messages": [{"payload": p} for p in sent],
        "expect_total": 60})
    got = {n: result["received"][n] for n in names}
    everything = [m["payload"] for msgs in got.values() for m in msgs]
    assert sorted(everything) == sorted(sent) and len(set(everything)) == 60
    assert {m["topic"] for msgs in got.values() for m in msgs} == \
        {f"{topic}-part-{i}" for i in range(3)}
    assert all(msgs for msgs in got.values()), {n: len(m) for n, m in got.items()}


def test_topic_partitions_are_listed_in_numeric_order(broker):
    topic = unique_topic("part-order")
    with grpc.insecure_channel(broker.admin_addr) as ch:
        create = ch.unary_unary(
            "/danube_admin.TopicAdmin/CreatePartitionedTopic",
            request_serializer=admin_pb.PartitionedTopicRequest.SerializeToString,
            response_deserializer=admin_pb.TopicResponse.FromString)
        assert create(admin_pb.PartitionedTopicRequest(base_name=topic, partitions=12),
                      timeout=5).success
    assert topic_partitions(broker, topic) == [f"{topic}-part-{i}" for i in range(12)]
    # One partition is an ordinary topic: it lists itself.
    assert topic_partitions(broker, f"{topic}-part-10") == [f"{topic}-part-10"]


def test_key_shared_key_affinity_and_per_key_order(broker):
    topic = unique_topic("ks-affinity")
    keys = [f"k{i}" for i in range(10)]
    messages = [{"payload": f"{k}-{r}", "key": k} for r in range(5) for k in keys]
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic,
        "consumers": [consumer("ka", "ks", "key_shared"), consumer("kb", "ks", "key_shared")],
        "messages": messages, "expect_total": 50})
    owners = collections.defaultdict(set)
    per_key = collections.defaultdict(list)
    everything = []
    for name, msgs in result["received"].items():
        for m in msgs:
            key, seq = m["payload"].split("-")
            assert m["routing_key"] == key
            owners[key].add(name)
            per_key[key].append(int(seq))
            everything.append(m["payload"])
    assert sorted(everything) == sorted(m["payload"] for m in messages)
    assert len(everything) == len(set(everything)) == 50
    for key in keys:
        assert len(owners[key]) == 1, f"key {key} delivered to {owners[key]}"
        assert per_key[key] == [0, 1, 2, 3, 4], f"key {key} out of order: {per_key[key]}"
    # The hash ring spreads ten keys over both consumers.
    assert {n for o in owners.values() for n in o} == {"ka", "kb"}, dict(owners)


def test_key_shared_key_filters(broker):
    topic = unique_topic("ks-filter")
    keys = ["user-1", "order-1", "other-1", "user-22", "x", "order-abc", "users", "order-2",
            "user-last", "order-last"]
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic,
        "consumers": [consumer("users", "ksf", "key_shared", ["user-*"]),
                      consumer("orders", "ksf", "key_shared", ["order-*"])],
        "messages": [{"payload": f"msg:{k}", "key": k} for k in keys],
        "expect": {"users": 3, "orders": 4}})
    got = {n: [m["routing_key"] for m in msgs] for n, msgs in result["received"].items()}
    assert got["users"] == ["user-1", "user-22", "user-last"]
    assert got["orders"] == ["order-1", "order-abc", "order-2", "order-last"]
    # "other-1", "x" and "users" match no filter and reach nobody.


def test_failover_promotes_the_standby_when_the_active_consumer_closes(broker):
    topic = unique_topic("failover")
    result = run_scenario("failover.py", {
        "url": broker_url(broker), "topic": topic, "subscription": "fo", "n": 10})
    assert result["phase1"]["first"] == [f"p1-{i}" for i in range(10)]
    assert result["phase1"]["second"] == []
    assert result["first_health_after_close"] == "CLOSE"
    assert result["phase2"]["first"] == []
    assert result["phase2"]["second"] == [f"p2-{i}" for i in range(10)]
