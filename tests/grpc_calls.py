"""Calls on a broker through a plain grpcio channel, with our generated messages: the
independent client the tests use where the official one hides what is being checked."""

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
