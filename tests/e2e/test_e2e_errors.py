"""Bad input against the real broker process, with grpcio stubs generated AT TEST TIME from
our own protocol/*.proto (grpc_tools.protoc into a temporary directory): each error of
reference (c) comes back with upstream's status code and a clear message, and the broker keeps
serving afterwards. Also one plain produce/consume round through those stubs, HealthCheck
CLOSE after an admin DeleteTopic, and the official client's producer across a topic deletion.

Not covered yet: a NonReliable producer on an existing Reliable topic (FAILED_PRECONDITION
"dispatch strategy does not match") needs a Reliable topic, which this broker cannot create
until reliable dispatch lands (admin CreateTopic with Reliable is refused today)."""

import importlib
import os
import sys
import threading
import uuid

import grpc
import pytest
from grpc_tools import protoc

from official_client import broker_url, run_scenario, start_broker, unique_topic

TESTS = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(os.path.dirname(os.path.dirname(TESTS)), "protocol")
STUB_MODULES = ("DanubeApi_pb2", "DanubeApi_pb2_grpc", "DanubeAdmin_pb2", "DanubeAdmin_pb2_grpc")

BAD_TOPIC_NAMES = ["no-slash", "/ns/a.b", "/ns/t/extra", "", "/default/has space",
                   "default/t"]


class Stubs:
    """The generated modules plus stubs on the broker's client and admin ports."""

    def __init__(self, modules, client_channel, admin_channel):
        self.api = modules["DanubeApi_pb2"]
        self.admin = modules["DanubeAdmin_pb2"]
        api_grpc, admin_grpc = modules["DanubeApi_pb2_grpc"], modules["DanubeAdmin_pb2_grpc"]
        self.producer = api_grpc.ProducerServiceStub(client_channel)
        self.consumer = api_grpc.ConsumerServiceStub(client_channel)
        self.discovery = api_grpc.DiscoveryStub(client_channel)
        self.health = api_grpc.HealthCheckStub(client_channel)
        self.topics = admin_grpc.TopicAdminStub(admin_channel)

    # -- small helpers -------------------------------------------------------------------

    def create_producer(self, topic, name="producer", reliable=False):
        pb = self.api
        return self.producer.CreateProducer(pb.ProducerRequest(
            request_id=1, producer_name=name, topic_name=topic,
            producer_access_mode=pb.Shared,
            dispatch_strategy=pb.Reliable if reliable else pb.NonReliable), timeout=5)

    def subscribe(self, topic, consumer="consumer", subscription="sub", kind=None):
        pb = self.api
        kind = pb.ConsumerRequest.Exclusive if kind is None else kind
        return self.consumer.Subscribe(pb.ConsumerRequest(
            request_id=1, topic_name=topic, consumer_name=consumer, subscription=subscription,
            subscription_type=kind), timeout=5)

    def message(self, producer_id, topic, payload=b"payload", request_id=1, **attributes):
        pb = self.api
        return pb.StreamMessage(
            request_id=request_id, payload=payload, producer_name="producer",
            publish_time=1, attributes=attributes,
            msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic,
                            broker_addr="http://127.0.0.1"))

    def send(self, producer_id, topic, payload=b"payload", request_id=1):
        return self.producer.SendMessage(self.message(producer_id, topic, payload, request_id),
                                         timeout=10)

    def health_of(self, kind, client_id):
        pb = self.api
        resp = self.health.HealthCheck(pb.HealthCheckRequest(
            request_id=1, client=kind, id=client_id), timeout=5)
        return pb.HealthCheckResponse.ClientStatus.Name(resp.status)

    def lookup(self, topic):
        return self.discovery.TopicLookup(self.api.TopicLookupRequest(request_id=1, topic=topic),
                                          timeout=5)

    def assert_serving(self):
        """The broker still works: a fresh topic takes a producer and a message."""
        topic = unique_topic("still-serving")
        producer_id = self.create_producer(topic, "probe").producer_id
        assert self.send(producer_id, topic).request_id == 1
        assert self.health_of(self.api.HealthCheckRequest.Producer, producer_id) == "OK"


