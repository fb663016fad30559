"""The admin API and `danube admin` on a cluster of broker processes on one real etcd:
brokers with roles and status, the leader, ClusterStatus (etcd's Raft group; Raft
membership calls point to etcdctl), draining a broker under load with no acknowledged
message lost, activating it again, unloading one topic, and a rebalance after a fourth
broker joins that brings the coefficient of variation under 0.2 (automatic rebalancing is
off in this cluster: nothing moves until the admin call)."""

import asyncio
import subprocess
import sys

import pytest

from cluster_clients import ResilientConsumer, ResilientProducer
from cluster_process import etcd_cluster
from danube.client import errors
from danube.client.admin import AdminClient
from danube.metadata.etcd import EtcdStore
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc.client import Channel
from danube.rpc.status import RpcError, StatusCode
from grpc_calls import create_producer, subscribe
from official_client import unique_topic
from waiting import async_wait_for, wait_for

import grpc
from danube.proto import DanubeApi_pb2 as pb


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Rebalancing off, with settings that would move topics within seconds if it were on.
    with etcd_cluster(tmp_path_factory, lease=3, rebalancing={
            "enabled": False, "aggressiveness": "aggressive", "check_interval_seconds": 1,
            "cooldown_seconds": 0, "min_topic_age_seconds": 0,
            "max_moves_per_hour": 100}) as brokers:
        yield brokers


@pytest.fixture
async def admin(cluster):
    client = AdminClient(f"http://{cluster.brokers[0].admin_addr}")
    yield client
    await client.close()


def create_topics(cluster, prefix, n):
    names = [unique_topic(f"{prefix}{i}") for i in range(n)]
    with grpc.insecure_channel(cluster.brokers[0].client_addr) as ch:
        for name in names:
            try:
                create_producer(ch, name, "p", pb.Reliable)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE   # placed elsewhere
    return names


async def brokers_by_id(admin):
    return {b.broker_id: b for b in (await admin.call("BrokerAdmin", "ListBrokers")).brokers}


async def topics_of(admin, broker_id):
    r = await admin.call("TopicAdmin", "ListBrokerTopics",
                         adm.BrokerRequest(broker_id=broker_id))
    return [t.name for t in r.topics]


def cli(cluster, *args):
    return subprocess.run(
        [sys.executable, "-P", "-m", "danube", "admin", *args, "--endpoint",
         f"http://{cluster.brokers[1].admin_addr}"], capture_output=True, text=True, timeout=60)


async def test_brokers_roles_status_and_leader(cluster, admin):
    brokers = await brokers_by_id(admin)
    assert set(brokers) == {b.broker_id for b in cluster.brokers}
    leaders = [b for b in brokers.values() if b.broker_role == "Cluster_Leader"]
    assert len(leaders) == 1
    assert all(b.broker_status == "active" for b in brokers.values())
    assert (await admin.call("BrokerAdmin", "GetLeaderBroker")).leader == leaders[0].broker_id
    for b in cluster.brokers:
        assert brokers[b.broker_id].broker_addr == f"http://{b.client_addr}"
        assert brokers[b.broker_id].admin_addr == f"http://{b.admin_addr}"


async def test_cluster_status_reports_etcd_and_the_leader(cluster, admin):
    # etcd's Raft group in upstream's shape: every id an etcd member id (docs/compatibility)
    status = await admin.call("ClusterAdmin", "ClusterStatus")
    assert len(status.voters) == 1 and not status.learners      # a one-member etcd
    assert status.leader_id == status.self_node_id == status.voters[0]
    assert status.current_term >= 1 and status.last_applied > 0
    assert status.raft_addr == f"http://127.0.0.1:{cluster.etcd.peer_port}"
    leader = (await admin.call("BrokerAdmin", "GetLeaderBroker")).leader
    assert leader in {b.broker_id for b in cluster.brokers}
    out = cli(cluster, "cluster", "status")
    assert out.returncode == 0, out.stderr
    assert f"Self Node ID:  {status.self_node_id}" in out.stdout
    assert f"Leader:        {status.leader_id}" in out.stdout
    with pytest.raises(errors.DanubeError) as info:
        await admin.call("ClusterAdmin", "AddNode", adm.AddNodeRequest(addr="http://x:1"))
    assert "etcdctl member add" in str(info.value)
    out = cli(cluster, "cluster", "remove-node", "--node-id", "7")
    assert out.returncode != 0 and "etcdctl member remove" in out.stderr


