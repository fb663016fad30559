"""Hostile field values in well-formed requests, for every method the broker serves on its
client and admin ports (issue 17, the service edge).

Each case takes a correct request of one method, replaces one field with a hostile value
(empty, 64 KiB, control characters, NUL, '/', '..', unknown enum numbers, extreme integers)
and sends it with grpcio. Whatever the answer, it is never INTERNAL (upstream's Ack and Nack
answer INTERNAL for a subscription that does not exist; ours NOT_FOUND, docs/compatibility.md),
and afterwards the correct request of the same kind still succeeds:
a refused request left no producer, consumer or topic behind. At the end every topic the admin
API lists can be looked up, and the broker never logged a handler exception.
"""

import grpc
import pytest

from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext_pb
from official_client import start_broker, unique_topic

HOSTILE_STRINGS = [
    "", " ", "x" * 65536, "\x00", "a\x00b", "\n\r\t", "\x7f", "/", "..", "../..", "a/b",
    "/default/..", "\u202e", "\u00e9" * 200, "*" * 300, "t" * 239, "\ufeff",
]
HOSTILE_UINT64 = [0, 1, 2 ** 63, 2 ** 64 - 1]
HOSTILE_UINT32 = [0, 2 ** 31, 2 ** 32 - 1]
HOSTILE_ENUMS = [2, 3, 4, 99, -1, 2 ** 31 - 1, -(2 ** 31)]


def _call(channel, path, request, response_cls):
    method = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=response_cls.FromString)
    return method(request, timeout=10)


def _status(fn):
    try:
        fn()
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


class Edge:
    """The broker plus a producer and a reliable consumer that the cases point at."""

    def __init__(self, broker):
        self.broker = broker
        self.client = grpc.insecure_channel(broker.client_addr, options=[
            ("grpc.max_receive_message_length", 32 << 20)])
        self.admin = grpc.insecure_channel(broker.admin_addr)
        self.topic = unique_topic("edge")
        self.producer_id = self.call("/danube.ProducerService/CreateProducer",
                                     self.producer_req(self.topic, "edge-p", reliable=True),
                                     pb.ProducerResponse).producer_id
        self.consumer_id = self.call("/danube.ConsumerService/Subscribe",
                                     self.consumer_req(self.topic, "edge-c", "edge-s"),
                                     pb.ConsumerResponse).consumer_id

    def call(self, path, request, response_cls):
        channel = self.admin if path.startswith("/danube_admin.") else self.client
        return _call(channel, path, request, response_cls)

    @staticmethod
    def producer_req(topic, name, reliable=False):
        return pb.ProducerRequest(request_id=1, producer_name=name, topic_name=topic,
                                  producer_access_mode=pb.Shared,
                                  dispatch_strategy=pb.Reliable if reliable else pb.NonReliable)

    @staticmethod
    def consumer_req(topic, consumer, subscription, kind=pb.ConsumerRequest.Exclusive):
        return pb.ConsumerRequest(request_id=1, topic_name=topic, consumer_name=consumer,
                                  subscription=subscription, subscription_type=kind)

    def close(self):
        self.client.close()
        self.admin.close()


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    broker = start_broker(tmp_path_factory.mktemp("hostile") / "data")
    e = Edge(broker)
    yield e
    e.close()
    broker.stop()


def _mutations(request, fields):
    """(field path, value) pairs for the listed fields of `request`."""
    for path, kind in fields:
        values = {"str": HOSTILE_STRINGS, "u64": HOSTILE_UINT64, "u32": HOSTILE_UINT32,
                  "enum": HOSTILE_ENUMS, "rep_str": HOSTILE_STRINGS}[kind]
        for value in values:
            yield path, kind, value
        if kind == "rep_str":
            yield path, "rep_many", ["k"] * 1000


def _mutate(request, path, kind, value):
    req = type(request)()
    req.CopyFrom(request)
    *parents, last = path.split(".")
    target = req
    for name in parents:
        target = getattr(target, name)
    if kind == "rep_str":
        getattr(target, last)[:] = ["ok-*", value]
    elif kind == "rep_many":
        getattr(target, last)[:] = value
    else:
        setattr(target, last, value)
    return req


