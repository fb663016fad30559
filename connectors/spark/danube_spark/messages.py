"""A row to write -> danube.StreamMessage."""

from danube_spark._proto import DanubeApi_pb2 as api

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
