"""danube.schema.formats: types and aliases, parsing of each format (malformed text refused
with the parser's message), fingerprints and upstream's stored JSON form."""

import json

import pytest

from danube.schema import Definition, SchemaError, from_definition_json, normalize_type, parse
from danube.schema.formats import loaded

AVRO_USER = '{"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}'
JSON_USER = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
PROTO_USER = 'syntax = "proto3";\nmessage User {\n  string name = 1;\n  int32 age = 2;\n}\n'


@pytest.mark.parametrize("text, expected", [
    ("bytes", "bytes"), ("STRING", "string"), ("number", "number"), ("int64", "number"),
    ("Int", "number"), ("float", "number"), ("DOUBLE", "number"), ("avro", "avro"),
    ("Avro", "avro"), ("json_schema", "json_schema"), ("JSON", "json_schema"),
    ("protobuf", "protobuf"), ("Proto", "protobuf"),
])
def test_normalize_type_accepts_names_and_aliases_in_any_case(text, expected):
    assert normalize_type(text) == expected


def test_normalize_type_refuses_unknown_naming_it_and_the_accepted():
    with pytest.raises(SchemaError, match=r"'xml'.*bytes, string, number, avro, json_schema"):
        normalize_type("xml")


@pytest.mark.parametrize("kind, variant", [("bytes", "Bytes"), ("string", "String"),
                                           ("int64", "Number")])
def test_simple_types_fingerprint_is_the_type_name(kind, variant):
    d = parse(kind, b"whatever")
    assert d == Definition(normalize_type(kind), "", normalize_type(kind), f'"{variant}"')


def test_avro_definition_json_is_upstreams_serde_form():
    d = parse("avro", AVRO_USER.encode())
    assert d.schema_type == "avro" and d.raw == AVRO_USER
    assert d.fingerprint.startswith("sha256:") and len(d.fingerprint) == 7 + 64
    assert d.definition_json == json.dumps(
        {"Avro": {"raw_schema": AVRO_USER, "fingerprint": d.fingerprint}},
        separators=(",", ":"))


def test_json_schema_definition_json_is_upstreams_serde_form():
    d = parse("json", JSON_USER)
    assert d.definition_json.startswith('{"JsonSchema":{"raw_schema":')
    assert json.loads(d.definition_json) == {
        "JsonSchema": {"raw_schema": JSON_USER, "fingerprint": d.fingerprint}}


def test_protobuf_definition_json_has_raw_proto_message_name_fingerprint_in_order():
    d = parse("proto", PROTO_USER.encode())
    body = json.loads(d.definition_json)["Protobuf"]
    assert list(body) == ["raw_proto", "message_name", "fingerprint"]
    assert body == {"raw_proto": PROTO_USER, "message_name": "DefaultMessage",
                    "fingerprint": d.fingerprint}


def test_definition_json_keeps_non_ascii_as_utf8_like_serde():
    d = parse("json_schema", '{"title": "café", "type": "object"}')
    assert "café" in d.definition_json


@pytest.mark.parametrize("kind, text", [("bytes", ""), ("string", ""), ("number", ""),
                                        ("avro", AVRO_USER), ("json_schema", JSON_USER),
                                        ("protobuf", PROTO_USER)])
def test_from_definition_json_inverts_parse(kind, text):
    d = parse(kind, text)
    assert from_definition_json(d.definition_json) == d


@pytest.mark.parametrize("text", ["not json", "[]", '"Xml"', '{"Avro": {"raw_schema": 1}}',
                                  '{"Avro": {}, "JsonSchema": {}}'])
def test_from_definition_json_refuses_unknown_shapes(text):
    with pytest.raises(SchemaError):
        from_definition_json(text)


def test_avro_fingerprint_ignores_whitespace_doc_and_attribute_order():
    pretty = """{
        "name": "User", "type": "record", "doc": "a user",
        "fields": [ {"type": "string", "name": "name"} ]
    }"""
    assert parse("avro", pretty).fingerprint == parse("avro", AVRO_USER).fingerprint


def test_avro_fingerprint_changes_with_a_default_the_canonical_form_drops():
    with_default = AVRO_USER.replace('"type": "string"}', '"type": "string", "default": ""}')
    assert parse("avro", with_default).fingerprint != parse("avro", AVRO_USER).fingerprint


def test_avro_fingerprint_without_extras_is_sha256_of_parsing_canonical_form():
    import hashlib
    from fastavro.schema import to_parsing_canonical_form
    pcf = to_parsing_canonical_form(json.loads(AVRO_USER))
    assert parse("avro", AVRO_USER).fingerprint == \
        "sha256:" + hashlib.sha256(pcf.encode()).hexdigest()


def test_json_fingerprint_ignores_whitespace_and_key_order():
    other = '{"required":["name"],"properties":{"name":{"type":"string"}},"type":"object"}'
    assert parse("json", other).fingerprint == parse("json", JSON_USER).fingerprint
    assert parse("json", '{"type": "string"}').fingerprint != parse("json", JSON_USER).fingerprint


def test_protobuf_fingerprint_is_over_the_raw_text():
    assert parse("protobuf", PROTO_USER).fingerprint != \
        parse("protobuf", PROTO_USER + "// comment\n").fingerprint


def test_parse_keeps_the_parsed_form_for_later_checks():
    d = parse("protobuf", PROTO_USER)
    assert loaded(d).top == ".User"
    assert [f.name for f in loaded(d).messages[".User"].field] == ["name", "age"]


def test_loaded_parses_a_stored_definition_on_demand():
    d = from_definition_json(parse("avro", AVRO_USER).definition_json)
    assert loaded(d).name == "User"


@pytest.mark.parametrize("kind, text, message", [
    ("avro", "{not json", r"avro schema is not JSON: Expecting property name"),
    ("avro", '{"type": "invalid_type", "name": "User"}',
     r"avro schema does not parse: unknown type .*invalid_type"),
    ("avro", '{"type": "record", "name": "U", "fields": [{"name": "a", "type": "int", '
             '"default": "x"}]}', r"avro schema does not parse: .*Default value <x>"),
    ("avro", '{"type": "record", "name": "U"}', r"record 'U' has no \"fields\" list"),
    ("avro", '{"type": "enum", "name": "E", "symbols": ["A", "A"]}', r"unique"),
    ("json_schema", '{"type": "object", "properties": {', r"json_schema is not JSON: "),
    ("json_schema", "[1, 2]", r"must be a JSON object or boolean, not list"),
    ("json_schema", '{"type": "strnig"}', r"does not match its metaschema at type: 'strnig'"),
    ("json_schema", '{"properties": {"a": {"minimum": "zero"}}}',
     r"metaschema at properties/a/minimum: 'zero' is not of type 'number'"),
    ("protobuf", 'syntax = "proto3";\nmessage User { Foo name = 1; }',
     r'protobuf schema does not parse: line 2:\d+: "Foo" is not defined'),
    ("protobuf", 'syntax = "proto3";\nmessage { }', r"line 2:\d+: Expected message name"),
    ("protobuf", 'syntax = "proto3";\nmessage A { string a = 1; int32 b = 1; }',
     r'Field number 1 has already been used'),
    ("protobuf", 'syntax = "proto3";\nenum E { A = 0; }', r"defines no message"),
    ("avro", b"\xff\xfe", r"avro schema is not valid UTF-8"),
])
def test_malformed_schema_is_refused_naming_the_parse_error(kind, text, message):
    with pytest.raises(SchemaError, match=message):
        parse(kind, text)
