"""Upstream's /ui/v1 API over a cluster: two brokers on a real etcd, a real Prometheus
scraping both (each target labelled with its broker ID), `danube admin serve` on one
broker's admin port. The cluster page lists both brokers and the leader, each broker's
topics are the ones the load manager gave it (with their producers, through Prometheus),
a broker's page answers for the broker the console is not connected to, and the balance
and a dry-run unload speak for the whole cluster."""

import asyncio
import uuid

import pytest

from admin_serve import AdminServe
from cluster_process import etcd_cluster
from prometheus_process import PrometheusProcess
from waiting import async_wait_for
from danube.client import DanubeClient
from danube.client.admin import AdminClient
from danube.proto import DanubeAdmin_pb2 as adm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with etcd_cluster(tmp_path_factory, n=2) as brokers:
        yield brokers


@pytest.fixture(scope="module")
def prometheus(cluster, tmp_path_factory):
    p = PrometheusProcess(tmp_path_factory.mktemp("prom"), {
        f"127.0.0.1:{b.prom_port}": b.broker_id for b in cluster.brokers}).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def ui(cluster, prometheus):
    s = AdminServe("--broker-endpoint", f"http://{cluster.brokers[0].admin_addr}",
                   "--prometheus-url", prometheus.url, "--cache-ttl-ms", "0")
    yield s
    assert s.stop() == 0


async def get(ui, path):
    return await asyncio.to_thread(ui.get, path)


async def test_cluster_pages_cover_every_broker(cluster, prometheus, ui):
    ids = {b.broker_id for b in cluster.brokers}
    assert None not in ids
    admin = AdminClient(f"http://{cluster.brokers[0].admin_addr}")
    names = [f"/default/ui-cluster-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    for name in names:
        await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(name=name))

    async def placed():
        topics = (await admin.call("TopicAdmin", "ListNamespaceTopics",
                                   adm.NamespaceRequest(name="default"))).topics
        owners = {t.name: t.broker_id for t in topics if t.name in names}
        return owners if len(owners) == 4 and all(owners.values()) else None
    owners = await async_wait_for(placed, timeout=60, what="the topics assigned")

    # a producer on one topic, connected to its owner through the lookup
    client = DanubeClient(f"http://{cluster.brokers[0].client_addr}")
    producer = await client.create_producer(names[0], "p1")
    await producer.send(b"hello")
    owner_of_0 = owners[names[0]]
    await async_wait_for(lambda: prometheus.value(
        f'danube_topic_active_producers{{topic="{names[0]}",broker="{owner_of_0}"}}') >= 1,
        timeout=30, what="prometheus sees the producer on its owner")

    status, _, body = await get(ui, "/ui/v1/cluster")
    assert status == 200 and body["errors"] == []
    assert {b["broker_id"] for b in body["brokers"]} == ids
    assert sorted(b["broker_role"] for b in body["brokers"]) == [
        "Cluster_Follower", "Cluster_Leader"]
    assert body["totals"]["broker_count"] == 2
    by_id = {b["broker_id"]: b for b in body["brokers"]}
    assert by_id[owner_of_0]["stats"]["rpc_total"] > 0        # the producer's calls
    assert by_id[owner_of_0]["stats"]["active_connections"] >= 1
    owned = {b["broker_id"]: b["stats"]["topics_owned"] for b in body["brokers"]}
    for broker_id in ids:
        assert owned[broker_id] >= sum(1 for o in owners.values() if o == broker_id)

    status, _, body = await get(ui, "/ui/v1/topics")
    assert status == 200 and body["errors"] == []
    listed = {t["name"]: (entry["broker"]["broker_id"], t)
              for entry in body["brokers"] for t in entry["topics"]}
    for name in names:
        assert listed[name][0] == owners[name]
    assert listed[names[0]][1]["producers_connected"] == 1

    for broker_id in ids:           # the broker the console is not connected to as well
        status, _, body = await get(ui, f"/ui/v1/brokers/{broker_id}")
        assert status == 200 and body["broker"]["broker_id"] == broker_id
        assert {t["name"] for t in body["topics"]} >= {
            n for n, o in owners.items() if o == broker_id}

    status, _, body = await get(ui, "/ui/v1/cluster/balance")
    assert status == 200 and body["broker_count"] == 2 and len(body["brokers"]) == 2
    other = next(i for i in ids if i != cluster.brokers[0].broker_id)
    status, _, body = await asyncio.to_thread(
        ui.post, "/ui/v1/cluster/actions",
        {"action": "unload", "broker_id": other, "dry_run": True})
    assert status == 200 and body["message"].startswith("started=")

    await producer.close()
    await client.close()
    await admin.close()
