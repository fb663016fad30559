"""danube_ext.BatchProducer: our batched publish beside upstream's one-call-per-message
SendMessage (see protocol/DanubeExt.proto)."""

from danube.broker import errors as e
from danube.broker.services.errors import to_rpc_error
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError


class BatchProducerService:
    def __init__(self, core):
        self.core = core

    async def SendMessages(self, request, context):
        try:
            producer = self.core.producer(request.producer_id)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        topic = producer.topic
        for msg in request.messages:
            mid = msg.msg_id
            mid.producer_id = producer.producer_id
            mid.topic_name = topic.name
            if not msg.producer_name:
                msg.producer_name = producer.name
        if topic.log is not None:
            try:
                offsets = await topic.publish_reliable(list(request.messages))
            except e.BrokerError as exc:
                raise to_rpc_error(exc) from None
            producer.sent += len(offsets)
            return ext.BatchResponse(request_id=request.request_id, accepted=len(offsets),
                                     offsets=offsets)
        accepted = 0
        try:
            for msg in request.messages:
                key = msg.routing_key if msg.HasField("routing_key") else msg.producer_name
                topic.publish(msg.SerializeToString(), len(msg.payload), key)
                accepted += 1
        except e.BrokerError as exc:
            err = to_rpc_error(exc)
            raise RpcError(err.code, f"{err.details} ({accepted} of {len(request.messages)} "
                                     f"messages in the batch were published)") from None
        finally:
            producer.sent += accepted
        return ext.BatchResponse(request_id=request.request_id, accepted=accepted)


def register(server, core):
    server.add_service(ext.DESCRIPTOR.services_by_name["BatchProducer"],
                       BatchProducerService(core))