async def test_unload_topic_moves_it_to_another_broker(cluster, admin):
    [topic] = create_topics(cluster, "unload", 1)
    before = await admin.call("TopicAdmin", "DescribeTopic", adm.DescribeTopicRequest(name=topic))
    await admin.call("TopicAdmin", "UnloadTopic", adm.TopicRequest(name=topic))
    after = await admin.call("TopicAdmin", "DescribeTopic", adm.DescribeTopicRequest(name=topic))
    assert after.broker_id and after.broker_id != before.broker_id


async def test_live_state_calls_are_forwarded_to_the_owner(cluster):
    [topic] = create_topics(cluster, "forward", 1)
    owner_id = (await AdminClient(f"http://{cluster.brokers[0].admin_addr}").call(
        "TopicAdmin", "DescribeTopic", adm.DescribeTopicRequest(name=topic))).broker_id
    owner = next(b for b in cluster.brokers if b.broker_id == owner_id)
    other = next(b for b in cluster.brokers if b.broker_id != owner_id)
    with grpc.insecure_channel(owner.client_addr) as ch:
        def subscribed():
            try:
                subscribe(ch, topic, "c", "fwd-sub")
                return True
            except grpc.RpcError as exc:     # the owner is still loading the topic
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                return None
        wait_for(subscribed, what="a subscription on the owner")
    async with AdminClient(f"http://{other.admin_addr}") as remote:
        subs = await remote.call("TopicAdmin", "ListSubscriptions",
                                 adm.TopicRequest(name=topic))
        assert list(subs.subscriptions) == ["fwd-sub"]
        stats = await remote.call("TopicStatsService", "GetTopicStats",
                                  ext.TopicStatsRequest(name=topic))
        assert [t.name for t in stats.topics] == [topic]
        assert [s.name for s in stats.topics[0].subscriptions] == ["fwd-sub"]
        await remote.call("TopicAdmin", "SetSubscriptionDispatchConfig",
                          adm.SetSubscriptionDispatchConfigRequest(
                              topic=topic, subscription="fwd-sub",
                              dispatch_config=adm.SubscriptionDispatchConfig(
                                  max_unacked_messages=7)))
        config = await remote.call("TopicAdmin", "GetSubscriptionDispatchConfig",
                                   adm.GetSubscriptionDispatchConfigRequest(
                                       topic=topic, subscription="fwd-sub"))
        assert config.dispatch_config.max_unacked_messages == 7
        # The owner's errors come back as they are.
        with pytest.raises(errors.NotFound, match="subscription 'nope' not found"):
            await remote.call("TopicAdmin", "GetSubscriptionFailurePolicy",
                              adm.GetSubscriptionFailurePolicyRequest(topic=topic,
                                                                      subscription="nope"))
        await remote.call("TopicAdmin", "Unsubscribe",
                          adm.SubscriptionRequest(topic=topic, subscription="fwd-sub"))
    async with AdminClient(f"http://{owner.admin_addr}") as local:
        subs = await local.call("TopicAdmin", "ListSubscriptions", adm.TopicRequest(name=topic))
        assert list(subs.subscriptions) == []
    # One hop: a call already forwarded is answered, not forwarded again.
    channel = Channel(other.admin_addr)
    try:
        call = channel.unary_unary("/danube_admin.TopicAdmin/ListSubscriptions",
                                   lambda m: m.SerializeToString(),
                                   adm.SubscriptionListResponse.FromString)
        with pytest.raises(RpcError) as info:
            await call(adm.TopicRequest(name=topic), timeout=10,
                       metadata=[("x-danube-forwarded-by", "1")])
        assert info.value.code == StatusCode.UNAVAILABLE
        assert f"admin port http://{owner.admin_addr}" in info.value.details
    finally:
        await channel.close()