def _good_cases(edge):
    """Per method: (path, response class, correct-request factory taking a case number,
    hostile fields, check after a refused case). A factory gives each case fresh names, so a
    case that succeeds (a hostile value that is legal) does not disturb the next one."""
    ns = "default"

    def producer(i):
        return edge.producer_req(f"/{ns}/edge-prod-{i}", f"p{i}")

    def subscribe(i):
        return edge.consumer_req(edge.topic, f"c{i}", f"s{i}")

    def message(i):
        return pb.StreamMessage(
            request_id=i, payload=b"hello", publish_time=1, producer_name="edge-p",
            attributes={"k": "v"}, routing_key="rk",
            msg_id=pb.MsgID(producer_id=edge.producer_id, topic_name=edge.topic,
                            broker_addr="http://x"))

    def ack(i):
        return pb.AckRequest(request_id=i, subscription_name="edge-s",
                             msg_id=pb.MsgID(producer_id=edge.producer_id,
                                             topic_name=edge.topic, topic_offset=10 ** 9))

    def nack(i):
        return pb.NackRequest(request_id=i, subscription_name="edge-s", delay_ms=10,
                              reason="because",
                              msg_id=pb.MsgID(producer_id=edge.producer_id,
                                              topic_name=edge.topic, topic_offset=10 ** 9))

    def lookup(i):
        return pb.TopicLookupRequest(request_id=i, topic=edge.topic)

    def health(i):
        return pb.HealthCheckRequest(request_id=i, client=pb.HealthCheckRequest.Producer,
                                     id=edge.producer_id)

    def batch(i):
        return ext_pb.MessageBatch(request_id=i, producer_id=edge.producer_id,
                                   messages=[message(i)])

    def new_topic(i):
        return admin_pb.NewTopicRequest(name=f"/{ns}/edge-admin-{i}",
                                        dispatch_strategy=admin_pb.Reliable)

    def partitioned(i):
        return admin_pb.PartitionedTopicRequest(base_name=f"/{ns}/edge-part-{i}", partitions=2)

    def delete_topic(i):
        name = f"/{ns}/edge-del-{i}"
        edge.call("/danube_admin.TopicAdmin/CreateTopic", admin_pb.NewTopicRequest(name=name),
                  admin_pb.TopicResponse)
        return admin_pb.TopicRequest(name=name)

    def namespace(i):
        return admin_pb.NamespaceRequest(name=ns)

    def new_namespace(i):
        return admin_pb.NamespaceRequest(name=f"edge-ns-{i}")

    def delete_namespace(i):
        name = f"edge-dns-{i}"
        edge.call("/danube_admin.NamespaceAdmin/CreateNamespace",
                  admin_pb.NamespaceRequest(name=name), admin_pb.NamespaceResponse)
        return admin_pb.NamespaceRequest(name=name)

    name_fields = [("topic_name", "str"), ("producer_name", "str"),
                   ("dispatch_strategy", "enum"), ("producer_access_mode", "enum"),
                   ("request_id", "u64"), ("schema_ref.subject", "str")]
    return [
        ("/danube.ProducerService/CreateProducer", pb.ProducerResponse, producer,
         name_fields),
        ("/danube.ProducerService/SendMessage", pb.MessageResponse, message,
         [("msg_id.producer_id", "u64"), ("msg_id.topic_name", "str"),
          ("msg_id.broker_addr", "str"), ("msg_id.topic_offset", "u64"),
          ("producer_name", "str"), ("subscription_name", "str"), ("routing_key", "str"),
          ("publish_time", "u64"), ("schema_id", "u64"), ("schema_version", "u32"),
          ("request_id", "u64")]),
        ("/danube.ConsumerService/Subscribe", pb.ConsumerResponse, subscribe,
         [("topic_name", "str"), ("consumer_name", "str"), ("subscription", "str"),
          ("subscription_type", "enum"), ("key_filters", "rep_str"), ("request_id", "u64")]),
        ("/danube.ConsumerService/Ack", pb.AckResponse, ack,
         [("msg_id.topic_name", "str"), ("subscription_name", "str"),
          ("msg_id.topic_offset", "u64"), ("msg_id.producer_id", "u64")]),
        ("/danube.ConsumerService/Nack", pb.NackResponse, nack,
         [("msg_id.topic_name", "str"), ("subscription_name", "str"),
          ("msg_id.topic_offset", "u64"), ("delay_ms", "u64"), ("reason", "str")]),
        ("/danube.Discovery/TopicLookup", pb.TopicLookupResponse, lookup,
         [("topic", "str"), ("request_id", "u64")]),
        ("/danube.Discovery/TopicPartitions", pb.TopicPartitionsResponse, lookup,
         [("topic", "str")]),
        ("/danube.HealthCheck/HealthCheck", pb.HealthCheckResponse, health,
         [("client", "enum"), ("id", "u64")]),
        ("/danube_ext.BatchProducer/SendMessages", ext_pb.BatchResponse, batch,
         [("producer_id", "u64"), ("request_id", "u64")]),
        ("/danube_admin.TopicAdmin/CreateTopic", admin_pb.TopicResponse, new_topic,
         [("name", "str"), ("dispatch_strategy", "enum"), ("schema_subject", "str")]),
        ("/danube_admin.TopicAdmin/CreatePartitionedTopic", admin_pb.TopicResponse,
         partitioned, [("base_name", "str"), ("partitions", "u32"),
                       ("dispatch_strategy", "enum")]),
        ("/danube_admin.TopicAdmin/DeleteTopic", admin_pb.TopicResponse, delete_topic,
         [("name", "str")]),
        ("/danube_admin.TopicAdmin/ListNamespaceTopics", admin_pb.TopicInfoListResponse,
         namespace, [("name", "str")]),
        ("/danube_admin.NamespaceAdmin/GetNamespaceTopics", admin_pb.TopicListResponse,
         namespace, [("name", "str")]),
        ("/danube_admin.NamespaceAdmin/CreateNamespace", admin_pb.NamespaceResponse,
         new_namespace, [("name", "str")]),
        ("/danube_admin.NamespaceAdmin/DeleteNamespace", admin_pb.NamespaceResponse,
         delete_namespace, [("name", "str")]),
    ]


