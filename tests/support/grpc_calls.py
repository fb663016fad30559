"""Calls on a broker through a plain grpcio channel, with our generated messages: the
independent client the tests use where the official one hides what is being checked."""

import queue
import threading

import grpc

from danube.proto import DanubeApi_pb2 as pb


def unary(ch, path, resp):
    return ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=resp.FromString)


def create_producer(ch, topic, name, dispatch_strategy=pb.NonReliable):
    """The new producer's id."""
    return unary(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
        pb.ProducerRequest(producer_name=name, topic_name=topic,
                           dispatch_strategy=dispatch_strategy), timeout=10).producer_id


def subscribe(ch, topic, consumer, sub, sub_type=pb.ConsumerRequest.Shared, key_filters=()):
    """The new consumer's id."""
    return unary(ch, "/danube.ConsumerService/Subscribe", pb.ConsumerResponse)(
        pb.ConsumerRequest(topic_name=topic, consumer_name=consumer, subscription=sub,
                           subscription_type=sub_type, key_filters=list(key_filters)),
        timeout=10).consumer_id


def send(ch, topic, producer_id, payload, key=None):
    """Publish one message (with a routing key if given) and wait for its acknowledgement."""
    msg = pb.StreamMessage(request_id=1, payload=payload, producer_name="p",
                           msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic))
    if key is not None:
        msg.routing_key = key
    return unary(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)(msg, timeout=10)


def ack(ch, sub, msg):
    """Acknowledge a delivered message the way the official clients do."""
    return unary(ch, "/danube.ConsumerService/Ack", pb.AckResponse)(
        pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id, subscription_name=sub),
        timeout=10)


def receive(ch, consumer_id):
    """The consumer's ReceiveMessages stream (an iterator of StreamMessages)."""
    return ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                           request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=pb.StreamMessage.FromString)(
        pb.ReceiveRequest(consumer_id=consumer_id), timeout=30)


class Collector:
    """Reads a ReceiveMessages stream on a thread: messages, and how the stream ended."""

    def __init__(self, stream):
        self.stream = stream
        self.queue = queue.Queue()
        self.payloads = []
        self.ended = threading.Event()
        self.code = self.details = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for msg in self.stream:
                self.payloads.append(msg.payload)
                self.queue.put(msg)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.code, self.details = exc.code(), exc.details()
        finally:
            self.ended.set()

    def get(self, timeout=5.0):
        return self.queue.get(timeout=timeout)

    def nothing(self, seconds=0.5):
        try:
            msg = self.queue.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected delivery {msg.payload!r}")

    def close(self):
        self.stream.cancel()
        self.thread.join(5)
