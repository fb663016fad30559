"""RBAC with default deny on a real broker (issue 22): each RPC of the reference's table
(b.8) is refused without a binding and allowed with one for its permission on its resource;
bindings at topic scope do not leak to another topic; namespace and cluster bindings are
inherited; refused calls leave the data as it was. Streams: test_security_streams.py."""

import uuid

import grpc
import pytest

from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.proto import EdgeReplicator_pb2 as edge
from danube.proto import SchemaRegistry_pb2 as sr
from secure_broker import SUPER, Security, broker_fixture, token
from secure_broker import admin, client  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(180)

DENIED = grpc.StatusCode.PERMISSION_DENIED


broker = broker_fixture("rbac", "--prom-exporter", "127.0.0.1:0",
                        jwt_extra="leeway_seconds: 0\n")


@pytest.fixture(scope="module")
def sec(admin):
    s = Security(admin)
    for perm in ("Lookup", "Produce", "Consume", "Replicate", "ManageNamespace", "ManageTopic",
                 "ManageSchema", "ManageBroker", "ManageCluster"):
        s.role(f"only-{perm}", perm)
    return s


def _unique(prefix="t"):
    return f"/default/{prefix}-{uuid.uuid4().hex[:8]}"


def _producer(client, topic, tok):
    return client.call("/danube.ProducerService/CreateProducer", pb.ProducerRequest(
        request_id=1, producer_name=f"p-{uuid.uuid4().hex[:6]}", topic_name=topic,
        dispatch_strategy=pb.Reliable), pb.ProducerResponse, token=tok).producer_id


def _consumer(client, topic, tok, sub="s"):
    return client.call("/danube.ConsumerService/Subscribe", pb.ConsumerRequest(
        request_id=1, topic_name=topic, consumer_name=f"c-{uuid.uuid4().hex[:6]}",
        subscription=sub, subscription_type=pb.ConsumerRequest.Shared),
        pb.ConsumerResponse, token=tok).consumer_id


@pytest.fixture(scope="module")
def fixtures(client):
    """A reliable topic with a producer and a consumer, made by the super admin."""
    su = token(SUPER)
    topic = _unique("table")
    producer_id = _producer(client, topic, su)
    consumer_id = _consumer(client, topic, su)
    return {"topic": topic, "producer": producer_id, "consumer": consumer_id}


def _msg(f):
    return pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=f["producer"],
                                                          topic_name=f["topic"]),
                            payload=b"x", producer_name="p")


def _ack_id(f):
    return pb.MsgID(producer_id=f["producer"], topic_name=f["topic"], topic_offset=0)


