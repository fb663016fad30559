"""Three `danube broker --mode cluster` processes on one real etcd: topics are placed on the
brokers by the leader, each broker serves only its own, lookup redirects to the owner, and
the official client follows the redirects unchanged, for plain and partitioned topics."""

import base64
import json
import urllib.request

import grpc
import pytest

from cluster_process import etcd_cluster
from danube.metadata import keys
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import create_producer, unary
from official_client import run_scenario, unique_topic
from waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with etcd_cluster(tmp_path_factory) as brokers:
        yield brokers


def lookup(broker, topic):
    with grpc.insecure_channel(broker.client_addr) as ch:
        return unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=10)


def partitions(broker, topic):
    with grpc.insecure_channel(broker.client_addr) as ch:
        return list(unary(ch, "/danube.Discovery/TopicPartitions", pb.TopicPartitionsResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=10).partitions)


def owner_of(cluster, topic):
    """The broker every lookup names for `topic` (they all agree), once every broker's view
    of the metadata has the new topic (a broker that has not seen it yet answers NOT_FOUND:
    the views follow etcd's watch, a moment behind on a loaded machine)."""
    def answers():
        try:
            return {lookup(b, topic).broker_url for b in cluster.live}
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return None
    found = wait_for(answers, what=f"every broker to know {topic}")
    assert len(found) == 1, found
    return cluster.by_url(found.pop())


def test_one_leader_and_every_broker_registered(cluster):
    ids = {b.broker_id for b in cluster.brokers}
    assert len(ids) == 3 and None not in ids
    leaders = [b for b in cluster.brokers if "is the cluster leader" in b.log()]
    assert len(leaders) >= 1


def test_lookup_answers_connect_on_the_owner_and_redirect_elsewhere(cluster):
    topic = unique_topic("placed")
    with grpc.insecure_channel(cluster.brokers[0].client_addr) as ch:
        try:
            create_producer(ch, topic, "p", pb.Reliable)
        except grpc.RpcError as exc:
            # Placed on another broker: the creator says "look it up again".
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            assert "look it up again" in exc.details()
    owner = owner_of(cluster, topic)
    for broker in cluster.live:
        answer = lookup(broker, topic)
        assert answer.broker_url == f"http://{owner.client_addr}"
        assert answer.connect_url == answer.broker_url and not answer.proxy
        expected = pb.TopicLookupResponse.Connect if broker is owner \
            else pb.TopicLookupResponse.Redirect
        assert answer.response_type == expected
        assert partitions(broker, topic) == [topic]
    # Only the owner serves it: a producer elsewhere is told to look it up again.
    other = next(b for b in cluster.live if b is not owner)
    with grpc.insecure_channel(other.client_addr) as ch:
        with pytest.raises(grpc.RpcError) as info:
            create_producer(ch, topic, "p2", pb.Reliable)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "served by broker" in info.value.details()


def test_unknown_topic_lookup_is_not_found(cluster):
    with pytest.raises(grpc.RpcError) as info:
        lookup(cluster.brokers[1], unique_topic("nothing"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_official_client_follows_redirects(cluster):
    """Producer and consumer both start at a broker that does not own the topic."""
    topic = unique_topic("redirect")
    messages = [{"payload": f"m{i}"} for i in range(20)]
    result = run_scenario("produce_consume.py", {
        "url": f"http://{cluster.brokers[2].client_addr}", "topic": topic,
        "consumers": [{"name": "c", "subscription": "s"}],
        "messages": messages, "expect": {"c": 20}}, timeout=60)
    assert [m["payload"] for m in result["received"]["c"]] == [m["payload"] for m in messages]
    owner = owner_of(cluster, topic)
    assert owner.client_addr in {b.client_addr for b in cluster.live}


def test_partitioned_topic_spreads_over_every_broker_and_is_consumed_whole(cluster):
    topic = unique_topic("spread")
    messages = [{"payload": f"m{i}", "key": f"k{i}"} for i in range(60)]
    result = run_scenario("produce_consume.py", {
        "url": f"http://{cluster.brokers[0].client_addr}", "topic": topic,
        "producer": {"name": "p", "partitions": 6},
        "consumers": [{"name": "c", "subscription": "s"}],
        "messages": messages, "expect": {"c": 60}}, timeout=90)
    got = sorted(m["payload"] for m in result["received"]["c"])
    assert got == sorted(m["payload"] for m in messages)
    names = [f"{topic}-part-{i}" for i in range(6)]
    for broker in cluster.live:
        assert partitions(broker, topic) == names
    owners = {owner_of(cluster, name).broker_id for name in names}
    assert owners == {b.broker_id for b in cluster.brokers}


def test_assignments_are_balanced(cluster):
    """`fair` placement: every broker ends up with a near-equal share of 12 new topics."""
    before = {b.broker_id: sum(1 for line in b.lines if "serving topic" in line)
              for b in cluster.brokers}
    with grpc.insecure_channel(cluster.brokers[1].client_addr) as ch:
        for i in range(12):
            try:
                create_producer(ch, unique_topic(f"bal{i}"), "p")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
    wait_for(lambda: sum(sum(1 for line in b.lines if "serving topic" in line)
                         for b in cluster.brokers) >= sum(before.values()) + 12,
             what="12 topics served")
    # `fair` balances what each broker owns now (the leader's assignments), which earlier
    # tests' topics are part of: a log line count would also count topics that moved away.
    counts = {b.broker_id: assigned_count(cluster, b.broker_id) for b in cluster.brokers}
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def assigned_count(cluster, broker_id):
    """How many topics are assigned to the broker in etcd now (its state key aside)."""
    prefix = keys.cluster_broker_prefix(broker_id) + "/"
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    encode = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    request = urllib.request.Request(
        f"http://{cluster.etcd.endpoint}/v3/kv/range",
        data=json.dumps({"key": encode(prefix), "range_end": encode(end),
                         "keys_only": True}).encode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        kvs = json.loads(answer.read()).get("kvs") or []
    state = keys.cluster_broker_state(broker_id)
    return sum(1 for kv in kvs if base64.b64decode(kv["key"]).decode() != state)
