"""danube.edge.EdgeReplicatorService on a real broker's client port, called as an upstream
edge calls it: through grpcio stubs generated (grpc_tools.protoc) from EdgeReplicator.proto,
which is upstream v0.15.1's file byte for byte (its sha256 is checked here).

Covers RegisterEdge (topics created under /{edge}/, reliable; a topic outside the namespace
or in a missing namespace refused per topic; schema subjects resolved), EdgeHeartbeat (fast
path, NOT_FOUND, a schema update and a deleted topic reported by config version) and
ReplicateData (acks echo batch_last_offset; a resent batch, even with other boundaries, is
stored once; an empty batch gets no ack; an unknown topic ends the stream with INTERNAL)."""

import hashlib
import importlib
import json
import os
import queue
import sys

import grpc
import pytest
from grpc_tools import protoc

from edge_process import cluster_messages, cluster_payloads
from official_client import start_broker
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_DIR = os.path.join(REPO, "protocol")
#: sha256 of danube-core/proto/EdgeReplicator.proto at upstream's v0.15.1 (86ecb39).
UPSTREAM_SHA256 = "180287a43f11d9753e5d443f10476258dd51b59606ad3535091cc84967969664"
STUB_MODULES = ("DanubeApi_pb2", "DanubeApi_pb2_grpc", "EdgeReplicator_pb2",
                "EdgeReplicator_pb2_grpc")


def test_proto_is_upstreams_file():
    with open(os.path.join(PROTO_DIR, "EdgeReplicator.proto"), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == UPSTREAM_SHA256


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("edge-stubs")
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(PROTO_DIR, "DanubeApi.proto"),
                      os.path.join(PROTO_DIR, "EdgeReplicator.proto")])
    assert rc == 0
    saved = {n: sys.modules.pop(n) for n in STUB_MODULES if n in sys.modules}
    sys.path.insert(0, str(out))
    try:
        mods = {n: importlib.import_module(n) for n in STUB_MODULES}
    finally:
        sys.path.remove(str(out))
    yield mods
    for n in STUB_MODULES:
        sys.modules.pop(n, None)
    sys.modules.update(saved)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("edge-cluster") / "data")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def channels(broker):
    with grpc.insecure_channel(broker.client_addr) as client, \
            grpc.insecure_channel(broker.admin_addr) as admin:
        yield client, admin


def _unary(channel, path, request, response_cls):
    return channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=response_cls.FromString)(request,
                                                                             timeout=10)


def create_namespace(admin, name):
    _unary(admin, "/danube_admin.NamespaceAdmin/CreateNamespace",
           adm.NamespaceRequest(name=name), adm.NamespaceResponse)


def register_schema(client, subject, definition):
    return _unary(client, "/danube_schema.SchemaRegistry/RegisterSchema",
                  sr.RegisterSchemaRequest(subject=subject, schema_type="json_schema",
                                           schema_definition=json.dumps(definition).encode()),
                  sr.RegisterSchemaResponse)


@pytest.fixture
def edge_stub(stubs, channels):
    return stubs["EdgeReplicator_pb2_grpc"].EdgeReplicatorServiceStub(channels[0])


def _msg(stubs, topic, offset, payload):
    api = stubs["DanubeApi_pb2"]
    return api.StreamMessage(msg_id=api.MsgID(topic_name=topic, topic_offset=offset),
                             payload=payload, producer_name="mqtt-gateway",
                             publish_time=1, attributes={"device_id": "d1"})


def _replicate(stub, batches, expect_acks):
    """Send ``batches`` on one ReplicateData stream; the acks, in order."""
    requests = queue.Queue()
    for b in batches:
        requests.put(b)
    requests.put(None)
    call = stub.ReplicateData(iter(requests.get, None), timeout=30)
    return [next(call) for _ in range(expect_acks)]