def test_hostile_field_values_never_internal_and_leave_nothing_behind(edge):
    failures = []
    case = 0
    for path, response_cls, good, fields in _good_cases(edge):
        for field, kind, value in _mutations(good(0), fields):
            case += 1
            request = _mutate(good(case), field, kind, value)
            code, details = _status(lambda: edge.call(path, request, response_cls))
            shown = repr(value)[:40]
            if code == grpc.StatusCode.INTERNAL:
                failures.append(f"{path} {field}={shown}: INTERNAL {details[:200]}")
            if code == grpc.StatusCode.INVALID_ARGUMENT and field.split(".")[-1] not in details:
                failures.append(f"{path} {field}={shown}: INVALID_ARGUMENT without the "
                                f"field's name: {details[:200]}")
            if code != grpc.StatusCode.OK:
                # The refused request left nothing in the way of the correct one.
                case += 1
                fresh = good(case)
                ok_code, ok_details = _status(lambda: edge.call(path, fresh, response_cls))
                if ok_code != grpc.StatusCode.OK:
                    failures.append(f"{path} after {field}={shown} ({code.name}): the correct "
                                    f"request got {ok_code.name} {ok_details[:200]}")
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} failures)"
    assert case > 300


def test_refused_requests_create_nothing(edge):
    """The two findings: an unknown dispatch_strategy created the topic before failing, and a
    subscription name with '/' registered the consumer before failing."""
    topic = unique_topic("refused")
    request = edge.producer_req(topic, "p")
    request.dispatch_strategy = 2
    code, details = _status(lambda: edge.call("/danube.ProducerService/CreateProducer",
                                              request, pb.ProducerResponse))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "dispatch_strategy" in details
    request = edge.producer_req(topic, "p")
    request.schema_ref.subject = "unregistered"
    code, _ = _status(lambda: edge.call("/danube.ProducerService/CreateProducer",
                                        request, pb.ProducerResponse))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    listed = edge.call("/danube_admin.NamespaceAdmin/GetNamespaceTopics",
                       admin_pb.NamespaceRequest(name="default"), admin_pb.TopicListResponse)
    assert topic not in listed.topics
    code, _ = _status(lambda: edge.call("/danube.Discovery/TopicLookup",
                                        pb.TopicLookupRequest(topic=topic),
                                        pb.TopicLookupResponse))
    assert code == grpc.StatusCode.NOT_FOUND

    for _ in range(3):
        code, details = _status(lambda: edge.call(
            "/danube.ConsumerService/Subscribe", edge.consumer_req(edge.topic, "x", "a/b"),
            pb.ConsumerResponse))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "subscription" in details
    # Exclusive: a consumer left behind by a refused Subscribe would refuse this one.
    edge.call("/danube.ConsumerService/Subscribe",
              edge.consumer_req(edge.topic, "y", "excl-after-refused"), pb.ConsumerResponse)
    code, _ = _status(lambda: edge.call(
        "/danube.ConsumerService/Subscribe",
        edge.consumer_req(edge.topic, "z\x00", "excl-after-refused"), pb.ConsumerResponse))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_topic_segment_limit_is_the_file_name_limit(edge):
    """A reliable topic's WAL directory is named after the segment: a segment the filesystem
    cannot hold is refused up front, for reliable and non-reliable topics alike."""
    accented = "\u00e9" * 120             # 240 bytes of UTF-8 in 120 characters
    for reliable in (True, False):
        for name in (f"/default/{'t' * 239}", f"/{'n' * 239}/t", f"/default/{accented}"):
            code, details = _status(lambda: edge.call(
                "/danube.ProducerService/CreateProducer",
                edge.producer_req(name, "p", reliable=reliable), pb.ProducerResponse))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (name[:20], code, details)
            assert "topic_name" in details and "238" in details
    longest = f"/default/{'t' * 238}"
    edge.call("/danube.ProducerService/CreateProducer",
              edge.producer_req(longest, "p", reliable=True), pb.ProducerResponse)
    # A partitioned base name leaves room for "-part-N".
    code, details = _status(lambda: edge.call(
        "/danube_admin.TopicAdmin/CreatePartitionedTopic",
        admin_pb.PartitionedTopicRequest(base_name=f"/default/{'b' * 236}", partitions=3),
        admin_pb.TopicResponse))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "base_name" in details