async def test_drain_under_load_then_activate(cluster, admin):
    create_topics(cluster, "drain", 6)
    victim = cluster.brokers[2]
    owned = await topics_of(admin, victim.broker_id)
    assert owned
    producer = ResilientProducer(cluster, owned[0])
    producer.go.clear()
    producer.start()
    consumer = ResilientConsumer(cluster, owned[0])
    try:
        wait_for(lambda: producer.reconnects, what="the producer")
        consumer.start()
        wait_for(lambda: consumer.reconnects, what="the consumer")
        producer.go.set()
        wait_for(lambda: len(consumer.received) >= 50, what="messages flowing")
        dry = await admin.call("BrokerAdmin", "UnloadBroker", adm.UnloadBrokerRequest(
            broker_id=victim.broker_id, dry_run=True))
        assert (dry.started, dry.total) == (False, len(owned))
        result = await admin.call("BrokerAdmin", "UnloadBroker", adm.UnloadBrokerRequest(
            broker_id=victim.broker_id, max_parallel=2, timeout_seconds=30))
        assert (result.started, result.total, result.succeeded, result.failed) == \
            (True, len(owned), len(owned), 0), result
        assert await topics_of(admin, victim.broker_id) == []
        assert (await brokers_by_id(admin))[victim.broker_id].broker_status == "drained"
        acked = len(producer.acked)
        wait_for(lambda: len(producer.acked) >= acked + 50, what="publishing after the drain")
        producer.stop()
        wait_for(lambda: consumer.has_all(producer.acked), timeout=30,
                 what="every acknowledged message received")
    finally:
        producer.stop()
        consumer.stop()
    # A drained broker gets no new topic ...
    create_topics(cluster, "after-drain", 3)
    assert await topics_of(admin, victim.broker_id) == []
    # ... until it is activated.
    r = await admin.call("BrokerAdmin", "ActivateBroker", adm.ActivateBrokerRequest(
        broker_id=victim.broker_id, reason="test"))
    assert r.success
    assert (await brokers_by_id(admin))[victim.broker_id].broker_status == "active"


async def test_rebalance_after_a_fourth_broker_joins(cluster, admin):
    create_topics(cluster, "rebal", 9)
    fourth = cluster.add("b3")
    await async_wait_for(lambda: _registered(admin, fourth.broker_id),
                         what="the fourth broker listed")
    balance = await admin.call("BrokerAdmin", "GetClusterBalance")
    assert balance.broker_count == 4 and balance.assignment_strategy == "Fair"
    assert balance.coefficient_of_variation > 0.2
    assert {b.topic_count for b in balance.brokers if str(b.broker_id) == fourth.broker_id} \
        == {0}
    # Automatic rebalancing is off: it moves nothing (it would within a second or two if it
    # were on). Its history, not the fourth broker's topics, is the witness: on a loaded
    # machine a broker may miss its lease and fail its topics over to the newcomer.
    await asyncio.sleep(4)
    store = await EtcdStore.open([cluster.etcd.endpoint])
    try:
        assert await store.scan("/cluster/rebalancing_history") == []
    finally:
        await store.close()
    # The first move goes to the least loaded broker: the newcomer, unless a broker that
    # missed its lease on a loaded machine already failed topics over to it.
    now = await admin.call("BrokerAdmin", "GetClusterBalance")
    fewest = min(b.topic_count for b in now.brokers)
    least = {str(b.broker_id) for b in now.brokers if b.topic_count == fewest}
    dry = await admin.call("BrokerAdmin", "TriggerRebalance",
                           adm.RebalanceRequest(dry_run=True))
    assert dry.success and dry.moves_executed == 0 and dry.proposed_moves
    assert str(dry.proposed_moves[0].to_broker) in least, (dry.proposed_moves, now)
    one = await admin.call("BrokerAdmin", "TriggerRebalance",
                           adm.RebalanceRequest(max_moves=1))
    assert one.success and one.moves_executed == 1
    rest = await admin.call("BrokerAdmin", "TriggerRebalance", adm.RebalanceRequest())
    assert rest.success, rest.error_message
    after = await admin.call("BrokerAdmin", "GetClusterBalance")
    assert after.coefficient_of_variation < 0.2, after
    assert len(await topics_of(admin, fourth.broker_id)) >= 1
    again = await admin.call("BrokerAdmin", "TriggerRebalance", adm.RebalanceRequest())
    assert again.moves_executed == 0 and "balanced" in again.error_message


async def _registered(admin, broker_id):
    return broker_id in await brokers_by_id(admin)
