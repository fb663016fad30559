"""ReadRange's columnar answers read straight from the received bytes: each ColumnBatch
field becomes a memoryview of the response, so a batch's megabytes are never copied between
gRPC and Arrow (protobuf's parser would copy each into its arena, and again into Python)."""

from danube_spark.errors import DanubeSparkError

# ColumnBatch's fields (protocol/DanubeExt.proto), by number; 1 is count.
_FIELDS = {
    2: "topic_offsets", 3: "publish_times", 4: "payload_offsets", 5: "payloads",
    6: "routing_key_validity", 7: "routing_key_offsets", 8: "routing_keys",
    9: "producer_name_offsets", 10: "producer_names", 11: "attribute_offsets",
    12: "attribute_key_offsets", 13: "attribute_keys", 14: "attribute_value_offsets",
    15: "attribute_values", 16: "schema_id_validity", 17: "schema_ids",
    18: "schema_version_validity", 19: "schema_versions",
}
_EMPTY = memoryview(b"")


class BrokerAnswerError(DanubeSparkError):
    pass


class ColumnView:
    """A ColumnBatch's fields as memoryviews (empty when absent), and its count."""

    __slots__ = ("count",) + tuple(_FIELDS.values())

    def __init__(self):
        self.count = 0
        for name in _FIELDS.values():
            setattr(self, name, _EMPTY)


def _varint(view, pos, end):
    value = shift = 0
    while pos < end and shift < 70:
        b = view[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
    raise BrokerAnswerError("the broker's ReadRange answer is not well-formed protobuf")


def _fields(view, pos, end):
    """(field number, wire type, value or (start, stop)) of the message view[pos:end]."""
    while pos < end:
        tag, pos = _varint(view, pos, end)
        wire = tag & 7
        if wire == 0:
            value, pos = _varint(view, pos, end)
            yield tag >> 3, wire, value
        elif wire == 2:
            n, pos = _varint(view, pos, end)
            if pos + n > end:
                raise BrokerAnswerError("the broker's ReadRange answer is truncated")
            yield tag >> 3, wire, (pos, pos + n)
            pos += n
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise BrokerAnswerError(f"the broker's ReadRange answer has wire type {wire}")


def read_range_batch(data):
    """A serialized ReadRangeBatch -> ColumnView. Raises if it holds messages instead
    (a broker that does not know columnar reads)."""
    view = memoryview(data)
    out = ColumnView()
    for field, wire, value in _fields(view, 0, len(view)):
        if field == 1 and wire == 2:
            raise BrokerAnswerError("the broker answered ReadRange with messages, not columns: "
                                    "it predates columnar reads; upgrade the broker")
        if field == 2 and wire == 2:
            for f, w, v in _fields(view, *value):
                if f == 1 and w == 0:
                    out.count = v
                elif w == 2 and f in _FIELDS:
                    setattr(out, _FIELDS[f], view[v[0]:v[1]])
    return out