def test_register_creates_topics_and_resolves_schemas(stubs, channels, edge_stub, broker):
    client, admin = channels
    e = stubs["EdgeReplicator_pb2"]
    create_namespace(admin, "edgereg")
    register_schema(client, "edge-telemetry", {"type": "object", "required": ["t"]})
    resp = edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="edgereg", topics=[
        e.EdgeTopicDeclaration(topic_name="/edgereg/telemetry", schema_subject="edge-telemetry"),
        e.EdgeTopicDeclaration(topic_name="/edgereg/raw"),
        e.EdgeTopicDeclaration(topic_name="/edgereg/nosuch", schema_subject="no-such-subject"),
        e.EdgeTopicDeclaration(topic_name="/other/t"),
    ]), timeout=10)
    assert resp.success and resp.message == "edge registered" and resp.config_version == 1
    by = {t.topic_name: t for t in resp.topics}
    tel = by["/edgereg/telemetry"]
    assert tel.topic_created and tel.schema_resolved and not tel.error
    assert tel.schema.subject == "edge-telemetry" and tel.schema.schema_type == "json_schema"
    assert tel.schema.schema_version == 1 and tel.schema.fingerprint
    assert json.loads(tel.schema.schema_definition)        # upstream's serde JSON envelope
    assert by["/edgereg/raw"].schema_resolved and not by["/edgereg/raw"].HasField("schema")
    assert by["/edgereg/nosuch"].topic_created and not by["/edgereg/nosuch"].schema_resolved
    assert "under /edgereg/ namespace" in by["/other/t"].error
    # Again: nothing new is created, the version moves on (upstream re-registration).
    again = edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="edgereg", topics=[
        e.EdgeTopicDeclaration(topic_name="/edgereg/raw")]), timeout=10)
    assert again.config_version == 2 and not again.topics[0].topic_created


def test_register_in_a_missing_namespace_is_a_topic_error(stubs, edge_stub):
    e = stubs["EdgeReplicator_pb2"]
    resp = edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="nonamespace", topics=[
        e.EdgeTopicDeclaration(topic_name="/nonamespace/t")]), timeout=10)
    assert resp.success
    assert "failed to create topic" in resp.topics[0].error
    assert "nonamespace" in resp.topics[0].error


def test_register_refuses_a_bad_edge_name(stubs, edge_stub):
    e = stubs["EdgeReplicator_pb2"]
    with pytest.raises(grpc.RpcError) as err:
        edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="a/b"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "edge_name" in err.value.details()


def test_heartbeat_reports_schema_and_topic_changes(stubs, channels, edge_stub):
    client, admin = channels
    e = stubs["EdgeReplicator_pb2"]
    with pytest.raises(grpc.RpcError) as err:
        edge_stub.EdgeHeartbeat(e.EdgeHeartbeatRequest(edge_name="neverseen", config_version=1),
                                timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "RegisterEdge" in err.value.details()
    create_namespace(admin, "edgehb")
    register_schema(client, "hb-subject", {"type": "object"})
    reg = edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="edgehb", topics=[
        e.EdgeTopicDeclaration(topic_name="/edgehb/a", schema_subject="hb-subject"),
        e.EdgeTopicDeclaration(topic_name="/edgehb/b")]), timeout=10)
    v = reg.config_version
    fast = edge_stub.EdgeHeartbeat(e.EdgeHeartbeatRequest(edge_name="edgehb", config_version=v),
                                   timeout=10)
    assert not fast.changed and fast.config_version == v and not fast.changes
    register_schema(client, "hb-subject", {"type": "object", "properties": {"x": {}}})
    slow = edge_stub.EdgeHeartbeat(e.EdgeHeartbeatRequest(edge_name="edgehb", config_version=v),
                                   timeout=10)
    assert slow.changed and slow.config_version == v + 1
    (change,) = slow.changes
    assert change.topic_name == "/edgehb/a" and change.change_type == e.SCHEMA_UPDATED
    assert change.schema.schema_version == 2
    # The edge takes the new version: fast path again.
    again = edge_stub.EdgeHeartbeat(e.EdgeHeartbeatRequest(edge_name="edgehb",
                                                           config_version=v + 1), timeout=10)
    assert not again.changed
    _unary(admin, "/danube_admin.TopicAdmin/DeleteTopic", adm.TopicRequest(name="/edgehb/b"),
           adm.TopicResponse)
    gone = edge_stub.EdgeHeartbeat(e.EdgeHeartbeatRequest(edge_name="edgehb",
                                                          config_version=v + 1), timeout=10)
    assert gone.changed and gone.config_version == v + 2
    kinds = {(c.topic_name, c.change_type) for c in gone.changes}
    assert ("/edgehb/b", e.TOPIC_REMOVED) in kinds


