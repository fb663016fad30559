"""Columnar history reads: the broker's ColumnBatch encoder (danube.broker._columns) and the
connector's Arrow decoding of it (danube_spark.columns), checked against what protobuf itself
decodes from the same stored messages."""

import datetime
import random

import pytest

pytest.importorskip("danube_spark", reason="bin/test builds and installs connectors/spark")

from danube.broker._columns import columnar_batch  # noqa: E402
from danube.proto import DanubeApi_pb2 as api  # noqa: E402
from danube_spark._proto import DanubeExt_pb2 as ext  # noqa: E402
from danube_spark.columns import record_batches  # noqa: E402
from danube_spark.errors import DataLoss  # noqa: E402
from danube_spark.schema import ARROW_SCHEMA  # noqa: E402
from danube_spark.wire import BrokerAnswerError, read_range_batch  # noqa: E402

T = "/default/t-part-2"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _stored(offset, **fields):
    msg = api.StreamMessage(payload=b"p%d" % offset, publish_time=1_700_000_000_123,
                            producer_name="prod", **fields)
    msg.msg_id.topic_offset = offset
    return msg.SerializeToString()


def _wire(pairs):
    """What the connector receives: the broker's columns, read as the connector reads them;
    protobuf's own parse of the same bytes agrees."""
    data = columnar_batch(pairs)
    view = read_range_batch(data)
    parsed = ext.ReadRangeBatch.FromString(data)
    assert not parsed.messages and parsed.columns.count == view.count == len(pairs)
    for field in parsed.columns.DESCRIPTOR.fields[1:]:
        assert bytes(getattr(view, field.name)) == getattr(parsed.columns, field.name)
    return view


def _rows(batches, start, end, fail=True):
    out = []
    for rb in record_batches(batches, T, 2, start, end, fail):
        assert rb.schema.equals(ARROW_SCHEMA)
        rb.validate(full=True)
        out.extend(rb.to_pylist())
    return out


def _expected(offset, raw):
    msg = api.StreamMessage.FromString(raw)
    return {
        "key": msg.routing_key if msg.HasField("routing_key") else None,
        "value": msg.payload, "topic": T, "partition": 2, "offset": offset,
        "timestamp": EPOCH + datetime.timedelta(milliseconds=msg.publish_time),
        "producer": msg.producer_name,
        "attributes": dict(msg.attributes),
        "schema_id": msg.schema_id if msg.HasField("schema_id") else None,
        "schema_version": msg.schema_version if msg.HasField("schema_version") else None,
    }


def _as_dicts(rows):
    return [dict(r, attributes=dict(r["attributes"])) for r in rows]


def test_columns_carry_every_field():
    pairs = [(3, _stored(3, routing_key="k", attributes={"a": "b", "c": ""})),
             (4, _stored(4, schema_id=7, schema_version=2)),
             (5, _stored(5, routing_key="", schema_id=0, schema_version=0))]
    rows = _as_dicts(_rows([_wire(pairs)], 3, 6))
    assert rows == [_expected(o, raw) for o, raw in pairs]
    # Present-but-zero optional fields are values, not nulls.
    assert (rows[2]["key"], rows[2]["schema_id"], rows[2]["schema_version"]) == ("", 0, 0)


def test_fields_as_protobuf_decodes_them():
    # Repeated fields (the last wins), attributes split around other fields and a key sent
    # twice (map: first place, last value), unknown fields and groups are skipped.
    first = api.StreamMessage(payload=b"old", producer_name="a", attributes={"x": "1"})
    second = api.StreamMessage(payload=b"new", routing_key="rk", attributes={"y": "2"})
    third = api.StreamMessage(attributes={"x": "3"}, publish_time=42)
    unknown = b"\xa8\x06\x01" + b"\xab\x06\x08\x01\xac\x06"     # field 101 varint; group 101
    raw = (first.SerializeToString() + unknown + second.SerializeToString()
           + third.SerializeToString())
    rows = _as_dicts(_rows([_wire([(0, raw)])], 0, 1))
    assert rows == [_expected(0, raw)]
    assert list(rows[0]["attributes"].items()) == [("x", "3"), ("y", "2")]


def test_random_messages_match_protobuf():
    rnd = random.Random(19)
    pairs = []
    for offset in range(500):
        fields = {"payload": rnd.randbytes(rnd.choice([0, 1, 100, 3000])),
                  "publish_time": rnd.randrange(1 << 41),
                  "producer_name": rnd.choice(["", "p", "producer-ü"])}
        if rnd.random() < 0.5:
            fields["routing_key"] = rnd.choice(["", "key", "ключ"])
        if rnd.random() < 0.3:
            fields["schema_id"] = rnd.randrange(1 << 40)
        if rnd.random() < 0.3:
            fields["schema_version"] = rnd.randrange(1 << 31)
        attrs = {f"k{rnd.randrange(5)}": "v" * rnd.randrange(3) for _ in range(rnd.randrange(4))}
        msg = api.StreamMessage(attributes=attrs, **fields)
        pairs.append((offset, msg.SerializeToString()))
    batches = [_wire(pairs[i:i + 128]) for i in range(0, 500, 128)]
    assert _as_dicts(_rows(batches, 0, 500)) == [_expected(o, raw) for o, raw in pairs]


def test_a_malformed_stored_message_is_named():
    with pytest.raises(ValueError, match="offset 9 is not well-formed"):
        columnar_batch([(8, _stored(8)), (9, b"\x1a\x05ab")])
    with pytest.raises(ValueError, match="malformed attributes entry"):
        columnar_batch([(1, b"\x3a\x02\x0a\x05")])


def test_a_gap_is_data_loss_or_skipped():
    gap = [_wire([(3, _stored(3))]), _wire([(6, _stored(6))])]
    with pytest.raises(DataLoss, match=r"offsets \[4, 6\) of /default/t-part-2 are missing"):
        _rows(gap, 3, 7)
    with pytest.raises(DataLoss, match=r"offsets \[4, 7\) of /default/t-part-2 are missing"):
        _rows([_wire([(3, _stored(3))])], 3, 7)
    assert [r["offset"] for r in _rows(gap, 3, 7, fail=False)] == [3, 6]


def test_empty_batch_and_range():
    assert _wire([]).count == 0
    assert _rows([_wire([])], 0, 0) == []


def test_answers_the_connector_cannot_use_are_named():
    old = ext.ReadRangeBatch(messages=[_stored(0)]).SerializeToString()
    with pytest.raises(BrokerAnswerError, match="predates columnar reads; upgrade the broker"):
        read_range_batch(old)
    with pytest.raises(BrokerAnswerError, match="truncated"):
        read_range_batch(columnar_batch([(0, _stored(0))])[:-3])
    # Buffers shorter than their arrays: refused before Spark reads them.
    short = read_range_batch(columnar_batch([(0, _stored(0)), (1, _stored(1))]))
    short.payload_offsets = short.payload_offsets[:4]
    with pytest.raises(Exception, match="(?i)buffer|offset|length"):
        list(record_batches([short], T, 2, 0, 2, True))