# (port, path, request(f), response class, permission, scope, resource(f))
TABLE = [
    ("client", "/danube.Discovery/TopicLookup",
     lambda f: pb.TopicLookupRequest(request_id=1, topic=f["topic"]), pb.TopicLookupResponse,
     "Lookup", "topic", None),
    ("client", "/danube.Discovery/TopicPartitions",
     lambda f: pb.TopicLookupRequest(request_id=1, topic=f["topic"]),
     pb.TopicPartitionsResponse, "Lookup", "topic", None),
    ("client", "/danube.ProducerService/CreateProducer",
     lambda f: pb.ProducerRequest(request_id=1, producer_name="table-p", topic_name=f["topic"],
                                  dispatch_strategy=pb.Reliable),
     pb.ProducerResponse, "Produce", "topic", None),
    ("client", "/danube.ProducerService/SendMessage", _msg, pb.MessageResponse, "Produce",
     "topic", None),
    ("client", "/danube_ext.BatchProducer/SendMessages",
     lambda f: ext.MessageBatch(request_id=1, producer_id=f["producer"],
                                messages=[pb.StreamMessage(payload=b"y")]),
     ext.BatchResponse, "Produce", "topic", None),
    ("client", "/danube.ConsumerService/Subscribe",
     lambda f: pb.ConsumerRequest(request_id=1, topic_name=f["topic"], consumer_name="tc",
                                  subscription="s2",
                                  subscription_type=pb.ConsumerRequest.Shared),
     pb.ConsumerResponse, "Consume", "topic", None),
    ("client", "/danube.ConsumerService/Ack",
     lambda f: pb.AckRequest(request_id=1, msg_id=_ack_id(f), subscription_name="s"),
     pb.AckResponse, "Consume", "topic", None),
    ("client", "/danube.ConsumerService/Nack",
     lambda f: pb.NackRequest(request_id=1, msg_id=_ack_id(f), subscription_name="s"),
     pb.NackResponse, "Consume", "topic", None),
    ("client", "/danube_ext.TopicHistory/GetOffsets",
     lambda f: ext.OffsetsRequest(topic=f["topic"]), ext.OffsetsResponse, "Consume", "topic",
     None),
    ("client", "/danube_schema.SchemaRegistry/ListSubjects",
     lambda f: sr.ListSubjectsRequest(), sr.ListSubjectsResponse, "ManageSchema", "cluster",
     None),
    ("client", "/danube_schema.SchemaRegistry/GetLatestSchema",
     lambda f: sr.GetLatestSchemaRequest(subject="subj-a"), sr.GetSchemaResponse,
     "ManageSchema", "topic", lambda f: "subj-a"),
    ("admin", "/danube_schema.SchemaRegistry/GetTopicSchemaConfig",
     lambda f: sr.GetTopicSchemaConfigRequest(topic_name=f["topic"]),
     sr.GetTopicSchemaConfigResponse, "ManageSchema", "topic", None),
    ("client", "/danube.edge.EdgeReplicatorService/RegisterEdge",
     lambda f: edge.RegisterEdgeRequest(edge_name="default"), edge.RegisterEdgeResponse,
     "Replicate", "namespace", lambda f: "default"),
    ("client", "/danube.edge.EdgeReplicatorService/EdgeHeartbeat",
     lambda f: edge.EdgeHeartbeatRequest(edge_name="default"), edge.EdgeHeartbeatResponse,
     "Replicate", "namespace", lambda f: "default"),
    ("admin", "/danube_admin.BrokerAdmin/ListBrokers", lambda f: adm.Empty(),
     adm.BrokerListResponse, "ManageBroker", "cluster", None),
    ("admin", "/danube_admin.BrokerAdmin/ListNamespaces", lambda f: adm.Empty(),
     adm.NamespaceListResponse, "ManageNamespace", "cluster", None),
    ("admin", "/danube_admin.NamespaceAdmin/GetNamespaceTopics",
     lambda f: adm.NamespaceRequest(name="default"), adm.TopicListResponse,
     "ManageNamespace", "namespace", lambda f: "default"),
    ("admin", "/danube_admin.TopicAdmin/ListNamespaceTopics",
     lambda f: adm.NamespaceRequest(name="default"), adm.TopicInfoListResponse,
     "ManageTopic", "namespace", lambda f: "default"),
    ("admin", "/danube_admin.TopicAdmin/DescribeTopic",
     lambda f: adm.DescribeTopicRequest(name=f["topic"]), adm.DescribeTopicResponse,
     "ManageTopic", "topic", None),
    ("admin", "/danube_admin.TopicAdmin/ListSubscriptions",
     lambda f: adm.TopicRequest(name=f["topic"]), adm.SubscriptionListResponse,
     "ManageTopic", "topic", None),
    ("admin", "/danube_ext.TopicStatsService/GetTopicStats",
     lambda f: ext.TopicStatsRequest(name=f["topic"]), ext.TopicStatsResponse,
     "ManageTopic", "topic", None),
    ("admin", "/danube_admin.SecurityAdmin/ListAllBindings", lambda f: adm.Empty(),
     adm.ListBindingsResponse, "ManageCluster", "cluster", None),
    # registered once the metadata store is known: still behind the guard
    ("admin", "/danube_admin.ClusterAdmin/ClusterStatus", lambda f: adm.Empty(),
     adm.ClusterStatusResponse, "ManageCluster", "cluster", None),
]


def _ids(row):
    return row[1].rsplit("/", 2)[-2].split(".")[-1] + "/" + row[1].rsplit("/", 1)[-1]