def rpc_error(fn, *args, **kwargs):
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kwargs)
    return err.value


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """protoc (grpc_tools) on protocol/DanubeApi.proto and DanubeAdmin.proto, imported from the
    output directory. Their descriptors are identical to the ones our package registers in
    protobuf's default pool (same .proto), which protobuf accepts."""
    out = tmp_path_factory.mktemp("stubs")
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
                      f"--grpc_python_out={out}",
                      os.path.join(PROTO_DIR, "DanubeApi.proto"),
                      os.path.join(PROTO_DIR, "DanubeAdmin.proto")])
    assert rc == 0, "grpc_tools.protoc failed on protocol/*.proto"
    saved = {name: sys.modules.pop(name) for name in STUB_MODULES if name in sys.modules}
    sys.path.insert(0, str(out))
    try:
        modules = {name: importlib.import_module(name) for name in STUB_MODULES}
    finally:
        sys.path.remove(str(out))
    for name, module in modules.items():
        assert os.path.dirname(module.__file__) == str(out), module.__file__
    yield modules
    for name in STUB_MODULES:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("e2e-errors") / "data")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def stubs(generated, broker):
    with grpc.insecure_channel(broker.client_addr) as client, \
            grpc.insecure_channel(broker.admin_addr) as admin:
        yield Stubs(generated, client, admin)


# -- a good round first ------------------------------------------------------------------

def test_produce_consume_round_with_generated_stubs(stubs):
    pb = stubs.api
    topic = unique_topic("stub-round")
    created = stubs.create_producer(topic, "stub-producer")
    assert created.request_id == 1 and created.producer_name == "stub-producer"
    assert created.producer_id != 0
    lookup = stubs.lookup(topic)
    assert lookup.response_type == pb.TopicLookupResponse.Connect
    assert stubs.discovery.TopicPartitions(pb.TopicLookupRequest(request_id=2, topic=topic),
                                           timeout=5).partitions == [topic]
    sub = stubs.subscribe(topic, "stub-consumer", "stub-sub")
    assert sub.consumer_id != 0 and sub.consumer_name == "stub-consumer"
    stream = stubs.consumer.ReceiveMessages(
        pb.ReceiveRequest(request_id=2, consumer_id=sub.consumer_id), timeout=15)
    try:
        sent = stubs.message(created.producer_id, topic, b"\x00stub payload\xff",
                             request_id=5, origin="grpcio")
        assert stubs.producer.SendMessage(sent, timeout=5).request_id == 5
        got = next(stream)
        assert got.payload == b"\x00stub payload\xff"
        assert dict(got.attributes) == {"origin": "grpcio"}
        assert got.request_id == 5
        assert got.msg_id.producer_id == created.producer_id
        assert got.msg_id.topic_name == topic
        assert got.producer_name == "producer"
        ack = stubs.consumer.Ack(pb.AckRequest(request_id=got.request_id, msg_id=got.msg_id,
                                               subscription_name="stub-sub"), timeout=5)
        assert ack.request_id == got.request_id
        assert stubs.health_of(pb.HealthCheckRequest.Consumer, sub.consumer_id) == "OK"
    finally:
        stream.cancel()


# -- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", BAD_TOPIC_NAMES)
def test_bad_topic_names_are_invalid_argument(stubs, name):
    err = rpc_error(stubs.lookup, name)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    if name:
        assert name in err.details()
    err = rpc_error(stubs.create_producer, name)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    stubs.assert_serving()


def test_lookup_of_unknown_topic_is_not_found(stubs):
    topic = unique_topic("never-created")
    err = rpc_error(stubs.lookup, topic)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "Unable to find the requested topic" in err.details()
    assert topic in err.details()
    stubs.assert_serving()


def test_send_with_unknown_producer_id_is_not_found(stubs):
    topic = unique_topic("no-such-producer")
    stubs.create_producer(topic, "real")
    err = rpc_error(stubs.send, 424242, topic)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "424242" in err.details() and "producer" in err.details()
    stubs.assert_serving()


def test_receive_with_unknown_consumer_id_is_not_found(stubs):
    stream = stubs.consumer.ReceiveMessages(
        stubs.api.ReceiveRequest(request_id=1, consumer_id=515151), timeout=5)
    err = rpc_error(list, stream)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "515151" in err.details() and "consumer" in err.details()
    stubs.assert_serving()


