"""danube_ext.BatchProducer/SendMessages: many messages in one call, delivered in order with
the broker-stamped msg_id, and partial acceptance reported clearly."""

from pathlib import Path

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from broker_process import BrokerProcess
from grpc_calls import create_producer, receive, subscribe, unary


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "broker.yml"
    cfg.write_text("policies:\n  max_message_size: 1000\n")
    b = BrokerProcess("--config-file", str(cfg),
                      data_dir=tmp_path_factory.mktemp("batch") / "d").start()
    yield b
    b.stop()


def _setup(ch, topic, producer_name="bp", dispatch_strategy=pb.NonReliable):
    """A producer and an Exclusive consumer's stream on ``topic``."""
    producer_id = create_producer(ch, topic, producer_name, dispatch_strategy)
    consumer_id = subscribe(ch, topic, "c", "s", pb.ConsumerRequest.Exclusive)
    return producer_id, receive(ch, consumer_id)


def test_batch_is_delivered_in_order_with_msg_ids(broker):
    topic = "/default/batch-order"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id, stream = _setup(ch, topic)
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        batch = [pb.StreamMessage(request_id=i, payload=f"m{i}".encode(),
                                  attributes={"i": str(i)}) for i in range(500)]
        resp = send(ext.MessageBatch(request_id=7, producer_id=producer_id, messages=batch),
                    timeout=10)
        assert (resp.request_id, resp.accepted, list(resp.offsets)) == (7, 500, [])
        got = [next(stream) for _ in range(500)]
        stream.cancel()
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(500)]
    assert {m.msg_id.topic_name for m in got} == {topic}
    assert {m.msg_id.producer_id for m in got} == {producer_id}
    assert {m.msg_id.broker_addr for m in got} == {f"http://{broker.client_addr}"}
    assert {m.producer_name for m in got} == {"bp"}
    assert got[42].attributes["i"] == "42"


