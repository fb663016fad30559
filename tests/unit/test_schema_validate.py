"""danube.schema.validate: payload validators per schema type, their messages, batches (the
index of the first invalid payload) and the cache by fingerprint."""

import io
import json
import struct

import fastavro
import pytest

from danube.schema import PayloadInvalid, parse
from danube.schema.validate import validator_for

JSON_USER = json.dumps({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name"],
})
AVRO_USER = json.dumps({"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"},
    {"name": "email", "type": ["null", "string"], "default": None}]})
PROTO_USER = 'syntax = "proto3";\nmessage User { string name = 1; int32 age = 2; }\n'


def avro(record, schema=AVRO_USER):
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(schema)), record)
    return buf.getvalue()


GOOD_AVRO = avro({"name": "alice", "age": 30, "email": None})


def rejects(validator, payload, match):
    with pytest.raises(PayloadInvalid, match=match):
        validator.check(payload)


def test_bytes_accepts_anything():
    v = validator_for(parse("bytes", b""))
    v.check(b"\xff\x00")
    assert v.check_many([b"", b"\xff"]) is None


def test_string_requires_utf8():
    v = validator_for(parse("string", b""))
    v.check("héllo".encode())
    rejects(v, b"\xff\xfe", "payload is not a valid UTF-8 string")
    assert v.check_many([b"ok", b"\xff", b"ok"]) == 1


def test_number_is_four_or_eight_bytes_as_upstream():
    v = validator_for(parse("double", b""))
    v.check(struct.pack("<d", 1.5))
    v.check(struct.pack("<i", 7))
    rejects(v, b"12", "expected 4 or 8 bytes, got 2")
    assert v.check_many([b"1234", b"123456789"]) == 1


def test_json_valid_payload_passes():
    validator_for(parse("json", JSON_USER)).check(b'{"name": "a", "age": 3, "tags": ["x"]}')


@pytest.mark.parametrize("payload, match", [
    (b'{"name": "a", "age": "3"}', r"payload does not match schema: data\.age must be integer"),
    (b'{"age": 3}', r"payload does not match schema: data must contain \['name'\]"),
    (b'{"name": "a", "age": -1}', r"data\.age must be bigger than or equal to 0"),
    (b'{"name": "a", "tags": ["x", 1]}', r"data\.tags\[1\] must be string"),
    (b'{"name": ', r"payload is not JSON: "),
    (b'{"name": "a", "age": NaN}', r"payload is not JSON: "),
    (b"\xff", r"payload is not JSON: "),
])
def test_json_invalid_payload_names_the_path_and_rule(payload, match):
    rejects(validator_for(parse("json", JSON_USER)), payload, match)


def test_json_check_many_gives_the_first_invalid_index():
    v = validator_for(parse("json", JSON_USER))
    good, bad = b'{"name": "a"}', b'{"name": 1}'
    assert v.check_many([good, good]) is None
    assert v.check_many([good, bad, good, b"nope"]) == 1
    assert v.check_many([b"nope", good]) == 0
    assert v.check_many([]) is None


def test_json_defaults_are_not_applied_and_remote_refs_not_fetched():
    schema = json.dumps({"type": "object", "properties": {
        "a": {"type": "string", "default": "x"},
        "b": {"$ref": "https://example.invalid/schema.json"}}})
    v = validator_for(parse("json", schema))
    v.check(b"{}")  # neither applying "a"'s default nor resolving "b" is needed here
    rejects(v, b'{"b": 1}', "payload cannot be validated: ")
    assert v.check_many([b"{}", b'{"b": 1}']) == 1


def test_json_schema_fastjsonschema_cannot_compile_falls_back_to_jsonschema():
    # prefixItems is 2020-12, which fastjsonschema does not know; jsonschema validates it.
    schema = json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema",
                         "type": "array", "prefixItems": [{"type": "integer"}]})
    v = validator_for(parse("json", schema))
    v.check(b"[1, 2]")
    rejects(v, b'["x"]', r"payload does not match schema: data\[0\]: 'x' is not of type")
    assert v.check_many([b"[1]", b'["x"]']) == 1


