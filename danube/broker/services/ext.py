"""danube_ext.BatchProducer: our batched publish beside upstream's one-call-per-message
SendMessage (see protocol/DanubeExt.proto). Requests are decoded as MessageBatchRaw, so the
messages arrive as serialized StreamMessages; a reliable topic stores them with msg_id
stamped in place, without a protobuf object per message."""

from danube.broker import errors as e
from danube.broker.services.errors import to_rpc_error
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError
from danube.rpc.server import Kind


class BatchProducerService:
    def __init__(self, core):
        self.core = core

    async def SendMessages(self, request, context):
        try:
            producer = self.core.producer(request.producer_id)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        topic = producer.topic
        raws = list(request.messages)
        if topic.log is not None:
            msg_id = pb.MsgID(producer_id=producer.producer_id,
                              topic_name=topic.name).SerializeToString()
            name = pb.StreamMessage(producer_name=producer.name).SerializeToString()
            try:
                offsets = await topic.publish_reliable_raw(raws, msg_id, name)
            except e.BrokerError as exc:
                raise to_rpc_error(exc) from None
            producer.sent += len(offsets)
            return ext.BatchResponse(request_id=request.request_id, accepted=len(offsets),
                                     offsets=offsets)
        accepted = 0
        try:
            for raw in raws:
                msg = pb.StreamMessage.FromString(raw)
                mid = msg.msg_id
                mid.producer_id = producer.producer_id
                mid.topic_name = topic.name
                if not msg.producer_name:
                    msg.producer_name = producer.name
                key = msg.routing_key if msg.HasField("routing_key") else msg.producer_name
                topic.publish(msg.SerializeToString(), len(msg.payload), key)
                accepted += 1
        except e.BrokerError as exc:
            err = to_rpc_error(exc)
            raise RpcError(err.code, f"{err.details} ({accepted} of {len(raws)} "
                                     f"messages in the batch were published)") from None
        finally:
            producer.sent += accepted
        return ext.BatchResponse(request_id=request.request_id, accepted=accepted)


def register(server, core):
    service = BatchProducerService(core)
    server.add_method("/danube_ext.BatchProducer/SendMessages", Kind.UNARY_UNARY,
                      service.SendMessages, ext.MessageBatchRaw.FromString,
                      lambda m: m.SerializeToString())
