"""danube_ext.BatchProducer: our batched publish beside upstream's one-call-per-message
SendMessage (see protocol/DanubeExt.proto). A request is not parsed into protobuf objects:
danube._core.parse_message_batch checks and indexes its bytes in C, and a reliable topic
stamps and stores all its messages in one pass, without a Python object per message."""

from google.protobuf.message import DecodeError

from danube.broker._stamp import parse_message_batch
from danube.broker import errors as e
from danube.broker.services.errors import to_rpc_error
from danube.broker.services.limits import SEND_MESSAGES, limit_send_messages
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError
from danube.rpc.server import Kind


class BatchProducerService:
    def __init__(self, core):
        self.core = core
        # What the stamp appends to every message, per producer: msg_id.producer_id, the
        # topic_name (only over a msg_id the message came with: otherwise the topic's
        # delivery stamp supplies it), producer_name.
        self._stamps = {}

    def _stamp(self, producer):
        key = (producer.producer_id, producer.topic.name, producer.name)
        stamp = self._stamps.get(key)
        if stamp is None:
            if len(self._stamps) >= 4096:
                self._stamps.clear()
            stamp = self._stamps[key] = (
                pb.MsgID(producer_id=producer.producer_id).SerializeToString(),
                pb.MsgID(topic_name=producer.topic.name).SerializeToString(),
                pb.StreamMessage(producer_name=producer.name).SerializeToString())
        return stamp

    async def SendMessages(self, batch, context):
        try:
            producer = self.core.producer(batch.producer_id)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        topic = producer.topic
        if topic.log is not None:
            try:
                offsets = await topic.publish_reliable_raw(batch, *self._stamp(producer))
            except e.BrokerError as exc:
                raise to_rpc_error(exc) from None
            producer.sent += len(offsets)
            if batch.offsets_as_range:
                return ext.BatchResponse(request_id=batch.request_id, accepted=len(offsets),
                                         first_offset=offsets.start)
            return ext.BatchResponse(request_id=batch.request_id, accepted=len(offsets),
                                     offsets=offsets, first_offset=offsets.start)
        raws = batch.messages()
        accepted = 0
        try:
            for index, raw in enumerate(raws):
                try:
                    msg = pb.StreamMessage.FromString(raw)
                except DecodeError as exc:
                    # The C index checks the framing, not the strings' UTF-8.
                    raise e.InvalidArgument(f"messages[{index}]: invalid StreamMessage: "
                                            f"{exc}") from None
                mid = msg.msg_id
                if not msg.HasField("msg_id"):
                    mid.broker_addr = self.core.cfg.advertised_broker_url
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
        return ext.BatchResponse(request_id=batch.request_id, accepted=accepted)


def register(server, core):
    service = BatchProducerService(core)
    server.add_method(SEND_MESSAGES, Kind.UNARY_UNARY, service.SendMessages,
                      parse_message_batch, lambda m: m.SerializeToString())
    limit_send_messages(server, core)
