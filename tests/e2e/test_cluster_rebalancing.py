"""Automatic rebalancing with real processes: three brokers on one etcd, rebalancing on
(aggressive: CV threshold 0.2, a check every second, 3 s between moves, 2 moves an hour).

Nine reliable topics spread 3/3/3; a fourth broker joins; with no admin call the leader
moves topics to it, one per check, until the coefficient of variation is under 0.2 (two
moves: 3/2/2/2), while producers and consumers run on the topics that move first: every
acknowledged message reaches its consumer, in order. The two moves are at least the
cooldown apart. Then a fifth broker joins: the cluster is imbalanced again, but the hour's
budget is spent, so nothing moves. (Rebalancing off: tests/e2e/test_cluster_admin.py.)"""

import asyncio
import time

import grpc
import pytest

from cluster_clients import ResilientConsumer, ResilientProducer
from cluster_process import etcd_cluster
from danube.client.admin import AdminClient
from danube.metadata.etcd import EtcdStore
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import create_producer
from official_client import unique_topic
from waiting import async_wait_for, wait_for

COOLDOWN = 3
REBALANCING = {"enabled": True, "aggressiveness": "aggressive", "check_interval_seconds": 1,
               "max_moves_per_hour": 2, "cooldown_seconds": COOLDOWN,
               "min_brokers_for_rebalance": 2, "min_topic_age_seconds": 2,
               "blacklist_topics": ["/blocked/*"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # A longer lease than the failover tests': a broker of a loaded machine missing its
    # renewal would move topics by failover, not by rebalancing.
    with etcd_cluster(tmp_path_factory, lease=6, rebalancing=REBALANCING) as brokers:
        yield brokers


@pytest.fixture
async def admin(cluster):
    client = AdminClient(f"http://{cluster.brokers[0].admin_addr}")
    yield client
    await client.close()


async def owned(admin):
    """broker id -> its topics, from ListBrokers and ListBrokerTopics."""
    brokers = (await admin.call("BrokerAdmin", "ListBrokers")).brokers
    result = {}
    for b in brokers:
        r = await admin.call("TopicAdmin", "ListBrokerTopics",
                             adm.BrokerRequest(broker_id=b.broker_id))
        result[b.broker_id] = sorted(t.name for t in r.topics)
    return result


async def history(cluster):
    store = await EtcdStore.open([cluster.etcd.endpoint])
    try:
        return [value for _, value in await store.scan("/cluster/rebalancing_history")]
    finally:
        await store.close()


async def test_a_fourth_broker_gets_topics_without_an_admin_call(cluster, admin):
    with grpc.insecure_channel(cluster.brokers[0].client_addr) as ch:
        for i in range(9):
            try:
                create_producer(ch, unique_topic(f"rebal{i}"), "p", pb.Reliable)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE   # placed elsewhere
    created = time.monotonic()
    before = await owned(admin)
    assert sorted(len(t) for t in before.values()) == [3, 3, 3]
    # The leader moves the last topic (by name) of the most loaded broker first.
    loaded = [topics[-1] for topics in before.values()]
    clients = [(ResilientProducer(cluster, t), ResilientConsumer(cluster, t)) for t in loaded]
    try:
        for producer, consumer in clients:
            producer.go.clear()
            producer.start()
            wait_for(lambda p=producer: p.reconnects, what="a producer")
            consumer.start()
            wait_for(lambda c=consumer: c.reconnects, what="a consumer")
            producer.go.set()
        wait_for(lambda: all(len(c.received) >= 20 for _, c in clients),
                 what="messages flowing")
        # Every topic old enough to move (min_topic_age_seconds), so that the plan's choice
        # is the last topic by name of the most loaded broker.
        time.sleep(max(0.0, created + REBALANCING["min_topic_age_seconds"] + 0.5 -
                       time.monotonic()))
        fourth = cluster.add("b3")
        started = time.monotonic()

        async def balanced():
            balance = await admin.call("BrokerAdmin", "GetClusterBalance")
            return balance.broker_count == 4 and balance.coefficient_of_variation < 0.2
        await async_wait_for(balanced, timeout=60, what="the CV under 0.2", interval=0.2)
        after = await owned(admin)
        assert len(after[fourth.broker_id]) == 2, after
        moved = set(after[fourth.broker_id])
        assert moved <= set(loaded)      # the topics under load are the ones that moved
        acked = [len(p.acked) for p, _ in clients]
        wait_for(lambda: all(len(p.acked) >= n + 20 for (p, _), n in zip(clients, acked)),
                 timeout=30, what="publishing after the moves")
        for producer, _ in clients:
            producer.stop()
        for producer, consumer in clients:
            wait_for(lambda p=producer, c=consumer: c.has_all(p.acked), timeout=30,
                     what=f"every acknowledged message of {producer.topic} received")
            first_seen = list(dict.fromkeys(consumer.received))
            order = {p: i for i, p in enumerate(producer.acked)}
            ranks = [order[p] for p in first_seen if p in order]
            assert ranks == sorted(ranks), producer.topic
    finally:
        for producer, consumer in clients:
            producer.stop()
            consumer.stop()
    moves = sorted(await history(cluster), key=lambda m: m["timestamp"])
    assert [m["topic"] for m in moves] and {m["topic"] for m in moves} == moved
    assert {str(m["to_broker"]) for m in moves} == {fourth.broker_id}
    print(f"rebalanced in {time.monotonic() - started:.1f}s: {[m['topic'] for m in moves]}")


async def test_moves_keep_the_cooldown_apart(cluster):
    store = await EtcdStore.open([cluster.etcd.endpoint])
    try:
        rows = await store.scan("/cluster/rebalancing_history")
    finally:
        await store.close()
    stamps = sorted(int(key.rsplit("/", 1)[1]) for key, _ in rows)
    assert len(stamps) == 2
    assert stamps[1] - stamps[0] >= COOLDOWN * 1000 - 50, stamps


async def test_no_move_past_the_hourly_budget(cluster, admin):
    fifth = cluster.add("b4")
    await async_wait_for(lambda: _listed(admin, fifth.broker_id), what="the fifth broker",
                         interval=0.1)
    balance = await admin.call("BrokerAdmin", "GetClusterBalance")
    assert balance.coefficient_of_variation > 0.2
    await asyncio.sleep(5 * REBALANCING["check_interval_seconds"] + COOLDOWN)
    # The history is the witness (a broker of a loaded machine missing its lease would fail
    # its topics over to the newcomer, which is no rebalancing move).
    assert len(await history(cluster)) == 2
    leader = (await admin.call("BrokerAdmin", "GetLeaderBroker")).leader
    log = next(b for b in cluster.brokers if b.broker_id == leader).log()
    assert "automatic rebalancing on" in log


async def _listed(admin, broker_id):
    brokers = (await admin.call("BrokerAdmin", "ListBrokers")).brokers
    return broker_id in {b.broker_id for b in brokers}


def test_upstreams_cluster_metrics_moved(cluster):
    """Upstream's cluster metrics, summed over the brokers after the moves above (a
    standalone broker exports them unmoved: tests/e2e/test_upstream_metrics.py)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    totals, labels = {}, {}
    for broker in cluster.live:
        body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                      timeout=10).read().decode()
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
                labels.setdefault(sample.name, set()).update(sample.labels)
    # upstream's labels
    assert {"broker_id", "action"} <= labels["danube_broker_assignments_total"]
    assert {"reason", "topic_ns"} <= labels["danube_client_redirects_total"]
    assert "reason" in labels["danube_rebalancing_moves_total"]
    assert totals["danube_leader_election_state"] == 1          # one leader
    assert totals["danube_broker_assignments_total"] > 0
    assert totals["danube_client_redirects_total"] > 0
    assert totals["danube_rebalancing_moves_total"] >= 2
    assert totals["danube_rebalancing_cycle_duration_seconds_count"] > 0
    assert totals["danube_cluster_imbalance_cv"] > 0           # the fifth broker: imbalanced
    assert "danube_rebalancing_failures_total" in totals