def test_second_consumer_on_exclusive_subscription_is_permission_denied(stubs):
    topic = unique_topic("exclusive")
    stubs.create_producer(topic)
    first = stubs.subscribe(topic, "holder", "excl")
    err = rpc_error(stubs.subscribe, topic, "intruder", "excl")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "excl" in err.details()
    # The holder re-subscribing by name is a reconnect: same id, no error.
    assert stubs.subscribe(topic, "holder", "excl").consumer_id == first.consumer_id
    # Another subscription on the same topic is fine.
    assert stubs.subscribe(topic, "intruder", "other-sub").consumer_id != first.consumer_id
    stubs.assert_serving()


def test_subscribe_to_missing_topic_is_not_found(stubs):
    topic = unique_topic("missing-for-sub")
    err = rpc_error(stubs.subscribe, topic)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert topic in err.details()
    # Subscribing never creates the topic.
    assert rpc_error(stubs.lookup, topic).code() == grpc.StatusCode.NOT_FOUND
    stubs.assert_serving()


def test_producer_in_missing_namespace_is_unavailable(stubs):
    ns = f"nons{uuid.uuid4().hex[:8]}"
    topic = f"/{ns}/t"
    err = rpc_error(stubs.create_producer, topic)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "Unable to find the namespace" in err.details() and ns in err.details()
    assert rpc_error(stubs.lookup, topic).code() == grpc.StatusCode.NOT_FOUND
    stubs.assert_serving()


def test_dispatch_strategy_mismatch_is_failed_precondition(stubs):
    reliable = unique_topic("reliable")
    assert stubs.create_producer(reliable, "reliable-producer", reliable=True).producer_id
    err = rpc_error(stubs.create_producer, reliable, "plain-producer")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "dispatch strategy does not match" in err.details()
    plain = unique_topic("plain")
    stubs.create_producer(plain, "plain-producer")
    err = rpc_error(stubs.create_producer, plain, "reliable-producer", reliable=True)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    stubs.assert_serving()


def test_ack_for_unknown_topic_or_subscription_is_not_found(stubs):
    # Upstream answers INTERNAL; a client error is NOT_FOUND here (docs/compatibility.md).
    pb = stubs.api
    topic = unique_topic("ack-errors")
    producer_id = stubs.create_producer(topic).producer_id
    for msg_topic, sub in ((unique_topic("ack-nowhere"), "sub"), (topic, "no-such-sub")):
        err = rpc_error(stubs.consumer.Ack, pb.AckRequest(
            request_id=1, subscription_name=sub,
            msg_id=pb.MsgID(producer_id=producer_id, topic_name=msg_topic)), timeout=5)
        assert err.code() == grpc.StatusCode.NOT_FOUND, err
        assert "Error acknowledging message" in err.details()
    stubs.assert_serving()


def test_admin_topic_errors(stubs):
    admin = stubs.admin
    topic = unique_topic("admin-errors")
    assert stubs.topics.CreateTopic(admin.NewTopicRequest(name=topic), timeout=5).success
    err = rpc_error(stubs.topics.CreateTopic, admin.NewTopicRequest(name=topic), timeout=5)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    # A partitioned topic over an existing plain one, and the reverse.
    err = rpc_error(stubs.topics.CreatePartitionedTopic,
                    admin.PartitionedTopicRequest(base_name=topic, partitions=2), timeout=5)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    base = unique_topic("admin-parted")
    assert stubs.topics.CreatePartitionedTopic(
        admin.PartitionedTopicRequest(base_name=base, partitions=2), timeout=5).success
    err = rpc_error(stubs.topics.CreateTopic, admin.NewTopicRequest(name=base), timeout=5)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    err = rpc_error(stubs.topics.CreateTopic,
                    admin.NewTopicRequest(name=unique_topic("bad-strategy"), dispatch_strategy=7),
                    timeout=5)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(stubs.topics.DeleteTopic,
                    admin.TopicRequest(name=unique_topic("never-there")), timeout=5)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    stubs.assert_serving()