def test_avro_datum_passes():
    validator_for(parse("avro", AVRO_USER)).check(GOOD_AVRO)


@pytest.mark.parametrize("payload, match", [
    (GOOD_AVRO + b"\x00", r"payload is not valid Avro for schema User: 1 bytes left after"),
    (GOOD_AVRO[:-2], r"payload is not valid Avro for schema User: payload ends early"),
    (b"", r"payload ends early"),
    (b'{"name": "alice", "age": 30}', r"payload is not valid Avro for schema User"),
    (b"\x04\xff\xfe\x02\x00", r"UnicodeDecodeError"),
    (avro({"name": "a", "age": 1, "email": None})[:-1] + b"\x08",
     r"union branch index is out of range"),
])
def test_avro_invalid_payload_is_refused(payload, match):
    rejects(validator_for(parse("avro", AVRO_USER)), payload, match)


def test_avro_check_many_finds_the_first_invalid_even_when_a_datum_is_short():
    v = validator_for(parse("avro", AVRO_USER))
    other = avro({"name": "bob", "age": 1, "email": "b@x"})
    assert v.check_many([GOOD_AVRO, other, GOOD_AVRO]) is None
    assert v.check_many([GOOD_AVRO, GOOD_AVRO[:-1], GOOD_AVRO]) == 1
    assert v.check_many([GOOD_AVRO, GOOD_AVRO + b"\x00", GOOD_AVRO]) == 1
    assert v.check_many([GOOD_AVRO, GOOD_AVRO[:-1]]) == 1
    assert v.check_many([b"", GOOD_AVRO]) == 0


def test_avro_primitive_schema():
    v = validator_for(parse("avro", '"long"'))
    v.check(b"\x02")
    rejects(v, b"\x02\x02", "schema long: 1 bytes left")


def test_protobuf_payload_parses_as_the_first_message():
    v = validator_for(parse("protobuf", PROTO_USER))
    v.check(b"\x0a\x05alice\x10\x1e")
    v.check(b"\x18\x01")  # an unknown field, which every protobuf parser keeps
    rejects(v, b"\x0a\x09alice", "payload is not a valid protobuf User")
    rejects(v, b"\x0a\x02\xff\xfe", "payload is not a valid protobuf User")
    assert v.check_many([b"", b"\x0a\x09alice"]) == 1


def test_validators_are_cached_by_fingerprint():
    first = validator_for(parse("json", JSON_USER))
    again = validator_for(parse("json", json.dumps(json.loads(JSON_USER), indent=2)))
    assert again is first
    assert validator_for(parse("json", '{"type": "string"}')) is not first


@pytest.mark.parametrize("kind, schema, good, bad", [
    ("string", "", b"ok", b"\xff"),
    ("number", "", b"1234", b"12"),
    ("json_schema", JSON_USER, b'{"name": "a"}', b'{"name": 1}'),
    ("avro", AVRO_USER, GOOD_AVRO, GOOD_AVRO[:-1]),
    ("protobuf", PROTO_USER, b"\x10\x01", b"\x0a\x09a"),
])
def test_payloads_may_be_memoryviews_or_bytearrays(kind, schema, good, bad):
    v = validator_for(parse(kind, schema))
    v.check(memoryview(good))
    v.check(bytearray(good))
    with pytest.raises(PayloadInvalid):
        v.check(memoryview(bad))
    assert v.check_many([memoryview(good), memoryview(bad)]) == 1
    assert v.check_many([bytearray(good), memoryview(good)]) is None


def test_the_shared_lru_is_bounded_and_keeps_the_recently_used():
    from danube.schema._lru import LRU
    cache = LRU(3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"          # a is now the most recent
    cache.put("d", "D")
    assert len(cache) == 3 and cache.get("b") is None and cache.get("a") == "A"
