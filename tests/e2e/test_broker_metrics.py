"""Prometheus metrics of topics, subscriptions, producers and consumers (upstream names)."""

import re
import threading
import urllib.request

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from broker_process import BrokerProcess


def _call(channel, path, req, resp_cls):
    return channel.unary_unary(path, request_serializer=type(req).SerializeToString,
                               response_deserializer=resp_cls.FromString)(req, timeout=10)


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0", data_dir=tmp_path / "data").start()
    yield b
    b.stop()


def _metric(body, name, **labels):
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics:\n{body}")


def test_publish_and_delivery_are_counted(broker):
    topic = "/default/metrics-topic"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = _call(ch, "/danube.ProducerService/CreateProducer",
                         pb.ProducerRequest(request_id=1, producer_name="p1", topic_name=topic),
                         pb.ProducerResponse)
        consumer = _call(ch, "/danube.ConsumerService/Subscribe",
                         pb.ConsumerRequest(request_id=1, topic_name=topic, consumer_name="c1",
                                            subscription="s1",
                                            subscription_type=pb.ConsumerRequest.Shared),
                         pb.ConsumerResponse)
        stream = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                                 request_serializer=pb.ReceiveRequest.SerializeToString,
                                 response_deserializer=pb.StreamMessage.FromString)(
            pb.ReceiveRequest(request_id=1, consumer_id=consumer.consumer_id), timeout=30)
        received = []
        # How the stream ended, checked by the test itself: an assert on the reader thread
        # would only print a warning.
        ended = []

        def read():
            try:
                for message in stream:
                    received.append(message)
                    if len(received) == 3:
                        stream.cancel()
                ended.append("end of stream without an error")
            except grpc.RpcError as err:
                ended.append(err.code())
            except BaseException as exc:
                ended.append(exc)
        reader = threading.Thread(target=read)
        reader.start()
        for i in range(3):
            _call(ch, "/danube.ProducerService/SendMessage",
                  pb.StreamMessage(request_id=i + 1, payload=b"x" * 10, producer_name="p1",
                                   msg_id=pb.MsgID(producer_id=producer.producer_id,
                                                   topic_name=topic)),
                  pb.MessageResponse)
        reader.join(10)
        assert not reader.is_alive(), "the reader did not finish"
        assert len(received) == 3
        assert ended == [grpc.StatusCode.CANCELLED]
        body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                      timeout=5).read().decode()
    assert _metric(body, "danube_topic_messages_in_total", topic=topic) == 3
    assert _metric(body, "danube_topic_bytes_in_total", topic=topic) == 30
    assert _metric(body, "danube_topic_active_producers", topic=topic) == 1
    assert _metric(body, "danube_topic_active_subscriptions", topic=topic) == 1
    assert _metric(body, "danube_producer_messages_accepted_total", topic=topic,
                   producer="p1") == 3
    assert _metric(body, "danube_producer_send_total", topic=topic, result="ok",
                   error_code="OK") == 3
    assert _metric(body, "danube_producer_send_latency_ms_count", topic=topic) == 3
    assert _metric(body, "danube_topic_message_size_bytes_sum", topic=topic) == 30
    assert _metric(body, "danube_consumer_messages_out_total", topic=topic, subscription="s1",
                   consumer="c1") == 3
    assert _metric(body, "danube_consumer_dropped_total", topic=topic, subscription="s1",
                   consumer="c1") == 0
    assert _metric(body, "danube_broker_topics_owned") == 2
    assert _metric(body, "danube_broker_rpc_total", service="producer", method="send_message",
                   result="ok", code="OK") == 3


def test_reliable_subscription_metrics(broker):
    topic = "/default/metrics-reliable"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = _call(ch, "/danube.ProducerService/CreateProducer",
                         pb.ProducerRequest(request_id=1, producer_name="p1", topic_name=topic,
                                            dispatch_strategy=pb.Reliable),
                         pb.ProducerResponse)
        _call(ch, "/danube.ConsumerService/Subscribe",
              pb.ConsumerRequest(request_id=1, topic_name=topic, consumer_name="c1",
                                 subscription="rs", subscription_type=pb.ConsumerRequest.Exclusive),
              pb.ConsumerResponse)
        for i in range(4):
            _call(ch, "/danube.ProducerService/SendMessage",
                  pb.StreamMessage(request_id=i + 1, payload=b"r", producer_name="p1",
                                   msg_id=pb.MsgID(producer_id=producer.producer_id,
                                                   topic_name=topic)),
                  pb.MessageResponse)
        body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                      timeout=5).read().decode()
    # Nothing acked yet: all four are lag.
    assert _metric(body, "danube_subscription_lag_messages", topic=topic, subscription="rs") == 4
    assert _metric(body, "danube_subscription_redelivery_total", topic=topic,
                   subscription="rs") == 0
    assert _metric(body, "danube_topic_messages_in_total", topic=topic) == 4
