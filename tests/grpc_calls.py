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


def subscribe(ch, topic, consumer, sub, sub_type=pb.ConsumerRequest.Shared):
    """The new consumer's id."""
    return unary(ch, "/danube.ConsumerService/Subscribe", pb.ConsumerResponse)(
        pb.ConsumerRequest(topic_name=topic, consumer_name=consumer, subscription=sub,
                           subscription_type=sub_type), timeout=10).consumer_id


def receive(ch, consumer_id):
    """The consumer's ReceiveMessages stream (an iterator of StreamMessages)."""
    return ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                           request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=pb.StreamMessage.FromString)(
        pb.ReceiveRequest(consumer_id=consumer_id), timeout=30)
