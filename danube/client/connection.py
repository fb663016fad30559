"""Connections to brokers: one self-healing HTTP/2 Channel per connect_url, shared by every
producer, consumer and lookup that talks to that broker, and the method stubs on it."""

import dataclasses

from danube.client._delivery import decode_delivery_batch, decode_stream_message
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.proto import SchemaRegistry_pb2 as sr
from danube.rpc.client import Channel
from danube.rpc.config import MAX_GRPC_MESSAGE, TransportConfig
from danube.rpc.status import RpcError, StatusCode

# No size cap of our own on requests: the broker's limit is the one that counts, and it
# refuses an oversize publish from the length prefix, with its reason (a local cap would
# say RESOURCE_EXHAUSTED with no word of the broker's policy).
CHANNEL_CONFIG = TransportConfig(max_send_message_size=MAX_GRPC_MESSAGE)


@dataclasses.dataclass(frozen=True)
class BrokerAddress:
    """Where a topic is served: `connect_url` is dialled, `broker_url` is the broker's
    identity (stamped into MsgID, and sent as x-danube-broker-url through a proxy)."""
    connect_url: str
    broker_url: str
    proxy: bool = False

    def call_metadata(self):
        # The proxy routes on this header; a broker reached directly ignores it (a.6).
        return (("x-danube-broker-url", self.broker_url),) if self.proxy else None


def _method(channel, path, request_cls, response_cls):
    return channel.unary_unary(path, request_cls.SerializeToString, response_cls.FromString)


def _decoding(decode, what):
    """Deliveries decoded by danube.client._delivery; a malformed one fails the stream with
    INTERNAL naming the fault, as a protobuf parse error would be reported."""
    def deserialize(data):
        try:
            return decode(data)
        except ValueError as exc:
            raise RpcError(StatusCode.INTERNAL, f"malformed {what} from the broker: {exc}")
    return deserialize


class BrokerStub:
    """The client-port methods of one broker, bound to its channel."""

    def __init__(self, channel):
        self.channel = channel
        m = _method
        self.create_producer = m(channel, "/danube.ProducerService/CreateProducer",
                                 pb.ProducerRequest, pb.ProducerResponse)
        # Requests are serialised by the producer itself (it reuses a template message).
        self.send_message = channel.unary_unary("/danube.ProducerService/SendMessage",
                                                None, pb.MessageResponse.FromString)
        # Our extension (protocol/DanubeExt.proto); UNIMPLEMENTED on an upstream broker.
        self.send_messages = m(channel, "/danube_ext.BatchProducer/SendMessages",
                               ext.MessageBatch, ext.BatchResponse)
        # The same call with the whole request already serialized (a MessageBatchRaw from
        # danube.codec.msgbatch.encode_message_batch).
        self.send_messages_raw = channel.unary_unary("/danube_ext.BatchProducer/SendMessages",
                                                     None, ext.BatchResponse.FromString)
        self.subscribe = m(channel, "/danube.ConsumerService/Subscribe",
                           pb.ConsumerRequest, pb.ConsumerResponse)
        self.receive_messages = channel.unary_stream(
            "/danube.ConsumerService/ReceiveMessages", pb.ReceiveRequest.SerializeToString,
            _decoding(decode_stream_message, "StreamMessage"))
        self.ack = m(channel, "/danube.ConsumerService/Ack", pb.AckRequest, pb.AckResponse)
        # Our extension's batched consume (UNIMPLEMENTED on an upstream broker).
        self.receive_batches = channel.unary_stream(
            "/danube_ext.BatchConsumer/ReceiveBatches",
            ext.ReceiveBatchesRequest.SerializeToString,
            _decoding(decode_delivery_batch, "DeliveryBatch"))
        self.ack_ranges = m(channel, "/danube_ext.BatchConsumer/AckRanges",
                            ext.AckRangesRequest, ext.AckRangesResponse)
        self.nack = m(channel, "/danube.ConsumerService/Nack", pb.NackRequest, pb.NackResponse)
        self.topic_lookup = m(channel, "/danube.Discovery/TopicLookup",
                              pb.TopicLookupRequest, pb.TopicLookupResponse)
        self.topic_partitions = m(channel, "/danube.Discovery/TopicPartitions",
                                  pb.TopicLookupRequest, pb.TopicPartitionsResponse)
        self.health_check = m(channel, "/danube.HealthCheck/HealthCheck",
                              pb.HealthCheckRequest, pb.HealthCheckResponse)
        self.register_schema = m(channel, "/danube_schema.SchemaRegistry/RegisterSchema",
                                 sr.RegisterSchemaRequest, sr.RegisterSchemaResponse)
        self.get_latest_schema = m(channel, "/danube_schema.SchemaRegistry/GetLatestSchema",
                                   sr.GetLatestSchemaRequest, sr.GetSchemaResponse)
        self.get_schema = m(channel, "/danube_schema.SchemaRegistry/GetSchema",
                            sr.GetSchemaRequest, sr.GetSchemaResponse)
        self.list_versions = m(channel, "/danube_schema.SchemaRegistry/ListVersions",
                               sr.ListVersionsRequest, sr.ListVersionsResponse)
        self.check_compatibility = m(channel, "/danube_schema.SchemaRegistry/CheckCompatibility",
                                     sr.CheckCompatibilityRequest, sr.CheckCompatibilityResponse)
        self.list_subjects = m(channel, "/danube_schema.SchemaRegistry/ListSubjects",
                               sr.ListSubjectsRequest, sr.ListSubjectsResponse)
        self.configure_topic_schema = m(
            channel, "/danube_schema.SchemaRegistry/ConfigureTopicSchema",
            sr.ConfigureTopicSchemaRequest, sr.ConfigureTopicSchemaResponse)
        self.delete_schema_version = m(
            channel, "/danube_schema.SchemaRegistry/DeleteSchemaVersion",
            sr.DeleteSchemaVersionRequest, sr.DeleteSchemaVersionResponse)


def pool_key(url):
    """`http://h:p` and `h:p` name the same plain-text broker; keep https distinct."""
    url = url.strip().rstrip("/")
    return url[7:] if url.startswith("http://") else url


class ConnectionPool:
    """Channels keyed by connect_url. A Channel reconnects by itself after a connection
    loss, so entries live as long as the client."""

    def __init__(self, *, ssl=None, token=None, connect_timeout=10.0, server_hostname=None):
        self.ssl = ssl
        self.server_hostname = server_hostname
        self.connect_timeout = connect_timeout
        # The token goes into every call's headers (b.8: "authorization: Bearer <JWT>").
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stubs = {}

    def stub(self, url) -> BrokerStub:
        key = pool_key(url)
        stub = self._stubs.get(key)
        if stub is None:
            channel = Channel(key, ssl=self.ssl, metadata=self.metadata,
                              server_hostname=self.server_hostname,
                              connect_timeout=self.connect_timeout, config=CHANNEL_CONFIG)
            stub = self._stubs[key] = BrokerStub(channel)
        return stub

    async def close(self):
        stubs, self._stubs = list(self._stubs.values()), {}
        for stub in stubs:
            await stub.channel.close()