def test_undecodable_strings_are_refused_cleanly(edge):
    """Invalid UTF-8 in a proto3 string cannot come from a protobuf library, but a raw
    client can send it: the transport refuses the request before any handler runs."""
    topic = pb.ProducerRequest(topic_name="/default/x", producer_name="p").SerializeToString()
    raw = topic.replace(b"/default/x", b"/default/\xff")
    call = edge.client.unary_unary("/danube.ProducerService/CreateProducer")
    code, details = _status(lambda: call(raw, timeout=5))
    # tonic and grpcio answer INTERNAL for an undecodable request; ours names the field
    # (docs/compatibility.md).
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "topic_name" in details and "UTF-8" in details, details
    edge.call("/danube.ProducerService/CreateProducer", edge.producer_req("/default/after-raw",
                                                                          "p"),
              pb.ProducerResponse)


def test_every_listed_topic_can_be_looked_up_and_no_handler_failed(edge):
    listed = edge.call("/danube_admin.NamespaceAdmin/GetNamespaceTopics",
                       admin_pb.NamespaceRequest(name="default"), admin_pb.TopicListResponse)
    for topic in listed.topics:
        edge.call("/danube.Discovery/TopicLookup", pb.TopicLookupRequest(topic=topic),
                  pb.TopicLookupResponse)
    assert "handler for" not in edge.broker.log(), edge.broker.log()[-3000:]


def test_a_handler_failure_is_logged_with_a_traceback_once_per_method_and_type(caplog):
    import logging

    from danube.rpc import server

    server._failures_logged.discard(("/t/M", KeyError))
    caplog.set_level(logging.DEBUG, logger="danube.rpc.server")
    for i in range(5):
        try:
            {}[i]
        except KeyError as exc:
            server._log_handler_failure("/t/M", exc)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "/t/M" in errors[0].getMessage() and "KeyError" in errors[0].getMessage()
    assert len([r for r in caplog.records if r.levelno == logging.DEBUG]) == 4
