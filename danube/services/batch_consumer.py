"""danube_ext.BatchConsumer: batched deliveries (ReceiveBatches, a DeliveryBatch per stream
message, framed by the consumer's Outbox in C) and range acknowledgements (AckRanges, one
C loop over the ranges: danube.broker._window) beside upstream's ReceiveMessages and Ack.
See protocol/DanubeExt.proto and docs/consume.md."""

from danube.broker import errors as e
from danube.broker._window import check_ranges
from danube.broker.core.admin import MAX_UNACKED_RANGE
from danube.broker.names import validate_client_name, validate_topic
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError, StatusCode
from danube.services.client_api import serve_stream
from danube.services.errors import maps_errors

# At most this many ranges per call: a request is read whole, and this keeps one call's
# work bounded (a client acks in batches of a few hundred ranges at most).
MAX_RANGES = 65536


class BatchConsumerService:
    def __init__(self, core):
        self.subscriptions = core.subscription_table

    async def ReceiveBatches(self, request, context):
        window = request.max_unacked_messages
        low, high = MAX_UNACKED_RANGE
        if window and not low <= window <= high:
            raise RpcError(StatusCode.INVALID_ARGUMENT,
                           f"max_unacked_messages must be between {low} and {high} (or 0: "
                           f"the subscription's), not {window}")
        await serve_stream(self.subscriptions, request.consumer_id, context, batched=True,
                           window=window)

    @maps_errors({e.TopicNotFound: StatusCode.NOT_FOUND,
                  e.SubscriptionNotFound: StatusCode.NOT_FOUND})
    async def AckRanges(self, request, context):
        validate_topic(request.topic_name, "topic_name")
        validate_client_name(request.subscription_name, "subscription_name")
        if len(request.ranges) > 2 * MAX_RANGES:
            raise e.InvalidArgument(f"ranges: {len(request.ranges) // 2} ranges in one call, "
                                    f"more than {MAX_RANGES}")
        try:
            pairs = check_ranges(request.ranges)
        except ValueError as exc:
            raise e.InvalidArgument(f"ranges: {exc}") from None
        dispatcher = self.subscriptions.subscription_for_ack(
            request.topic_name, request.subscription_name).dispatcher
        acked = dispatcher.ack_ranges(pairs) if dispatcher is not None else 0
        if request.durable and dispatcher is not None:
            await dispatcher.flush_cursor()
        return ext.AckRangesResponse(request_id=request.request_id, acked=acked)


def register(server, core):
    server.add_service(ext.DESCRIPTOR.services_by_name["BatchConsumer"],
                       BatchConsumerService(core))
