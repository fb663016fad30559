"""danube.schema._avrocheck: Avro datums checked in C, against fastavro's reader on the same
bytes (valid datums, and thousands of mutations of them)."""

import io
import random

import fastavro
import pytest

from danube.schema._avrocheck import AvroChecker

SCHEMA = {
    "type": "record", "name": "Account", "namespace": "x", "fields": [
        {"name": "id", "type": "long"}, {"name": "n", "type": "int"},
        {"name": "name", "type": "string"}, {"name": "raw", "type": "bytes"},
        {"name": "country", "type": {"type": "enum", "name": "C", "symbols": ["se", "no"]}},
        {"name": "score", "type": "double"}, {"name": "ratio", "type": "float"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "m", "type": {"type": "map", "values": "int"}},
        {"name": "opt", "type": ["null", "string"]},
        {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
        {"name": "next", "type": ["null", "Account"]},
        # A logical type is checked as its underlying type (fastavro's reader would also
        # refuse a long no datetime can hold, which is a reader's concern, not the datum's).
        {"name": "when", "type": "long"},
        {"name": "active", "type": "boolean"},
    ]}
PARSED = fastavro.parse_schema(SCHEMA)


def encode(record):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, PARSED, record)
    return out.getvalue()


def record(i, nested=True):
    return {"id": -i, "n": i, "name": f"ü{i}", "raw": bytes([i % 256]) * 3, "country": "no",
            "score": 1.5, "ratio": 0.25, "tags": ["a", "b"] * (i % 3), "m": {"k": i},
            "opt": None if i % 2 else "x", "fx": b"abc",
            "next": record(i + 1, False) if nested else None, "when": 1_700_000_000_000,
            "active": bool(i % 2)}


def fastavro_valid(data):
    buf = io.BytesIO(data)
    try:
        fastavro.schemaless_reader(buf, PARSED, None)
    except Exception:  # noqa: BLE001 - any failure is "invalid"
        return False
    return buf.tell() == len(data)


def test_valid_datums_pass_and_batches_name_the_first_bad():
    checker = AvroChecker(SCHEMA)
    good = [encode(record(i)) for i in range(50)]
    assert all(checker.valid(g) for g in good)
    assert checker.first_invalid(good) == -1
    assert checker.first_invalid(good[:7] + [good[7] + b"\x00"] + good[8:]) == 7
    assert checker.first_invalid(good[:3] + [good[3][:-1]]) == 3
    assert checker.first_invalid([]) == -1


def test_never_accepts_what_fastavro_refuses():
    checker = AvroChecker(SCHEMA)
    rnd = random.Random(20)
    base = encode(record(3))
    stricter = 0
    for _ in range(20_000):
        data = bytearray(base)
        for _ in range(rnd.randint(1, 3)):
            op = rnd.random()
            if op < 0.4 and data:
                data[rnd.randrange(len(data))] = rnd.randrange(256)
            elif op < 0.7 and data:
                del data[rnd.randrange(len(data))]
            else:
                data.insert(rnd.randrange(len(data) + 1), rnd.randrange(256))
        data = bytes(data)
        ours, theirs = checker.valid(data), fastavro_valid(data)
        assert not (ours and not theirs), data.hex()
        stricter += theirs and not ours
    # Where they differ, the spec sides with the checker (e.g. a boolean byte of 2).
    assert stricter < 1000


@pytest.mark.parametrize("data, why", [
    (b"\x02", "boolean byte other than 0 or 1"),
    (b"\xff\xff\xff\xff\xff\x01", "int longer than 5 bytes"),
    (b"\x06\xc3\x28\x00", "string not UTF-8"),
])
def test_spec_rules_fastavro_is_lenient_about(data, why):
    schemas = {"boolean byte other than 0 or 1": "boolean",
               "int longer than 5 bytes": "int",
               "string not UTF-8": "string"}
    assert not AvroChecker(schemas[why]).valid(data[:2] if why == "string not UTF-8"
                                               else data)


def test_logical_types_are_their_underlying_type():
    checker = AvroChecker({"type": "long", "logicalType": "timestamp-millis"})
    assert checker.valid(b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01")   # max long


def test_primitives_and_named_references():
    assert AvroChecker("null").valid(b"")
    assert AvroChecker("double").valid(b"\x00" * 8) and not AvroChecker("double").valid(b"\0")
    linked = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}
    parsed = fastavro.parse_schema(linked)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, {"v": 1, "next": {"v": 2, "next": None}})
    assert AvroChecker(linked).valid(out.getvalue())
    with pytest.raises(ValueError, match="unknown Avro type"):
        AvroChecker({"type": "record", "name": "R", "fields": [{"name": "a", "type": "Nope"}]})
