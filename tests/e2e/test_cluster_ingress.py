"""Proxy mode as upstream (CHANGELOG #195) behind a real HAProxy: three brokers on one etcd
advertise the ingress as their connect_url (`--connect-url`) and themselves as broker_url;
HAProxy (HTTP/2 on both sides, danube.devcluster.ingress) routes a call carrying
`x-danube-broker-url` to that broker and a call without it to any live broker.

- a lookup through the ingress answers proxy=true, the ingress as connect_url and the
  owner as broker_url; our client and the official one publish and consume through it;
- the header picks the broker; a broker given a header naming another broker ignores it
  and answers for itself, as upstream's does (it never reads the header);
- the official Python producer, given only the ingress, keeps publishing through a kill -9
  of the topic's owner: nothing acknowledged is lost, and the time from the kill to its
  first acknowledged publish is reported (target: within twice the lease).
"""

import time

import grpc
import pytest

from cluster_failover import owner
from danube.client import DanubeClient
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import unary
from ingress_failover import ingress_cluster as ingress_cluster_of
from ingress_failover import official_through_owner_kill, url
from official_client import run_scenario, unique_topic
from waiting import wait_for

LEASE = 3
HEADER = "x-danube-broker-url"


@pytest.fixture(scope="module")
def ingress_cluster(tmp_path_factory):
    with ingress_cluster_of(tmp_path_factory.mktemp("etcd"), tmp_path_factory.mktemp("haproxy"),
                            tmp_path_factory.mktemp("cluster"), lease=LEASE) as cluster:
        yield cluster


def lookup(addr, topic, header=None):
    metadata = ((HEADER, header),) if header else None
    with grpc.insecure_channel(addr) as ch:
        return unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=5, metadata=metadata)


def create_producer(addr, topic, header=None):
    metadata = ((HEADER, header),) if header else None
    with grpc.insecure_channel(addr) as ch:
        return unary(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
            pb.ProducerRequest(producer_name=f"p{time.monotonic_ns()}", topic_name=topic,
                               dispatch_strategy=pb.Reliable), timeout=5)


def place(cluster, topic):
    """Create ``topic``: in proxy mode the creating call answers UNAVAILABLE "look it up
    again" (upstream's answer), and the topic is placed."""
    with pytest.raises(grpc.RpcError) as created:
        create_producer(cluster.live[0].client_addr, topic)
    assert created.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "look it up again" in created.value.details()

    def every_broker_knows():
        try:
            return all(lookup(b.client_addr, topic) for b in cluster.live)
        except grpc.RpcError:               # a view that has not seen the placement yet
            return False
    wait_for(every_broker_knows, what="every broker's view of the placement")


def ingress_addr(cluster):
    return f"127.0.0.1:{cluster.ingress.port}"


async def test_our_client_through_the_ingress(ingress_cluster):
    cluster = ingress_cluster
    topic = unique_topic("ingress-ours")
    async with DanubeClient(cluster.ingress.url) as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        consumer = await client.subscribe(topic, "c", "s")
        for i in range(20):
            await producer.send(f"x{i}")
        got = []
        while len(got) < 20:
            message = await consumer.receive(timeout=15)
            got.append(message.payload.decode())
            await consumer.ack(message)
    assert got == [f"x{i}" for i in range(20)]
    answer = lookup(ingress_addr(cluster), topic)
    assert answer.proxy
    assert answer.connect_url == cluster.ingress.url
    assert answer.broker_url == url(owner(cluster, topic))


def test_official_client_through_the_ingress(ingress_cluster):
    topic = unique_topic("ingress-official")
    result = run_scenario("produce_consume.py", {
        "url": ingress_cluster.ingress.url, "topic": topic,
        "consumers": [{"name": "c", "subscription": "s"}],
        "messages": [{"payload": f"o{i}"} for i in range(10)], "expect": {"c": 10}})
    assert [m["payload"] for m in result["received"]["c"]] == [f"o{i}" for i in range(10)]


def test_the_header_picks_the_broker(ingress_cluster):
    cluster = ingress_cluster
    topic = unique_topic("ingress-route")
    place(cluster, topic)
    served_by = owner(cluster, topic)
    others = [b for b in cluster.live if b is not served_by]
    via = ingress_addr(cluster)
    # Routed to the owner: it answers Connect; routed to another broker: Redirect.
    assert lookup(via, topic, url(served_by)).response_type == pb.TopicLookupResponse.Connect
    for other in others:
        assert lookup(via, topic, url(other)).response_type == pb.TopicLookupResponse.Redirect
    # Without the header: any live broker (round robin), so both answers come back.
    kinds = {lookup(via, topic).response_type for _ in range(6)}
    assert kinds == {pb.TopicLookupResponse.Connect, pb.TopicLookupResponse.Redirect}
    # A header naming no broker the ingress knows: any live broker, as without one.
    assert lookup(via, topic, "http://10.255.255.1:6650").broker_url == url(served_by)


def test_a_broker_ignores_a_header_naming_another(ingress_cluster):
    """Upstream's broker never reads x-danube-broker-url: a call that reaches a broker
    directly is answered by that broker, whatever broker the header names."""
    cluster = ingress_cluster
    topic = unique_topic("ingress-direct")
    place(cluster, topic)
    served_by = owner(cluster, topic)
    other = next(b for b in cluster.live if b is not served_by)

    def created_on_owner():
        try:
            return create_producer(served_by.client_addr, topic, header=url(other))
        except grpc.RpcError as exc:        # the owner still opening the topic
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return None
    assert wait_for(created_on_owner, what="a producer on the owner").producer_id >= 0
    with pytest.raises(grpc.RpcError) as refused:
        create_producer(other.client_addr, topic, header=url(served_by))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    answer = lookup(other.client_addr, topic, header=url(served_by))
    assert answer.response_type == pb.TopicLookupResponse.Redirect
    assert answer.broker_url == url(served_by)


def test_official_producer_survives_an_owner_kill_behind_the_ingress(ingress_cluster, tmp_path):
    """Last in the module: the killed broker stays down (the ingress knows its port)."""
    result = official_through_owner_kill(ingress_cluster, unique_topic("ingress-kill"),
                                         tmp_path)
    print(f"official producer behind HAProxy: first acked publish {result['served_again']:.2f}"
          f" s after kill -9 of the owner (lease {LEASE} s), {len(result['acked'])} acked, "
          f"{len(result['lost'])} lost, {result['errors']} send errors raised to the "
          f"application; official consumer: {result['official_missing']} not received")
    assert not result["lost"], result["lost"][:10]
    # The official consumer resubscribes once a health check, which the ingress sends to
    # a live broker while the owner is down, answers CLOSE.
    assert result["official_missing"] == 0, result["official_stderr"]
    # The target (2x the lease) is measured by bench.cluster's ingress section; this only
    # bounds it loosely, for slow machines.
    assert result["served_again"] < 2 * LEASE + 10, result["served_again"]
