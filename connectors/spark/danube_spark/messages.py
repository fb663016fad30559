"""Serialized danube.StreamMessage -> the connector's row, and rows -> StreamMessage."""

import datetime

from danube_spark._proto import DanubeApi_pb2 as api
from danube_spark.errors import DataLoss

SCHEMA = ("key string, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, producer string, attributes map<string,string>, "
          "schema_id long, schema_version int")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MS = datetime.timedelta(milliseconds=1)


def rows(batches, topic, partition, start, end, fail_on_data_loss):
    """Rows of [start, end) of one partition from ReadRange's batches. Offsets must follow
    each other from `start`: a gap is history the broker no longer holds."""
    expected = start
    decode = api.StreamMessage.FromString
    for batch in batches:
        for raw in batch:
            msg = decode(raw)
            offset = msg.msg_id.topic_offset
            if offset != expected and fail_on_data_loss:
                raise DataLoss(f"offsets [{expected}, {offset}) of {topic} are missing from "
                               f"the broker's answer")
            expected = offset + 1
            yield (msg.routing_key if msg.HasField("routing_key") else None,
                   msg.payload,
                   topic,
                   partition,
                   offset,
                   # publish_time is milliseconds since the epoch (DanubeApi.proto).
                   _EPOCH + msg.publish_time * _MS,
                   msg.producer_name,
                   dict(msg.attributes),
                   msg.schema_id if msg.HasField("schema_id") else None,
                   msg.schema_version if msg.HasField("schema_version") else None)
    if expected < end and fail_on_data_loss:
        raise DataLoss(f"offsets [{expected}, {end}) of {topic} are missing from the broker's "
                       f"answer")


def to_message(request_id, value, key, attributes, producer_name, publish_time_ms):
    if isinstance(value, str):
        value = value.encode()
    elif value is None:
        raise ValueError("column value is null: every row needs a value to publish")
    msg = api.StreamMessage(request_id=request_id, payload=bytes(value),
                            publish_time=publish_time_ms, producer_name=producer_name)
    if attributes:
        msg.attributes.update({str(k): str(v) for k, v in attributes.items() if v is not None})
    if key is not None:
        msg.routing_key = key
    return msg
