"""gRPC calls to the broker, with grpcio and the connector's own generated messages (no
generated stubs: the methods are named by path)."""

import grpc

from danube_spark._proto import DanubeApi_pb2 as api
from danube_spark._proto import DanubeExt_pb2 as ext
from danube_spark.errors import from_rpc
from danube_spark.options import target
from danube_spark.planning import PartitionRange
from danube_spark.wire import read_range_batch

# ReadRange batches and SendMessages batches can be large; the broker bounds what it sends.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1),
                   ("grpc.max_send_message_length", -1)]


def open_channel(service_url):
    address, secure = target(service_url)
    if secure:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(), CHANNEL_OPTIONS)
    return grpc.insecure_channel(address, CHANNEL_OPTIONS)


class Broker:
    """One channel to the broker at service_url; close() when done (one per Spark task)."""

    def __init__(self, service_url, timeout=30.0, broker_url=None):
        """``broker_url``: in a cluster behind an ingress (a lookup answered ``proxy``), the
        broker the calls are for; the ingress routes by the header naming it."""
        self.service_url = service_url
        self.timeout = timeout
        self.metadata = (("x-danube-broker-url", broker_url),) if broker_url else None
        self.channel = open_channel(service_url)
        ch = self.channel
        self._get_offsets = ch.unary_unary(
            "/danube_ext.TopicHistory/GetOffsets",
            request_serializer=ext.OffsetsRequest.SerializeToString,
            response_deserializer=ext.OffsetsResponse.FromString)
        self._read_range = ch.unary_stream(
            "/danube_ext.TopicHistory/ReadRange",
            request_serializer=ext.ReadRangeRequest.SerializeToString,
            # Raw bytes: read_range_batch reads them in read_columns, where its errors keep
            # their message (grpcio turns a deserializer's into "Exception deserializing").
            response_deserializer=None)
        self._create_producer = ch.unary_unary(
            "/danube.ProducerService/CreateProducer",
            request_serializer=api.ProducerRequest.SerializeToString,
            response_deserializer=api.ProducerResponse.FromString)
        self._send_messages = ch.unary_unary(
            "/danube_ext.BatchProducer/SendMessages",
            request_serializer=ext.MessageBatch.SerializeToString,
            response_deserializer=ext.BatchResponse.FromString)
        self._topic_partitions = ch.unary_unary(
            "/danube.Discovery/TopicPartitions",
            request_serializer=api.TopicLookupRequest.SerializeToString,
            response_deserializer=api.TopicPartitionsResponse.FromString)
        self._topic_lookup = ch.unary_unary(
            "/danube.Discovery/TopicLookup",
            request_serializer=api.TopicLookupRequest.SerializeToString,
            response_deserializer=api.TopicLookupResponse.FromString)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def offsets(self, topic):
        """[PartitionRange] of a reliable topic (every partition of a partitioned one)."""
        try:
            response = self._get_offsets(ext.OffsetsRequest(topic=topic), timeout=self.timeout,
                                         metadata=self.metadata)
        except grpc.RpcError as exc:
            raise from_rpc(exc, "the offsets", topic, self.service_url) from None
        return [PartitionRange(p.topic, p.partition, p.earliest, p.latest)
                for p in response.partitions]

    def read_columns(self, topic, start, end, max_messages):
        """Yields the ColumnBatches of [start, end) of one partition (as ColumnViews)."""
        request = ext.ReadRangeRequest(topic=topic, start_offset=start, end_offset=end,
                                       max_messages=max_messages, columnar=True)
        try:
            for data in self._read_range(request, timeout=None, metadata=self.metadata):
                yield read_range_batch(data)
        except grpc.RpcError as exc:
            raise from_rpc(exc, f"reading offsets [{start}, {end})", topic,
                           self.service_url) from None

    def partitions(self, topic):
        """The -part-N names of a partitioned topic, [topic] or [] otherwise."""
        try:
            response = self._topic_partitions(api.TopicLookupRequest(request_id=1, topic=topic),
                                              timeout=self.timeout)
        except grpc.RpcError as exc:
            raise from_rpc(exc, "the partitions", topic, self.service_url) from None
        return list(response.partitions)

    def lookup(self, topic):
        """(response type name, connect_url, broker_url, proxy) of danube.Discovery's
        TopicLookup: which broker of the cluster serves ``topic``."""
        try:
            r = self._topic_lookup(api.TopicLookupRequest(request_id=1, topic=topic),
                                   timeout=self.timeout)
        except grpc.RpcError as exc:
            raise from_rpc(exc, "the owner", topic, self.service_url) from None
        kind = api.TopicLookupResponse.LookupType.Name(r.response_type)
        return kind, r.connect_url, r.broker_url, r.proxy

    def create_reliable_producer(self, topic, name):
        request = api.ProducerRequest(request_id=0, producer_name=name, topic_name=topic,
                                      producer_access_mode=api.Shared,
                                      dispatch_strategy=api.Reliable)
        try:
            return self._create_producer(request, timeout=self.timeout,
                                         metadata=self.metadata).producer_id
        except grpc.RpcError as exc:
            raise from_rpc(exc, "creating a reliable producer", topic,
                           self.service_url) from None

    def send_messages(self, request_id, producer_id, messages):
        """Publish one batch; returns how many the broker accepted (all, or an error)."""
        batch = ext.MessageBatch(request_id=request_id, producer_id=producer_id,
                                 messages=messages, offsets_as_range=True)
        return self._send_messages(batch, timeout=self.timeout,
                                   metadata=self.metadata).accepted
