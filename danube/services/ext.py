"""danube_ext.BatchProducer: our batched publish beside upstream's one-call-per-message
SendMessage (see protocol/DanubeExt.proto). A request is not parsed into protobuf objects:
danube.broker._stamp.parse_message_batch checks and indexes its bytes in C, and the whole batch goes
to Topic.publish, where a reliable topic stamps and stores all its messages in one pass,
without a Python object per message."""

import time

from danube.broker._stamp import parse_message_batch
from danube.broker import errors as e
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError, StatusCode
from danube.rpc.method import Kind
from danube.services.errors import to_rpc_error
from danube.services.limits import SEND_MESSAGES, limit_send_messages


class BatchProducerService:
    def __init__(self, core):
        self.producers = core.producer_table

    async def SendMessages(self, batch, context):
        started = time.perf_counter()
        topic = None
        try:
            producer = self.producers.producer(batch.producer_id)
            topic = producer.topic
            offsets = await topic.publish(batch, producer)
        except e.BrokerError as exc:
            error = to_rpc_error(exc)
            if topic is not None:
                topic.record_send(started, error.code.name)
            raise error from None
        topic.record_send(started)
        if offsets is None:          # a non-reliable topic
            return ext.BatchResponse(request_id=batch.request_id, accepted=len(batch))
        if batch.offsets_as_range:
            return ext.BatchResponse(request_id=batch.request_id, accepted=len(offsets),
                                     first_offset=offsets.start)
        return ext.BatchResponse(request_id=batch.request_id, accepted=len(offsets),
                                 offsets=offsets, first_offset=offsets.start)


def parse_batch(data):
    """The batch's index, or INVALID_ARGUMENT saying where it is malformed."""
    try:
        return parse_message_batch(data)
    except ValueError as exc:
        raise RpcError(StatusCode.INVALID_ARGUMENT, f"invalid MessageBatch: {exc}") from None


def register(server, core):
    service = BatchProducerService(core)
    server.add_method(SEND_MESSAGES, Kind.UNARY_UNARY, service.SendMessages,
                      parse_batch, lambda m: m.SerializeToString())
    limit_send_messages(server, core)
