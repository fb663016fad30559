"""A reliable message the consumer cannot take (issue 17): a 5 MiB message to a client whose
receive limit is 4 MiB (the official clients' default). The client's gRPC layer refuses it,
resets the ReceiveMessages stream and the client opens it again at once. Each such delivery
is a failed attempt: redelivery backs off as after a nack (dispatch.failure_policy), and after
max_redelivery_count failures the poison policy applies, here dead_letter. Before, the broker
redelivered at once, some 14,000 times in 30 s at most of a core, and never gave up."""

import time

import grpc
import yaml

from broker_process import BrokerProcess
from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.proto import DanubeApi_pb2 as pb
from official_client import unique_topic

BIG = 5 << 20
CLIENT_LIMIT = 4 << 20
POLICY = {"max_redelivery_count": 3, "base_redelivery_delay_ms": 400,
          "max_redelivery_delay_ms": 5000, "backoff_strategy": "exponential",
          "ack_timeout_ms": 60000, "poison_policy": "dead_letter",
          "dead_letter_topic": "/{namespace}/{topic}-dlq"}


def _unary(channel, path, request, response_cls):
    return channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=response_cls.FromString)(request, timeout=10)


def _subscribe(channel, topic, name):
    return _unary(channel, "/danube.ConsumerService/Subscribe", pb.ConsumerRequest(
        request_id=1, topic_name=topic, consumer_name=name, subscription=name,
        subscription_type=pb.ConsumerRequest.Exclusive), pb.ConsumerResponse).consumer_id


def _receive(channel, consumer_id, timeout):
    return channel.unary_stream(
        "/danube.ConsumerService/ReceiveMessages",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.StreamMessage.FromString)(
            pb.ReceiveRequest(request_id=1, consumer_id=consumer_id), timeout=timeout)


def test_refused_message_backs_off_then_goes_to_the_dead_letter_topic(tmp_path):
    config = tmp_path / "broker.yml"
    config.write_text(yaml.safe_dump({"dispatch": {"failure_policy": POLICY}}))
    broker = BrokerProcess("--config-file", str(config), data_dir=tmp_path / "data").start()
    big = [("grpc.max_send_message_length", 16 << 20),
           ("grpc.max_receive_message_length", 16 << 20)]
    small = [("grpc.max_receive_message_length", CLIENT_LIMIT)]
    try:
        with grpc.insecure_channel(broker.client_addr, options=big) as producer_ch, \
                grpc.insecure_channel(broker.client_addr, options=small) as consumer_ch, \
                grpc.insecure_channel(broker.admin_addr) as admin_ch:
            topic = unique_topic("refused")
            dlq = f"{topic}-dlq"
            _unary(admin_ch, "/danube_admin.TopicAdmin/CreateTopic", admin_pb.NewTopicRequest(
                name=dlq, dispatch_strategy=admin_pb.Reliable), admin_pb.TopicResponse)
            dlq_consumer = _subscribe(producer_ch, dlq, "dlq-reader")
            dlq_stream = _receive(producer_ch, dlq_consumer, timeout=30)
            producer_id = _unary(producer_ch, "/danube.ProducerService/CreateProducer",
                                 pb.ProducerRequest(request_id=1, producer_name="p",
                                                    topic_name=topic,
                                                    dispatch_strategy=pb.Reliable),
                                 pb.ProducerResponse).producer_id
            consumer_id = _subscribe(consumer_ch, topic, "small-client")
            _unary(producer_ch, "/danube.ProducerService/SendMessage", pb.StreamMessage(
                request_id=1, payload=b"x" * BIG, producer_name="p",
                msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic)),
                pb.MessageResponse)

            # The consumer keeps refusing it, reopening its stream at once each time, as the
            # official clients do, for 6 s: 400 ms, 800 ms, 1.6 s of backoff fit.
            refused = []
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline:
                try:
                    for _ in _receive(consumer_ch, consumer_id,
                                      timeout=max(0.1, deadline - time.monotonic())):
                        raise AssertionError("a 5 MiB message got past a 4 MiB limit")
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        refused.append(time.monotonic())
                    elif err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
            assert 2 <= len(refused) <= POLICY["max_redelivery_count"] + 1, refused
            gaps = [b - a for a, b in zip(refused, refused[1:])]
            assert all(gap >= 0.3 for gap in gaps), gaps

            dead = next(iter(dlq_stream))
            dlq_stream.cancel()
            assert len(dead.payload) == BIG
            assert dead.attributes["x-poison-policy"] == "dead_letter"
            assert dead.attributes["x-original-topic"] == topic
            assert int(dead.attributes["x-delivery-attempt"]) == \
                POLICY["max_redelivery_count"] + 1
            assert "stream ended" in dead.attributes["x-failure-reason"]
    finally:
        broker.stop()
