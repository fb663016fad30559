"""danube.ProducerService, danube.ConsumerService and danube.Discovery on the client port."""

import asyncio
import logging
import time

from danube.broker import errors as e
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc import RpcError, StatusCode
from danube.rpc.method import Kind
from danube.rpc.request_errors import explain
from danube.services import checks
from danube.services.delivery import StreamSink
from danube.services.errors import maps_errors, to_rpc_error
from danube.services.limits import SEND_MESSAGE, limit_send_message

log = logging.getLogger("danube.broker.services")

UNLOADED_STREAM_PAUSE = 0.5


async def serve_stream(subscriptions, consumer_id, context, *, batched=False, window=0):
    """A consumer's delivery stream (ReceiveMessages, or danube_ext.BatchConsumer/
    ReceiveBatches when ``batched``: many messages per stream message); ``window``, when
    not 0, is the max_unacked_messages the consumer asks for while the stream lasts
    (``subscriptions``, the core's SubscriptionTable: request_window)."""
    client = context.conn
    try:
        consumer = subscriptions.consumer(consumer_id)
        if consumer.must_wait(client):
            log.info("consumer %r was taken over by another connection; this "
                     "ReceiveMessages waits until that one lets it go", consumer.name)
        while consumer.must_wait(client):
            await consumer.turn()
            consumer = subscriptions.consumer(consumer_id)   # removed meanwhile?
        if window:
            await subscriptions.request_window(consumer, window, context)
    except e.TopicUnloaded as exc:
        # The official clients reopen a failed stream at once, without backoff, until
        # their health check (every 5 s) tells them to subscribe again: answering after
        # a pause keeps that from being thousands of calls.
        await asyncio.sleep(UNLOADED_STREAM_PAUSE)
        raise to_rpc_error(exc) from None
    except e.BrokerError as exc:
        raise to_rpc_error(exc) from None
    sink = StreamSink(context)
    consumer.outbox.set_batched(batched)
    consumer.attach(sink, client)
    try:
        reason = await sink.ended()
    finally:
        consumer.stream_ended(sink)
        await sink.close()
        if window:
            await subscriptions.release_window(consumer, context)
    if reason is not None:
        raise to_rpc_error(reason)


def count_redirect(core, exc, topic):
    """danube_client_redirects_total: a producer or consumer sent to look the topic up
    again, counted where upstream counts it (its get_topic, for these two calls only)."""
    core.placement.count_redirect(exc.reason, topic)


class ProducerService:
    def __init__(self, core):
        self.core = core
        self.producers = core.producer_table

    @maps_errors()
    async def CreateProducer(self, request, context):
        checks.producer_request(request)
        subject = request.schema_ref.subject if request.HasField("schema_ref") else None
        try:
            producer_id = await self.producers.create_producer(
                request.topic_name, request.producer_name, request.dispatch_strategy,
                request.producer_access_mode, subject, client=context.conn)
        except e.TopicElsewhere as exc:
            count_redirect(self.core, exc, request.topic_name)
            raise
        return pb.ProducerResponse(request_id=request.request_id, producer_id=producer_id,
                                   producer_name=request.producer_name)

    async def SendMessage(self, raw, context):
        # Registered with raw bytes in: the message is parsed once to route and check it,
        # and its original bytes are what non-reliable consumers receive.
        try:
            msg = pb.StreamMessage.FromString(raw)
        except Exception:  # noqa: BLE001 - any parse failure is the client's
            raise RpcError(StatusCode.INVALID_ARGUMENT,
                           explain(pb.StreamMessage.DESCRIPTOR, raw)) from None
        if not msg.HasField("msg_id"):
            raise RpcError(StatusCode.INVALID_ARGUMENT, "StreamMessage.msg_id is required")
        started = time.perf_counter()
        topic = None
        try:
            producer = self.producers.producer(msg.msg_id.producer_id)
            topic = producer.topic
            await topic.publish(msg, producer, raw)
        except e.BrokerError as exc:
            error = to_rpc_error(exc)
            if topic is not None:
                topic.record_send(started, error.code.name)
            raise error from None
        topic.record_send(started)
        return pb.MessageResponse(request_id=msg.request_id).SerializeToString()


class ConsumerService:
    def __init__(self, core):
        self.core = core
        self.subscriptions = core.subscription_table

    @maps_errors()
    async def Subscribe(self, request, context):
        checks.consumer_request(request)
        try:
            consumer_id = await self.subscriptions.subscribe(
                request.topic_name, request.consumer_name, request.subscription,
                request.subscription_type, list(request.key_filters), client=context.conn)
        except e.TopicElsewhere as exc:
            count_redirect(self.core, exc, request.topic_name)
            raise
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=consumer_id,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request, context):
        await serve_stream(self.subscriptions, request.consumer_id, context)

    @maps_errors()
    async def Ack(self, request, context):
        checks.ack_request(request, "acknowledging")
        dispatcher = self._dispatcher(request, "acknowledging")
        if dispatcher is not None:
            dispatcher.ack(request.msg_id.topic_offset)
        return pb.AckResponse(request_id=request.request_id)

    @maps_errors()
    async def Nack(self, request, context):
        checks.nack_request(request)
        dispatcher = self._dispatcher(request, "negatively acknowledging")
        if dispatcher is not None:
            dispatcher.nack(request.msg_id.topic_offset,
                            request.delay_ms if request.HasField("delay_ms") else None,
                            request.reason if request.HasField("reason") else None)
        return pb.NackResponse(request_id=request.request_id)

    def _dispatcher(self, request, what):
        """The subscription's reliable dispatcher, or None on a non-reliable topic, where
        acks are no-ops once the subscription is known (upstream behaviour)."""
        if not request.HasField("msg_id"):
            raise RpcError(StatusCode.INVALID_ARGUMENT, f"Error {what} message: msg_id is required")
        return self.subscriptions.subscription_for_ack(request.msg_id.topic_name,
                                                       request.subscription_name).dispatcher


class DiscoveryService:
    def __init__(self, core):
        self.core = core
        self.topics = core.topic_table

    @maps_errors()
    async def TopicLookup(self, request, context):
        checks.lookup_request(request)
        try:
            broker_url, connect_url = self.topics.lookup(request.topic)
        except e.TopicNotFound:
            if not await self.core.placement.catch_up(request.topic):
                raise
            broker_url, connect_url = self.topics.lookup(request.topic)
        here = broker_url == self.core.cfg.advertised_broker_url
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=pb.TopicLookupResponse.Connect if here
            else pb.TopicLookupResponse.Redirect,
            connect_url=connect_url, broker_url=broker_url, proxy=broker_url != connect_url)

    @maps_errors()
    async def TopicPartitions(self, request, context):
        checks.lookup_request(request)
        partitions = await self.topics.partitions(request.topic)
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=partitions)


def register(server, core):
    services = pb.DESCRIPTOR.services_by_name
    producer = ProducerService(core)
    server.add_service(services["ProducerService"], producer)
    server.add_method(SEND_MESSAGE, Kind.UNARY_UNARY, producer.SendMessage)
    limit_send_message(server, core)
    server.add_service(services["ConsumerService"], ConsumerService(core))
    server.add_service(services["Discovery"], DiscoveryService(core))
