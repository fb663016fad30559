"""ClusterAdmin.ClusterStatus in upstream's shape from the metadata store's facts, through
the admin gRPC API, `danube admin cluster status` and upstream's /ui/v1/cluster/raft:

- a standalone broker on its embedded store: a group of one, this broker its voter and
  leader, last_applied the store's revision (it moves with metadata changes);
- a cluster on a real etcd: etcd's Raft group (the member ids, its leader, the member the
  broker talks to, a learner added with etcd's own member API);

and upstream's danube_client_redirects_total{reason, topic_ns} fed by the calls upstream
counts: a producer that created a topic the leader placed elsewhere (post_create), a
producer or consumer on a broker that does not own the topic (not_local); lookups answered
Redirect are not counted, as upstream."""

import asyncio
import json
import subprocess
import sys
import urllib.request
import uuid

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from admin_serve import AdminServe
from broker_process import BrokerProcess
from cluster_process import etcd_cluster
from grpc_calls import create_producer, subscribe, unary
from ports import free_port
from waiting import async_wait_for, wait_for
from danube.client import errors
from danube.client.admin import AdminClient
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.status import StatusCode


def cli_status(admin_addr):
    out = subprocess.run(
        [sys.executable, "-P", "-m", "danube", "admin", "cluster", "status", "--endpoint",
         f"http://{admin_addr}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def as_ui(status):
    """What upstream's /ui/v1/cluster/raft makes of a ClusterStatusResponse."""
    return {"leader_id": str(status.leader_id), "current_term": status.current_term,
            "last_applied": status.last_applied, "voters": [str(v) for v in status.voters],
            "learners": [str(v) for v in status.learners],
            "self_node_id": str(status.self_node_id), "raft_addr": status.raft_addr}


# -- standalone ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("status-standalone")).start()
    yield b
    b.stop()


async def test_standalone_is_a_group_of_one(standalone):
    async with AdminClient(f"http://{standalone.admin_addr}") as admin:
        broker_id = (await admin.call("BrokerAdmin", "ListBrokers")).brokers[0].broker_id
        status = await admin.call("ClusterAdmin", "ClusterStatus")
        assert list(status.voters) == [int(broker_id)] and not status.learners
        assert status.leader_id == status.self_node_id == int(broker_id)
        assert status.current_term == 1 and status.raft_addr == ""
        before = status.last_applied
        assert before > 0                       # the broker's registration, at least
        await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
            name=f"/default/status-{uuid.uuid4().hex[:8]}"))
        after = (await admin.call("ClusterAdmin", "ClusterStatus")).last_applied
        assert after > before                   # a metadata change is an applied entry
        # membership changes: refused by name, before anything changes
        for method, request in (("AddNode", adm.AddNodeRequest(addr="h:1", node_id=7)),
                                ("PromoteNode", adm.PromoteNodeRequest(node_id=7)),
                                ("RemoveNode", adm.RemoveNodeRequest(node_id=7))):
            with pytest.raises(errors.DanubeError) as info:
                await admin.call("ClusterAdmin", method, request)
            assert info.value.code == StatusCode.UNIMPLEMENTED
            assert "embedded store" in str(info.value) and "etcd" in str(info.value)
        assert list((await admin.call("ClusterAdmin", "ClusterStatus")).voters) == \
            [int(broker_id)]

    out = await asyncio.to_thread(cli_status, standalone.admin_addr)
    assert f"Self Node ID:  {broker_id}" in out and f"Leader:        {broker_id}" in out
    assert f"Voters:        [{broker_id}]" in out

    ui = AdminServe("--broker-endpoint", f"http://{standalone.admin_addr}",
                    "--cache-ttl-ms", "0")
    try:
        code, _, body = await asyncio.to_thread(ui.get, "/ui/v1/cluster/raft")
        assert code == 200
        assert body == {"leader_id": broker_id, "current_term": 1,
                        "last_applied": body["last_applied"], "voters": [broker_id],
                        "learners": [], "self_node_id": broker_id, "raft_addr": ""}
        assert body["last_applied"] >= after
        code, _, body = await asyncio.to_thread(
            ui.post, "/ui/v1/cluster/raft/actions",
            {"action": "remove_node", "node_id": broker_id})
        # upstream's answer to a failed membership call: 502 with success false
        assert code == 502 and body["success"] is False
        assert "embedded store" in body["message"]
    finally:
        assert ui.stop() == 0


# -- a cluster on etcd --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with etcd_cluster(tmp_path_factory, n=2) as brokers:
        yield brokers


def etcd_call(etcd, path, body):
    with etcd._urlopen(f"/v3/{path}", json.dumps(body).encode()) as r:
        return json.loads(r.read())