def test_oversize_message_stops_the_batch_with_a_count(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id, stream = _setup(ch, "/default/batch-oversize")
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        batch = [pb.StreamMessage(payload=b"a"), pb.StreamMessage(payload=b"b" * 2000),
                 pb.StreamMessage(payload=b"c")]
        with pytest.raises(grpc.RpcError) as err:
            send(ext.MessageBatch(producer_id=producer_id, messages=batch), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 of 3 messages in the batch were published" in err.value.details()
        assert next(stream).payload == b"a"
        stream.cancel()


def test_unknown_producer_is_not_found(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        with pytest.raises(grpc.RpcError) as err:
            send(ext.MessageBatch(producer_id=12345, messages=[pb.StreamMessage()]), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "12345" in err.value.details()


def test_reliable_batch_returns_offsets_and_stamps_them(broker):
    topic = "/default/batch-reliable"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id, stream = _setup(ch, topic, "rp", pb.Reliable)
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        ack = unary(ch, "/danube.ConsumerService/Ack", pb.AckResponse)
        for round_ in range(2):
            batch = [pb.StreamMessage(request_id=i, payload=b"r%d-%d" % (round_, i))
                     for i in range(8)]
            resp = send(ext.MessageBatch(producer_id=producer_id, messages=batch),
                        timeout=10)
            assert list(resp.offsets) == list(range(round_ * 8, round_ * 8 + 8))
            for i in range(8):
                m = next(stream)
                assert (m.payload, m.msg_id.topic_offset) == (b"r%d-%d" % (round_, i),
                                                              round_ * 8 + i)
                assert (m.msg_id.producer_id, m.msg_id.topic_name, m.producer_name) == \
                    (producer_id, topic, "rp")
                ack(pb.AckRequest(msg_id=m.msg_id, subscription_name="s"), timeout=10)
        oversize = [pb.StreamMessage(payload=b"ok"), pb.StreamMessage(payload=b"x" * 2000)]
        with pytest.raises(grpc.RpcError) as err:
            send(ext.MessageBatch(producer_id=producer_id, messages=oversize),
                 timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A reliable batch is taken whole or not at all: the next offset is still 16.
        resp = send(ext.MessageBatch(producer_id=producer_id,
                                     messages=[pb.StreamMessage(payload=b"after")]), timeout=10)
        assert list(resp.offsets) == [16]
        stream.cancel()


def test_reliable_batch_offsets_as_range_and_broker_stamped_msg_id(broker):
    """What the project's client sends: messages without msg_id or producer_name, offsets
    asked for as a range. Consumers get the full msg_id, the broker's address included."""
    topic = "/default/batch-range"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id, stream = _setup(ch, topic, "rr", pb.Reliable)
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        ack = unary(ch, "/danube.ConsumerService/Ack", pb.AckResponse)
        batch = [pb.StreamMessage(request_id=i + 1, payload=b"q%d" % i, publish_time=5)
                 for i in range(3)]
        batch.append(pb.StreamMessage(request_id=4, payload=b"own-id", msg_id=pb.MsgID(
            producer_id=1, topic_name="x", broker_addr="http://elsewhere:1")))
        resp = send(ext.MessageBatch(request_id=1, producer_id=producer_id,
                                     messages=batch, offsets_as_range=True), timeout=10)
        assert (resp.accepted, list(resp.offsets), resp.first_offset) == (4, [], 0)
        resp = send(ext.MessageBatch(request_id=2, producer_id=producer_id,
                                     messages=batch[:1]), timeout=10)
        assert (resp.accepted, list(resp.offsets), resp.first_offset) == (1, [4], 4)
        got = [next(stream) for _ in range(5)]
        for m in got:
            ack(pb.AckRequest(msg_id=m.msg_id, subscription_name="s"), timeout=10)
        stream.cancel()
    want_addr = f"http://{broker.client_addr}"
    for i, m in enumerate(got[:3] + got[4:]):
        assert (m.payload, m.producer_name, m.publish_time) == (b"q0" if i == 3 else
                                                                 b"q%d" % i, "rr", 5)
        assert (m.msg_id.producer_id, m.msg_id.topic_name, m.msg_id.broker_addr) == \
            (producer_id, topic, want_addr)
    assert [m.msg_id.topic_offset for m in got] == [0, 1, 2, 3, 4]
    # A message that brought its own msg_id keeps its broker_addr (merged, as before).
    assert (got[3].payload, got[3].msg_id.broker_addr, got[3].msg_id.topic_name) == \
        (b"own-id", "http://elsewhere:1", topic)
    # The WAL keeps the topic's name and the broker's address once, not in every frame
    # (Topic.read_head): only the message whose own msg_id named another topic stores it.
    wal = b"".join(p.read_bytes() for p in
                   (Path(broker.data_dir) / "wal" / "default" / "batch-range").glob("wal.*.log"))
    assert wal.count(b"q0") == 2 and wal.count(b"own-id") == 1
    assert wal.count(topic.encode()) == 1 and wal.count(want_addr.encode()) == 0


def test_malformed_batch_is_refused_whole(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, "/default/batch-malformed", "mp", pb.Reliable)
        send = ch.unary_unary("/danube_ext.BatchProducer/SendMessages",
                              request_serializer=lambda b: b,
                              response_deserializer=ext.BatchResponse.FromString)
        ok = pb.StreamMessage(payload=b"fine").SerializeToString()
        body = (ext.MessageBatchRaw(producer_id=producer_id, messages=[ok])
                .SerializeToString() + b"\x1a\x02\x1a\x09")   # a payload past its message
        with pytest.raises(grpc.RpcError) as err:
            send(body, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed StreamMessage 1" in err.value.details()
        resp = send(ext.MessageBatchRaw(producer_id=producer_id, messages=[ok])
                    .SerializeToString(), timeout=10)
        assert list(resp.offsets) == [0]       # nothing of the refused batch was stored


@pytest.mark.parametrize("bad, named", [
    (b"\x52\x02\xff\xfe", "routing_key"),                       # field 10
    (b"\x2a\x03\xed\xa0\x80", "producer_name"),                 # a surrogate, field 5
    (b"\x3a\x07\x0a\x01k\x12\x02\xc3\x28", "an attributes entry"),
])
def test_a_string_that_is_not_utf8_is_refused_whole(broker, bad, named):
    # SendMessage refuses these (protobuf does); a batch must too, or they are stored and
    # no client can decode them (and a KeyShared dispatcher could not route them).
    topic = f"/default/batch-utf8-{named.split()[-1].replace('_', '-')}"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "up", pb.Reliable)
        send = ch.unary_unary("/danube_ext.BatchProducer/SendMessages",
                              request_serializer=lambda b: b,
                              response_deserializer=ext.BatchResponse.FromString)
        ok = pb.StreamMessage(payload=b"fine").SerializeToString()
        with pytest.raises(grpc.RpcError) as err:
            send(ext.MessageBatchRaw(producer_id=producer_id, messages=[ok, ok + bad])
                 .SerializeToString(), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"StreamMessage 1 of the batch: {named} is not valid UTF-8" in \
            err.value.details()
        resp = send(ext.MessageBatchRaw(producer_id=producer_id, messages=[ok])
                    .SerializeToString(), timeout=10)
        assert list(resp.offsets) == [0]       # nothing of the refused batch was stored
