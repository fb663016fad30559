"""ReadRange's columnar batches (danube_ext.ColumnBatch) as pyarrow RecordBatches of the
connector's schema. The broker sends each column as the buffers of an Arrow array, so a
batch becomes arrays without a step per message: Spark takes the record batches as they are,
and no row is ever a Python object."""

import numpy as np
import pyarrow as pa

from danube_spark.errors import DataLoss
from danube_spark.schema import ARROW_SCHEMA

_ATTRIBUTES = ARROW_SCHEMA.field("attributes").type
_TIMESTAMP = ARROW_SCHEMA.field("timestamp").type


def record_batches(batches, topic, partition, start, end, fail_on_data_loss):
    """RecordBatches of [start, end) of one partition from ReadRange's columnar batches.
    Offsets must follow each other from ``start``: a gap is history the broker no longer
    holds."""
    expected = start
    name = topic.encode()
    for columns in batches:
        n = columns.count
        if not n:
            continue
        offsets = np.frombuffer(columns.topic_offsets, "<i8")
        first, last = int(offsets[0]), int(offsets[-1])
        if fail_on_data_loss and first != expected:
            raise DataLoss(f"offsets [{expected}, {first}) of {topic} are missing from the "
                           f"broker's answer")
        if fail_on_data_loss and last != first + n - 1:
            raise DataLoss(f"the broker's answer skips offsets of {topic} between {first} and "
                           f"{last}")
        expected = last + 1
        yield _record_batch(columns, n, name, partition, offsets)
    if expected < end and fail_on_data_loss:
        raise DataLoss(f"offsets [{expected}, {end}) of {topic} are missing from the broker's "
                       f"answer")


def _buf(data):
    return pa.py_buffer(data) if data else None


def _var(kind, n, validity, offsets, data):
    return pa.Array.from_buffers(kind, n, [_buf(validity), pa.py_buffer(offsets),
                                           pa.py_buffer(data)])


def _fixed(kind, n, validity, data):
    return pa.Array.from_buffers(kind, n, [_buf(validity), pa.py_buffer(data)])


def _constant_string(value, n):
    bounds = np.arange(n + 1, dtype="<i4") * len(value)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(bounds),
                                                 pa.py_buffer(value * n)])


def _record_batch(c, n, topic, partition, offsets):
    # publish_time is milliseconds since the epoch; Spark's timestamps are microseconds.
    micros = np.frombuffer(c.publish_times, "<i8") * 1000
    entries = pa.StructArray.from_arrays(
        [_var(pa.string(), len(c.attribute_key_offsets) // 4 - 1, None,
              c.attribute_key_offsets, c.attribute_keys),
         _var(pa.string(), len(c.attribute_value_offsets) // 4 - 1, None,
              c.attribute_value_offsets, c.attribute_values)],
        fields=[_ATTRIBUTES.key_field, _ATTRIBUTES.item_field])
    attributes = pa.Array.from_buffers(_ATTRIBUTES, n, [None, pa.py_buffer(c.attribute_offsets)],
                                       children=[entries])
    batch = pa.RecordBatch.from_arrays([
        _var(pa.string(), n, c.routing_key_validity, c.routing_key_offsets, c.routing_keys),
        _var(pa.binary(), n, None, c.payload_offsets, c.payloads),
        _constant_string(topic, n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets),
        pa.Array.from_buffers(_TIMESTAMP, n, [None, pa.py_buffer(micros)]),
        _var(pa.string(), n, None, c.producer_name_offsets, c.producer_names),
        attributes,
        # uint64 on the wire; Spark has no unsigned long (ids stay far below 2^63).
        _fixed(pa.int64(), n, c.schema_id_validity, c.schema_ids),
        _fixed(pa.int32(), n, c.schema_version_validity, c.schema_versions),
    ], schema=ARROW_SCHEMA)
    # Buffers too short for their arrays (a broken answer) fail here, not in Spark's reader.
    batch.validate()
    return batch