async def test_etcd_cluster_status_is_etcds_raft_group(cluster):
    etcd = cluster.etcd
    own = etcd_call(etcd, "maintenance/status", {})
    voter = int(own["header"]["member_id"])
    learner = int(etcd_call(etcd, "cluster/member/add", {
        "peerURLs": [f"http://127.0.0.1:{free_port()}"], "isLearner": True})["member"]["ID"])
    try:
        async with AdminClient(f"http://{cluster.brokers[1].admin_addr}") as admin:
            status = await admin.call("ClusterAdmin", "ClusterStatus")
            assert list(status.voters) == [voter] and list(status.learners) == [learner]
            assert status.leader_id == int(own["leader"]) == voter
            assert status.self_node_id == voter
            assert status.raft_addr == f"http://127.0.0.1:{etcd.peer_port}"
            assert status.current_term == int(own["raftTerm"]) >= 1
            before = status.last_applied
            assert before >= int(own["raftAppliedIndex"]) > 0
            await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
                name=f"/default/status-{uuid.uuid4().hex[:8]}"))

            async def applied_more():
                s = await admin.call("ClusterAdmin", "ClusterStatus")
                return s.last_applied > before
            await async_wait_for(applied_more, timeout=30, what="etcd's applied index moves")
            with pytest.raises(errors.DanubeError) as info:
                await admin.call("ClusterAdmin", "PromoteNode",
                                 adm.PromoteNodeRequest(node_id=learner))
            assert "etcdctl member promote" in str(info.value)

        out = await asyncio.to_thread(cli_status, cluster.brokers[0].admin_addr)
        assert f"Learners:      [{learner}]" in out and f"Leader:        {voter}" in out

        ui = AdminServe("--broker-endpoint", f"http://{cluster.brokers[0].admin_addr}",
                        "--cache-ttl-ms", "0")
        try:
            code, _, body = await asyncio.to_thread(ui.get, "/ui/v1/cluster/raft")
            async with AdminClient(f"http://{cluster.brokers[0].admin_addr}") as admin:
                status = await admin.call("ClusterAdmin", "ClusterStatus")
            assert code == 200
            expected = as_ui(status)
            assert body["last_applied"] <= expected["last_applied"]
            assert {**body, "last_applied": 0} == {**expected, "last_applied": 0}
            assert body["voters"] == [str(voter)] and body["learners"] == [str(learner)]
        finally:
            assert ui.stop() == 0
    finally:
        etcd_call(etcd, "cluster/member/remove", {"ID": str(learner)})


def redirects(broker):
    """{(reason, topic_ns): count} of a broker's danube_client_redirects_total."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                  timeout=10).read().decode()
    return {(s.labels["reason"], s.labels["topic_ns"]): s.value
            for family in text_string_to_metric_families(body) for s in family.samples
            if s.name == "danube_client_redirects_total"}


def lookup(broker, topic):
    with grpc.insecure_channel(broker.client_addr) as ch:
        return unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=10)


def owner_url(broker, topic):
    """The broker_url `broker`'s lookup names for `topic`, None while it has no owner."""
    try:
        return lookup(broker, topic).broker_url
    except grpc.RpcError:
        return None


async def test_client_redirects_by_upstreams_reasons(cluster):
    a, b = cluster.brokers
    ns = f"redir{uuid.uuid4().hex[:8]}"
    async with AdminClient(f"http://{a.admin_addr}") as admin:
        await admin.call("NamespaceAdmin", "CreateNamespace", adm.NamespaceRequest(name=ns))
    # Producers creating topics on `a` until the leader places one on `b`: each creation
    # not served by `a` sends the producer to look it up again (post_create). On a slow
    # machine one may outlast the creation's wait and then land on `a` after all.
    sent_back, elsewhere = 0, None
    with grpc.insecure_channel(a.client_addr) as ch:
        for i in range(40):
            topic = f"/{ns}/t{i}"
            try:
                create_producer(ch, topic, f"p{i}", pb.Reliable)
                continue                                    # placed on `a`
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                sent_back += 1
            owner = wait_for(lambda: owner_url(a, topic), timeout=30,
                             what=f"{topic} placed")
            if owner == f"http://{b.client_addr}":
                elsewhere = topic
                break
    assert elsewhere is not None, "the leader placed 40 new topics on one broker of two"
    assert redirects(a).get(("post_create", ns)) == sent_back

    # `b` serves it: a producer and a consumer on `a` are sent back (not_local).
    with grpc.insecure_channel(a.client_addr) as ch:
        with pytest.raises(grpc.RpcError) as info:
            create_producer(ch, elsewhere, "late", pb.Reliable)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as info:
            subscribe(ch, elsewhere, "c", "s")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # Lookups answered Redirect are not counted (upstream counts in get_topic only).
    assert lookup(a, elsewhere).response_type == pb.TopicLookupResponse.Redirect
    counts = redirects(a)
    assert counts.get(("not_local", ns)) == 2
    assert counts.get(("post_create", ns)) == sent_back
    assert not {k for k in redirects(b) if k[1] == ns}       # nothing was sent to `b`