@pytest.mark.parametrize("row", TABLE, ids=[_ids(r) for r in TABLE])
def test_each_rpc_needs_its_permission_on_its_resource(client, admin, sec, fixtures, row):
    port, path, request, response_cls, permission, scope, resource = row
    caller = client if port == "client" else admin
    subject = f"u-{uuid.uuid4().hex[:8]}"
    tok = token(subject)
    code, details = caller.code(path, request(fixtures), response_cls, token=tok)
    assert code == DENIED, (code, details)
    assert f"service_account:{subject}" in details and permission in details
    # A binding of another permission on the right resource does not help.
    name = "" if scope == "cluster" else (resource(fixtures) if resource else fixtures["topic"])
    other = "Lookup" if permission != "Lookup" else "Produce"
    sec.bind(f"{subject}-other", subject, [f"only-{other}"], scope, name)
    assert caller.code(path, request(fixtures), response_cls, token=tok)[0] == DENIED
    sec.bind(f"{subject}-b", subject, [f"only-{permission}"], scope, name)
    code, details = caller.code(path, request(fixtures), response_cls, token=tok)
    # Allowed, and answered by the service itself (NOT_FOUND: the schema subject is unknown).
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND), (code, details)
    sec.unbind(f"{subject}-b", scope, name)
    assert caller.code(path, request(fixtures), response_cls, token=tok)[0] == DENIED


def test_receive_messages_needs_consume_on_the_consumers_topic(client, sec, fixtures):
    subject = f"u-{uuid.uuid4().hex[:8]}"
    tok = token(subject)
    request = pb.ReceiveRequest(request_id=1, consumer_id=fixtures["consumer"])
    with pytest.raises(grpc.RpcError) as info:
        next(client.stream("/danube.ConsumerService/ReceiveMessages", request,
                           pb.StreamMessage, token=tok, timeout=5))
    assert info.value.code() == DENIED
    sec.bind(f"{subject}-b", subject, ["only-Consume"], "topic", fixtures["topic"])
    # Allowed: the stream delivers what the table's sends left, or waits until the deadline.
    try:
        assert next(client.stream("/danube.ConsumerService/ReceiveMessages", request,
                                  pb.StreamMessage, token=tok, timeout=1.5)).payload
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc.details()


def test_health_check_needs_authentication_only(client):
    code, _ = client.code("/danube.HealthCheck/HealthCheck",
                          pb.HealthCheckRequest(request_id=1, client=0, id=12345),
                          pb.HealthCheckResponse, token=token("nobody-bound"))
    assert code == grpc.StatusCode.OK


def _can_produce(client, topic, tok):
    try:
        _producer(client, topic, tok)
        return True
    except grpc.RpcError as exc:
        assert exc.code() == DENIED, exc.details()
        return False


def test_a_topic_binding_does_not_leak_to_another_topic(client, sec):
    subject = f"u-{uuid.uuid4().hex[:8]}"
    tok = token(subject)
    mine, other = _unique("mine"), _unique("other")
    sec.bind(f"{subject}-b", subject, ["only-Produce"], "topic", mine)
    assert _can_produce(client, mine, tok)
    assert not _can_produce(client, other, tok)
    # Nor to a topic whose name merely starts the same.
    assert not _can_produce(client, mine + "x", tok)
    # Nor to another principal, or the same name with another principal type.
    assert not _can_produce(client, mine, token(subject + "2"))
    assert not _can_produce(client, mine, token(subject, principal_type="user"))


def test_namespace_and_cluster_bindings_are_inherited(client, admin, sec):
    su = token(SUPER)
    admin.call("/danube_admin.NamespaceAdmin/CreateNamespace",
               adm.NamespaceRequest(name="rbac-other"), adm.NamespaceResponse, token=su)
    subject = f"u-{uuid.uuid4().hex[:8]}"
    tok = token(subject)
    sec.bind(f"{subject}-ns", subject, ["only-Produce"], "namespace", "default")
    assert _can_produce(client, _unique("ns"), tok)
    assert not _can_produce(client, f"/rbac-other/t-{uuid.uuid4().hex[:6]}", tok)
    sec.bind(f"{subject}-cl", subject, ["only-Produce"], "cluster")
    assert _can_produce(client, f"/rbac-other/t-{uuid.uuid4().hex[:6]}", tok)


def test_a_partitioned_topics_binding_covers_its_partitions(client, sec):
    subject = f"u-{uuid.uuid4().hex[:8]}"
    tok = token(subject)
    base = _unique("parts")
    sec.bind(f"{subject}-b", subject, ["only-Produce"], "topic", base)
    assert _can_produce(client, f"{base}-part-0", tok)
    assert not _can_produce(client, f"{base}x-part-0", tok)


def test_send_message_is_checked_against_the_producers_own_topic(client, sec):
    # A message claiming a topic the sender may produce to, sent through a producer of a
    # topic it may not, is refused.
    su = token(SUPER)
    theirs = _unique("theirs")
    producer_id = _producer(client, theirs, su)
    subject = f"u-{uuid.uuid4().hex[:8]}"
    mine = _unique("mine")
    sec.bind(f"{subject}-b", subject, ["only-Produce"], "topic", mine)
    msg = pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=producer_id,
                                                         topic_name=mine), payload=b"x")
    code, details = client.code("/danube.ProducerService/SendMessage", msg,
                                pb.MessageResponse, token=token(subject))
    assert code == DENIED and theirs in details


