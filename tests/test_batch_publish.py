"""danube_ext.BatchProducer/SendMessages: many messages in one call, delivered in order with
the broker-stamped msg_id, and partial acceptance reported clearly."""

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from broker_process import BrokerProcess


def _unary(ch, path, resp):
    return ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=resp.FromString)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "broker.yml"
    cfg.write_text("policies:\n  max_message_size: 1000\n")
    b = BrokerProcess("--config-file", str(cfg),
                      data_dir=tmp_path_factory.mktemp("batch") / "d").start()
    yield b
    b.stop()


def _setup(ch, topic):
    producer = _unary(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
        pb.ProducerRequest(producer_name="bp", topic_name=topic), timeout=10)
    consumer = _unary(ch, "/danube.ConsumerService/Subscribe", pb.ConsumerResponse)(
        pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s",
                           subscription_type=pb.ConsumerRequest.Exclusive), timeout=10)
    stream = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                             request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=pb.StreamMessage.FromString)(
        pb.ReceiveRequest(consumer_id=consumer.consumer_id), timeout=30)
    return producer.producer_id, stream


def test_batch_is_delivered_in_order_with_msg_ids(broker):
    topic = "/default/batch-order"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id, stream = _setup(ch, topic)
        send = _unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
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
    assert {m.producer_name for m in got} == {"bp"}
    assert got[42].attributes["i"] == "42"


def test_oversize_message_stops_the_batch_with_a_count(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id, stream = _setup(ch, "/default/batch-oversize")
        send = _unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
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
        send = _unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        with pytest.raises(grpc.RpcError) as err:
            send(ext.MessageBatch(producer_id=12345, messages=[pb.StreamMessage()]), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "12345" in err.value.details()


def test_reliable_batch_returns_offsets_and_stamps_them(broker):
    topic = "/default/batch-reliable"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = _unary(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
            pb.ProducerRequest(producer_name="rp", topic_name=topic,
                               dispatch_strategy=pb.Reliable), timeout=10)
        consumer = _unary(ch, "/danube.ConsumerService/Subscribe", pb.ConsumerResponse)(
            pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s",
                               subscription_type=pb.ConsumerRequest.Exclusive), timeout=10)
        stream = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.StreamMessage.FromString)(
            pb.ReceiveRequest(consumer_id=consumer.consumer_id), timeout=30)
        send = _unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        ack = _unary(ch, "/danube.ConsumerService/Ack", pb.AckResponse)
        for round_ in range(2):
            batch = [pb.StreamMessage(request_id=i, payload=b"r%d-%d" % (round_, i))
                     for i in range(8)]
            resp = send(ext.MessageBatch(producer_id=producer.producer_id, messages=batch),
                        timeout=10)
            assert list(resp.offsets) == list(range(round_ * 8, round_ * 8 + 8))
            for i in range(8):
                m = next(stream)
                assert (m.payload, m.msg_id.topic_offset) == (b"r%d-%d" % (round_, i),
                                                              round_ * 8 + i)
                assert (m.msg_id.producer_id, m.msg_id.topic_name, m.producer_name) == \
                    (producer.producer_id, topic, "rp")
                ack(pb.AckRequest(msg_id=m.msg_id, subscription_name="s"), timeout=10)
        oversize = [pb.StreamMessage(payload=b"ok"), pb.StreamMessage(payload=b"x" * 2000)]
        with pytest.raises(grpc.RpcError) as err:
            send(ext.MessageBatch(producer_id=producer.producer_id, messages=oversize),
                 timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A reliable batch is taken whole or not at all: the next offset is still 16.
        resp = send(ext.MessageBatch(producer_id=producer.producer_id,
                                     messages=[pb.StreamMessage(payload=b"after")]), timeout=10)
        assert list(resp.offsets) == [16]
        stream.cancel()