def test_message_over_max_message_size_is_invalid_argument(generated, tmp_path):
    config = tmp_path / "danube_broker.yml"
    config.write_text("policies:\n  max_message_size: 1024\n")
    b = start_broker(tmp_path / "data", "--config-file", str(config))
    try:
        with grpc.insecure_channel(b.client_addr) as client, \
                grpc.insecure_channel(b.admin_addr) as admin:
            s = Stubs(generated, client, admin)
            topic = unique_topic("max-size")
            producer_id = s.create_producer(topic).producer_id
            sub = s.subscribe(topic, "size-consumer", "size-sub")
            stream = s.consumer.ReceiveMessages(
                s.api.ReceiveRequest(request_id=1, consumer_id=sub.consumer_id), timeout=15)
            try:
                assert s.send(producer_id, topic, b"a" * 1000, request_id=1).request_id == 1
                for size in (2048, 3 << 20):
                    err = rpc_error(s.send, producer_id, topic, b"b" * size, request_id=2)
                    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (size, err)
                    assert "1024" in err.details() and topic in err.details()
                assert s.send(producer_id, topic, b"c" * 10, request_id=3).request_id == 3
                # Only the accepted messages were delivered.
                assert next(stream).payload == b"a" * 1000
                assert next(stream).payload == b"c" * 10
            finally:
                stream.cancel()
            s.assert_serving()
    finally:
        b.stop()


# -- topic deletion ----------------------------------------------------------------------

def test_health_check_answers_close_after_topic_deletion(stubs):
    pb = stubs.api
    topic = unique_topic("deleted")
    producer_id = stubs.create_producer(topic, "del-producer").producer_id
    consumer_id = stubs.subscribe(topic, "del-consumer", "del-sub",
                                  pb.ConsumerRequest.Shared).consumer_id
    stream = stubs.consumer.ReceiveMessages(
        pb.ReceiveRequest(request_id=1, consumer_id=consumer_id), timeout=30)
    outcome = {}

    def drain():
        try:
            outcome["messages"] = [m.payload for m in stream]
            outcome["end"] = "OK"
        except grpc.RpcError as exc:
            outcome["end"] = exc.code()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        stubs.send(producer_id, topic, b"before delete")
        assert stubs.health_of(pb.HealthCheckRequest.Producer, producer_id) == "OK"
        assert stubs.health_of(pb.HealthCheckRequest.Consumer, consumer_id) == "OK"
        assert stubs.topics.DeleteTopic(stubs.admin.TopicRequest(name=topic), timeout=5).success
        assert stubs.health_of(pb.HealthCheckRequest.Producer, producer_id) == "CLOSE"
        assert stubs.health_of(pb.HealthCheckRequest.Consumer, consumer_id) == "CLOSE"
        # The consumer's ReceiveMessages stream ends (it does not wait for its deadline).
        reader.join(10)
        assert not reader.is_alive(), "ReceiveMessages stream still open after DeleteTopic"
        assert outcome["end"] != grpc.StatusCode.DEADLINE_EXCEEDED, outcome
    finally:
        stream.cancel()
    # The deleted topic and its producer are gone.
    assert rpc_error(stubs.lookup, topic).code() == grpc.StatusCode.NOT_FOUND
    err = rpc_error(stubs.send, producer_id, topic)
    assert err.code() == grpc.StatusCode.NOT_FOUND and str(producer_id) in err.details()
    stubs.assert_serving()


def test_official_producer_across_topic_deletion(stubs, broker):
    topic = unique_topic("official-deleted")
    result = run_scenario("after_delete.py", {
        "url": broker_url(broker), "admin_addr": broker.admin_addr, "topic": topic})
    assert result["first_send"]["ok"], result
    assert result["delete_error"] is None, result
    # The broker forgot the producer: the next send fails (NOT_FOUND, not retried by the
    # client) or, if a client recreates on failure, succeeds; either way nothing hangs.
    after = result["send_after_delete"]
    assert after["ok"] or after["code"] == "NOT_FOUND", result
    # Re-creating the producer auto-creates the topic again and works.
    assert result["recreate"]["ok"], result
    assert result["recreated_id"] != result["old_id"]
    assert result["send_after_recreate"]["ok"], result
    assert result["health_after_recreate"] == "OK"
    stubs.lookup(topic)
    stubs.assert_serving()