def test_super_admins_and_broker_internal_bypass_rbac(client):
    assert _can_produce(client, _unique("su"), token(SUPER))
    assert _can_produce(client, _unique("bi"), token("peer", principal_type="broker_internal"))


def test_permission_denied_names_principal_permission_and_resource(client):
    topic = _unique("msg")
    code, details = client.code("/danube.Discovery/TopicLookup",
                                pb.TopicLookupRequest(request_id=1, topic=topic),
                                pb.TopicLookupResponse, token=token("carol", principal_type="user"))
    assert code == DENIED
    assert "user:carol" in details and "Lookup" in details and topic in details


def test_authorization_metrics_count_allows_and_denies(broker, client):
    import re
    import urllib.request

    def scrape():
        url = f"http://127.0.0.1:{broker.prom_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        # Without the broker="<id>" label every series carries (upstream's global label).
        text = re.sub(r'broker="\d+",?', "", text).replace("{}", "")
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line.startswith("danube_auth")}

    key = 'danube_authz_deny_total{permission="Lookup",resource="topic"}'
    before = scrape().get(key, 0)
    client.code("/danube.Discovery/TopicLookup",
                pb.TopicLookupRequest(request_id=1, topic=_unique("m")),
                pb.TopicLookupResponse, token=token("metrics-nobody"))
    after = scrape()
    assert after[key] == before + 1
    assert after.get('danube_authz_allow_total{permission="Produce",resource="topic"}', 0) > 0
    assert "danube_authn_failures_total" in after


def test_refused_calls_leave_the_data_as_it_was(client, admin, fixtures):
    """Nothing of a refused call reaches the broker's data: no message stored, no topic,
    no subscription, no namespace."""
    su = token(SUPER)

    def latest():
        resp = client.call("/danube_ext.TopicHistory/GetOffsets",
                           ext.OffsetsRequest(topic=fixtures["topic"]), ext.OffsetsResponse,
                           token=su)
        return [(p.topic, p.latest) for p in resp.partitions]

    def state():
        subs = admin.call("/danube_admin.TopicAdmin/ListSubscriptions",
                          adm.TopicRequest(name=fixtures["topic"]),
                          adm.SubscriptionListResponse, token=su).subscriptions
        topics = admin.call("/danube_admin.NamespaceAdmin/GetNamespaceTopics",
                            adm.NamespaceRequest(name="default"), adm.TopicListResponse,
                            token=su).topics
        spaces = admin.call("/danube_admin.BrokerAdmin/ListNamespaces", adm.Empty(),
                            adm.NamespaceListResponse, token=su).namespaces
        return latest(), sorted(subs), sorted(topics), sorted(spaces)

    before = state()
    for tok in (token("mallory"), token(SUPER, secret_key="forged-forged-forged-forged-xx"),
                None):
        kw = {"token": tok}
        for path, request, resp in [
                ("/danube.ProducerService/SendMessage", _msg(fixtures), pb.MessageResponse),
                ("/danube_ext.BatchProducer/SendMessages",
                 ext.MessageBatch(request_id=1, producer_id=fixtures["producer"],
                                  messages=[pb.StreamMessage(payload=b"z")]),
                 ext.BatchResponse),
                ("/danube.ConsumerService/Subscribe",
                 pb.ConsumerRequest(request_id=1, topic_name=fixtures["topic"],
                                    consumer_name="m", subscription="mallory-sub"),
                 pb.ConsumerResponse),
                ("/danube.ProducerService/CreateProducer",
                 pb.ProducerRequest(request_id=1, producer_name="m",
                                    topic_name="/default/mallory-topic"), pb.ProducerResponse)]:
            code, _ = client.code(path, request, resp, **kw)
            assert code in (DENIED, grpc.StatusCode.UNAUTHENTICATED)
        code, _ = admin.code("/danube_admin.NamespaceAdmin/CreateNamespace",
                             adm.NamespaceRequest(name="mallory-ns"), adm.NamespaceResponse, **kw)
        assert code in (DENIED, grpc.StatusCode.UNAUTHENTICATED)
    assert state() == before