def test_replicate_is_idempotent(stubs, channels, edge_stub, broker):
    client, admin = channels
    e = stubs["EdgeReplicator_pb2"]
    create_namespace(admin, "edgerep")
    edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="edgerep", topics=[
        e.EdgeTopicDeclaration(topic_name="/edgerep/t")]), timeout=10)
    topic = "/edgerep/t"
    first = e.ReplicateBatch(topic_name=topic, batch_last_offset=4,
                             messages=[_msg(stubs, topic, i, b"m%d" % i) for i in range(5)])
    acks = _replicate(edge_stub, [first, e.ReplicateBatch(topic_name=topic, batch_last_offset=9),
                                  first], expect_acks=2)
    # The empty batch got no ack (upstream); the resent one was acked and not stored.
    assert [(a.topic_name, a.acked_offset) for a in acks] == [(topic, 4), (topic, 4)]
    # A resend after a lost ack whose boundaries moved (0..7: 0..4 are there already).
    moved = e.ReplicateBatch(topic_name=topic, batch_last_offset=7,
                             messages=[_msg(stubs, topic, i, b"m%d" % i) for i in range(8)])
    (ack,) = _replicate(edge_stub, [moved], expect_acks=1)
    assert ack.acked_offset == 7
    assert cluster_payloads(broker.client_addr, topic) == [b"m%d" % i for i in range(8)]
    stored = cluster_messages(broker.client_addr, topic)
    assert [m.msg_id.topic_offset for m in stored] == list(range(8))
    assert stored[0].producer_name == "mqtt-gateway"
    assert dict(stored[0].attributes) == {"device_id": "d1"}


def test_replicate_to_an_unknown_topic_ends_the_stream(stubs, edge_stub):
    e = stubs["EdgeReplicator_pb2"]
    batch = e.ReplicateBatch(topic_name="/default/no-such-edge-topic", batch_last_offset=0,
                             messages=[_msg(stubs, "/default/no-such-edge-topic", 0, b"x")])
    with pytest.raises(grpc.RpcError) as err:
        _replicate(edge_stub, [batch], expect_acks=1)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details().startswith("ingestion failed:")


def test_a_new_edge_log_is_not_taken_for_a_resend(stubs, channels, edge_stub, broker):
    """An edge that starts again from an empty data directory numbers its offsets from 0
    again, under a new log id (msg_id.producer_id): its messages are stored, and its own
    resends are still skipped."""
    client, admin = channels
    e = stubs["EdgeReplicator_pb2"]
    create_namespace(admin, "edgelog")
    topic = "/edgelog/t"
    edge_stub.RegisterEdge(e.RegisterEdgeRequest(edge_name="edgelog", topics=[
        e.EdgeTopicDeclaration(topic_name=topic)]), timeout=10)

    def batch(log_id, payloads):
        msgs = [_msg(stubs, topic, i, p) for i, p in enumerate(payloads)]
        for m in msgs:
            m.msg_id.producer_id = log_id
        return e.ReplicateBatch(topic_name=topic, batch_last_offset=len(msgs) - 1,
                                messages=msgs)
    old, new = batch(11, [b"a0", b"a1", b"a2"]), batch(22, [b"b0", b"b1"])
    acks = _replicate(edge_stub, [old, new, new], expect_acks=3)
    assert [a.acked_offset for a in acks] == [2, 1, 1]
    assert cluster_payloads(broker.client_addr, topic) == [b"a0", b"a1", b"a2", b"b0", b"b1"]
