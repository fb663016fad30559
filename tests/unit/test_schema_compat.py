"""danube.schema.compat.check: every rule of docs/schema-compatibility.md, each with a
compatible and an incompatible evolution per mode, under the ids the table names."""

import json
import pathlib
import re

import pytest

from danube.schema import SchemaError, parse
from danube.schema.compat import check

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "schema-compatibility.md"


def rec(*fields, name="User", **extra):
    return json.dumps({"type": "record", "name": name, "fields": list(fields), **extra})


def f(name, type_, **extra):
    return {"name": name, "type": type_, **extra}


NAME = f("name", "string")
ADDRESS = {"type": "record", "name": "Address", "fields": [f("zip", "string")]}
COLOR = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
COLOR3 = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
LIST = {"type": "record", "name": "Node",
        "fields": [f("value", "int"), f("next", ["null", "Node"], default=None)]}

#: id -> (mode, old, new, None if compatible else a fragment of the expected problem)
AVRO = {
    "add-field-with-default-backward": (
        "backward",
        rec(NAME),
        rec(NAME, f("age", "int", default=0)),
        None),
    "add-field-with-default-forward": (
        "forward",
        rec(NAME),
        rec(NAME, f("age", "int", default=0)),
        None),
    "add-field-with-default-full": (
        "full",
        rec(NAME),
        rec(NAME, f("age", ["null", "int"], default=None)),
        None),
    "add-field-without-default-backward": (
        "backward",
        rec(NAME),
        rec(NAME, f("age", "int")),
        "field 'age': the new schema has no default"),
    "add-field-without-default-forward": ("forward", rec(NAME), rec(NAME, f("age", "int")), None),
    "add-field-without-default-full": (
        "full",
        rec(NAME),
        rec(NAME, f("age", "int")),
        "backward: field 'age'"),
    "remove-field-with-default-forward": (
        "forward",
        rec(NAME, f("age", "int", default=0)),
        rec(NAME),
        None),
    "remove-field-without-default-backward": (
        "backward",
        rec(NAME, f("age", "int")),
        rec(NAME),
        None),
    "remove-field-without-default-forward": (
        "forward",
        rec(NAME, f("age", "int")),
        rec(NAME),
        "field 'age': the old schema has no default"),
    "remove-field-without-default-full": (
        "full",
        rec(NAME, f("age", "int")),
        rec(NAME),
        "forward: field 'age'"),
    "promote-int-to-long-backward": ("backward", rec(f("n", "int")), rec(f("n", "long")), None),
    "promote-int-to-long-forward": (
        "forward",
        rec(f("n", "int")),
        rec(f("n", "long")),
        "field 'n': the old schema's int cannot read the new schema's long"),
    "promote-float-to-double-backward": (
        "backward",
        rec(f("n", "float")),
        rec(f("n", "double")),
        None),
    "demote-long-to-int-backward": (
        "backward",
        rec(f("n", "long")),
        rec(f("n", "int")),
        "int cannot read the old schema's long"),
    "demote-long-to-int-forward": ("forward", rec(f("n", "long")), rec(f("n", "int")), None),
    "string-bytes-full": ("full", rec(f("s", "string")), rec(f("s", "bytes")), None),
    "change-type-backward": (
        "backward",
        rec(f("n", "int")),
        rec(f("n", "string")),
        "string cannot read the old schema's int"),
    "change-type-full": ("full", rec(f("n", "boolean")), rec(f("n", "int")), "cannot read"),
    "enum-add-symbol-backward": ("backward", rec(f("c", COLOR)), rec(f("c", COLOR3)), None),
    "enum-add-symbol-forward": (
        "forward",
        rec(f("c", COLOR)),
        rec(f("c", COLOR3)),
        "symbols BLUE are unknown to the old schema"),
    "enum-add-symbol-forward-reader-default": (
        "forward",
        rec(f("c", {**COLOR, "default": "RED"})),
        rec(f("c", {**COLOR3, "default": "RED"})),
        None),
    "enum-remove-symbol-backward": (
        "backward",
        rec(f("c", COLOR3)),
        rec(f("c", COLOR)),
        "symbols BLUE are unknown to the new schema"),
    "enum-remove-symbol-backward-reader-default": (
        "backward",
        rec(f("c", COLOR3)),
        rec(f("c", {**COLOR, "default": "RED"})),
        None),
    "union-add-branch-backward": (
        "backward",
        rec(f("u", ["null", "int"])),
        rec(f("u", ["null", "int", "string"])),
        None),
    "union-add-branch-forward": (
        "forward",
        rec(f("u", ["null", "int"])),
        rec(f("u", ["null", "int", "string"])),
        "writes string as a branch of its union"),
    "type-to-union-backward": ("backward", rec(f("u", "int")), rec(f("u", ["null", "int"])), None),
    "type-to-union-forward": (
        "forward",
        rec(f("u", "int")),
        rec(f("u", ["null", "int"])),
        "the old schema's int cannot read the new schema's null"),
    "union-branch-promotion-backward": (
        "backward",
        rec(f("u", ["null", "int"])),
        rec(f("u", ["null", "long"])),
        None),
    "record-renamed-backward": ("backward", rec(NAME), rec(NAME, name="Person"), "names differ"),
    "record-renamed-with-alias-backward": (
        "backward",
        rec(NAME),
        rec(NAME, name="Person", aliases=["User"]),
        None),
    "field-renamed-backward": (
        "backward",
        rec(NAME),
        rec(f("full_name", "string")),
        "field 'full_name': the new schema has no default"),
    "field-renamed-with-alias-backward": (
        "backward",
        rec(NAME),
        rec(f("full_name", "string", aliases=["name"])),
        None),
    "fixed-size-changed-full": (
        "full",
        rec(f("h", {"type": "fixed", "name": "H", "size": 16})),
        rec(f("h", {"type": "fixed", "name": "H", "size": 32})),
        "size 16 in the old schema, 32 in the new"),
    "fixed-same-size-full": (
        "full",
        rec(f("h", {"type": "fixed", "name": "H", "size": 16})),
        rec(f("h", {"type": "fixed", "name": "H", "size": 16, "doc": "hash"})),
        None),
    "array-items-promoted-backward": (
        "backward",
        rec(f("a", {"type": "array", "items": "int"})),
        rec(f("a", {"type": "array", "items": "long"})),
        None),
    "array-items-promoted-forward": (
        "forward",
        rec(f("a", {"type": "array", "items": "int"})),
        rec(f("a", {"type": "array", "items": "long"})),
        "field 'a[]'"),
    "map-values-changed-backward": (
        "backward",
        rec(f("m", {"type": "map", "values": "string"})),
        rec(f("m", {"type": "map", "values": "int"})),
        "field 'm{}'"),
    "nested-record-field-backward": (
        "backward",
        rec(f("address", ADDRESS)),
        rec(f("address", {**ADDRESS, "fields": [f("zip", "string"), f("city", "string")]})),
        "field 'address.city': the new schema has no default"),
    "nested-record-field-with-default-full": (
        "full",
        rec(f("address", ADDRESS)),
        rec(f("address", {**ADDRESS, "fields": [f("zip", "string"),
                                                f("city", "string", default="")]})),
        None),
    "named-reference-full": (
        "full",
        rec(f("home", ADDRESS), f("work", "Address")),
        rec(f("home", ADDRESS), f("work", "Address"), f("note", "string", default="")),
        None),
    "named-reference-changed-backward": (
        "backward",
        rec(f("home", ADDRESS), f("work", "Address")),
        rec(f("home", {**ADDRESS, "fields": [f("zip", "int")]}), f("work", "Address")),
        "field 'home.zip'"),
    "recursive-record-full": (
        "full",
        json.dumps(LIST),
        json.dumps({**LIST, "fields": LIST["fields"] + [f("tag", "string", default="")]}),
        None),
    "recursive-record-backward": (
        "backward",
        json.dumps(LIST),
        json.dumps({**LIST, "fields": LIST["fields"] + [f("tag", "string")]}),
        "field 'tag'"),
    "none-mode-anything": ("none", rec(f("n", "int")), rec(f("n", "string")), None),
}

P3 = 'syntax = "proto3";\n'
USER = P3 + "message User { string name = 1; int32 age = 2; }"
PROTO = {
    "add-field-full": (
        "full",
        USER,
        P3 + "message User { string name = 1; int32 age = 2; string email = 3; }",
        None),
    "remove-field-full": ("full", USER, P3 + "message User { string name = 1; }", None),
    "remove-field-reserved-full": (
        "full",
        USER,
        P3 + "message User { string name = 1; reserved 2; reserved \"age\"; }",
        None),
    "rename-field-full": (
        "full",
        USER,
        P3 + "message User { string full_name = 1; int32 years = 2; }",
        None),
    "rename-message-full": (
        "full",
        USER,
        P3 + "message Person { string name = 1; int32 age = 2; }",
        None),
    "change-number-full": (
        "full",
        USER,
        P3 + "message User { string name = 1; int32 age = 7; }",
        None),
    "reuse-number-other-type-backward": (
        "backward",
        USER,
        P3 + "message User { string name = 1; string age = 2; }",
        "User.age (field 2): type changed: the old schema writes int32, the new schema "
        "reads string"),
    "reuse-number-other-type-forward": (
        "forward",
        USER,
        P3 + "message User { string name = 1; string nick = 2; }",
        "User.age (field 2): type changed: the new schema writes string, the old schema "
        "reads int32"),
    "varint-family-full": (
        "full",
        USER,
        P3 + "message User { string name = 1; int64 age = 2; }",
        None),
    "varint-to-zigzag-full": (
        "full",
        USER,
        P3 + "message User { string name = 1; sint32 age = 2; }",
        "different encodings"),
    "varint-to-fixed-backward": (
        "backward",
        USER,
        P3 + "message User { string name = 1; fixed32 age = 2; }",
        "different encodings"),
    "string-to-bytes-backward": (
        "backward",
        USER,
        P3 + "message User { bytes name = 1; int32 age = 2; }",
        None),
    "string-to-bytes-forward": (
        "forward",
        USER,
        P3 + "message User { bytes name = 1; int32 age = 2; }",
        "the new schema writes bytes, the old schema reads string"),
    "message-to-bytes-backward": (
        "backward",
        P3 + "message User { Addr a = 1; }\nmessage Addr { string zip = 1; }",
        P3 + "message User { bytes a = 1; }",
        None),
    "message-to-bytes-forward": (
        "forward",
        P3 + "message User { Addr a = 1; }\nmessage Addr { string zip = 1; }",
        P3 + "message User { bytes a = 1; }",
        "writes bytes, the old schema reads Addr"),
    "singular-to-repeated-string-full": (
        "full",
        USER,
        P3 + "message User { repeated string name = 1; int32 age = 2; }",
        None),
    "singular-to-repeated-number-backward": (
        "backward",
        USER,
        P3 + "message User { string name = 1; repeated int32 age = 2; }",
        None),
    "singular-to-repeated-number-forward": (
        "forward",
        USER,
        P3 + "message User { string name = 1; repeated int32 age = 2; }",
        "writes repeated int32, which a singular field of the old schema cannot parse"),
    "reserved-number-reused-backward": (
        "backward",
        P3 + "message User { string name = 1; reserved 2; }",
        P3 + "message User { string name = 1; int64 id = 2; }",
        "the new schema uses number 2, which the old schema reserves"),
    "reserved-number-reused-forward": (
        "forward",
        P3 + "message User { string name = 1; reserved 2 to 5; }",
        P3 + "message User { string name = 1; int64 id = 4; }",
        "number 4"),
    "nested-message-field-full": (
        "full",
        P3 + "message User { Addr a = 1; }\nmessage Addr { string zip = 1; }",
        P3 + "message User { Addr a = 1; }\nmessage Addr { string zip = 1; string city = 2; }",
        None),
    "nested-message-field-changed-backward": (
        "backward",
        P3 + "message User { Addr a = 1; }\nmessage Addr { string zip = 1; }",
        P3 + "message User { Addr a = 1; }\nmessage Addr { int32 zip = 1; }",
        "User.a.zip (field 1): type changed"),
    "other-top-level-message-changed-full": (
        "full",
        USER + "\nmessage Audit { string who = 1; }",
        USER + "\nmessage Audit { double who = 1; }",
        "Audit.who (field 1)"),
    "proto2-required-added-backward": (
        "backward",
        'syntax = "proto2";\nmessage U { optional string n = 1; }',
        'syntax = "proto2";\nmessage U { optional string n = 1; required int32 id = 2; }',
        "U.id (field 2): required in the new schema, absent from the old"),
    "proto2-required-added-forward": (
        "forward",
        'syntax = "proto2";\nmessage U { optional string n = 1; }',
        'syntax = "proto2";\nmessage U { optional string n = 1; required int32 id = 2; }',
        None),
    "none-mode-anything": ("none", USER, P3 + "message User { bytes name = 2; }", None),
}


def obj(props, required=(), **extra):
    return json.dumps({"type": "object", "properties": props, "required": list(required),
                       **extra})


def refs(defs, ref):
    return json.dumps({"$defs": defs, "type": "object", "properties": {"home": {"$ref": ref}}})


S, I, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}
BASE = obj({"name": S}, ["name"])
WITH_AGE = obj({"name": S, "age": I}, ["name"])
ADDR = {"type": "object", "properties": {"zip": S}, "required": ["zip"]}
JSON = {
    "add-optional-backward": ("backward", BASE, WITH_AGE, None),
    "add-optional-forward": ("forward", BASE, WITH_AGE, None),
    "add-optional-full": ("full", BASE, WITH_AGE, None),
    "add-required-backward": (
        "backward",
        BASE,
        obj({"name": S, "email": S}, ["name", "email"]),
        "field 'email': added required field 'email' without a default"),
    "add-required-forward": (
        "forward",
        BASE,
        obj({"name": S, "email": S}, ["name", "email"]),
        "field 'email': added new required field 'email'"),
    "add-required-full": (
        "full",
        BASE,
        obj({"name": S, "email": S}, ["name", "email"]),
        "added required field 'email'"),
    "add-required-with-default-backward": (
        "backward",
        BASE,
        obj({"name": S, "email": {**S, "default": ""}}, ["name", "email"]),
        None),
    "add-required-with-default-forward": (
        "forward",
        BASE,
        obj({"name": S, "email": {**S, "default": ""}}, ["name", "email"]),
        "added new required field 'email'"),
    "remove-optional-backward": ("backward", WITH_AGE, BASE, None),
    "remove-optional-forward": ("forward", WITH_AGE, BASE, None),
    "remove-optional-full": ("full", WITH_AGE, BASE, None),
    "remove-optional-new-closed-backward": (
        "backward",
        WITH_AGE,
        obj({"name": S}, ["name"], additionalProperties=False),
        "the old schema allows property 'age', which the new schema forbids"),
    "add-optional-old-closed-forward": (
        "forward",
        obj({"name": S}, ["name"], additionalProperties=False),
        obj({"name": S, "age": I}, ["name"], additionalProperties=False),
        "the new schema allows property 'age', which the old schema forbids"),
    "add-optional-both-closed-backward": (
        "backward",
        obj({"name": S}, ["name"], additionalProperties=False),
        obj({"name": S, "age": I}, ["name"], additionalProperties=False),
        None),
    "remove-required-backward": (
        "backward",
        obj({"name": S, "age": I}, ["name", "age"]),
        BASE,
        "field 'age': removed required field 'age'"),
    "remove-required-forward": (
        "forward",
        obj({"name": S, "age": I}, ["name", "age"]),
        BASE,
        "field 'age': removed required field 'age'"),
    "remove-required-full": (
        "full",
        obj({"id": I, "name": S}, ["id", "name"]),
        obj({"id": I}, ["id"]),
        "removed required field 'name'"),
    "optional-to-required-backward": (
        "backward",
        WITH_AGE,
        obj({"name": S, "age": I}, ["name", "age"]),
        "made optional field 'age' required"),
    "optional-to-required-forward": (
        "forward",
        WITH_AGE,
        obj({"name": S, "age": I}, ["name", "age"]),
        None),
    "required-to-optional-backward": (
        "backward",
        obj({"name": S, "age": I}, ["name", "age"]),
        WITH_AGE,
        None),
    "required-to-optional-forward": (
        "forward",
        obj({"name": S, "age": I}, ["name", "age"]),
        WITH_AGE,
        "made required field 'age' optional"),
    "widen-integer-to-number-backward": ("backward", obj({"n": I}), obj({"n": N}), None),
    "widen-integer-to-number-forward": (
        "forward",
        obj({"n": I}),
        obj({"n": N}),
        "the new schema allows number, the old schema only integer"),
    "narrow-number-to-integer-backward": (
        "backward",
        obj({"n": N}),
        obj({"n": I}),
        "changed type of field 'n': the old schema allows number, the new schema only integer"),
    "narrow-number-to-integer-forward": ("forward", obj({"n": N}), obj({"n": I}), None),
    "change-type-backward": (
        "backward",
        obj({"id": S}, ["id"]),
        obj({"id": I}, ["id"]),
        "changed type of field 'id'"),
    "change-type-full": (
        "full",
        obj({"id": S}, ["id"]),
        obj({"id": I}, ["id"]),
        "forward: field 'id'"),
    "add-type-to-union-backward": (
        "backward",
        obj({"id": S}),
        obj({"id": {"type": ["string", "null"]}}),
        None),
    "add-type-to-union-forward": (
        "forward",
        obj({"id": S}),
        obj({"id": {"type": ["string", "null"]}}),
        "allows null"),
    "enum-value-added-backward": (
        "backward",
        obj({"c": {"enum": ["a", "b"]}}),
        obj({"c": {"enum": ["a", "b", "c"]}}),
        None),
    "enum-value-added-forward": (
        "forward",
        obj({"c": {"enum": ["a", "b"]}}),
        obj({"c": {"enum": ["a", "b", "c"]}}),
        'enum values "c" of the new schema'),
    "enum-value-removed-backward": (
        "backward",
        obj({"c": {"enum": ["a", "b"]}}),
        obj({"c": {"enum": ["a"]}}),
        'enum values "b" of the old schema'),
    "enum-value-removed-forward": (
        "forward",
        obj({"c": {"enum": ["a", "b"]}}),
        obj({"c": {"enum": ["a"]}}),
        None),
    "nested-object-required-backward": (
        "backward",
        obj({"address": ADDR}),
        obj({"address": {**ADDR, "properties": {"zip": S, "city": S},
                         "required": ["zip", "city"]}}),
        "field 'address.city': added required field 'city'"),
    "nested-object-optional-full": (
        "full",
        obj({"address": ADDR}),
        obj({"address": {**ADDR, "properties": {"zip": S, "city": S}}}),
        None),
    "array-items-changed-backward": (
        "backward",
        obj({"tags": {"type": "array", "items": S}}),
        obj({"tags": {"type": "array", "items": I}}),
        "field 'tags[]': changed type"),
    "array-items-widened-backward": (
        "backward",
        obj({"tags": {"type": "array", "items": I}}),
        obj({"tags": {"type": "array", "items": N}}),
        None),
    "tighten-max-length-backward": (
        "backward",
        obj({"s": {**S, "maxLength": 10}}),
        obj({"s": {**S, "maxLength": 5}}),
        "maxLength 5 is stricter than the old schema's 10"),
    "loosen-max-length-backward": (
        "backward",
        obj({"s": {**S, "maxLength": 5}}),
        obj({"s": {**S, "maxLength": 10}}),
        None),
    "add-minimum-backward": (
        "backward",
        obj({"n": I}),
        obj({"n": {**I, "minimum": 0}}),
        "minimum 0 is stricter than the old schema's (none)"),
    "add-minimum-forward": ("forward", obj({"n": I}), obj({"n": {**I, "minimum": 0}}), None),
    "close-content-backward": (
        "backward",
        BASE,
        obj({"name": S}, ["name"], additionalProperties=False),
        "the new schema forbids additional properties"),
    "open-content-backward": (
        "backward",
        obj({"name": S}, ["name"], additionalProperties=False),
        BASE,
        None),
    "anyof-branch-added-backward": (
        "backward",
        obj({"v": {"anyOf": [S, I]}}),
        obj({"v": {"anyOf": [S, I, {"type": "boolean"}]}}),
        None),
    "anyof-branch-added-forward": (
        "forward",
        obj({"v": {"anyOf": [S, I]}}),
        obj({"v": {"anyOf": [S, I, {"type": "boolean"}]}}),
        "no alternative of the old schema's anyOf/oneOf"),
    "ref-followed-backward": (
        "backward",
        refs({"a": ADDR}, "#/$defs/a"),
        refs({"a": {**ADDR, "properties": {"zip": I}}}, "#/$defs/a"),
        "field 'home.zip': changed type"),
    "ref-followed-full": (
        "full",
        refs({"a": ADDR}, "#/$defs/a"),
        refs({"b": ADDR}, "#/$defs/b"),
        None),
    "allof-changed-full": (
        "full",
        obj({"v": {"allOf": [S]}}),
        obj({"v": {"allOf": [S, {"minLength": 1}]}}),
        "'allOf' changed"),
    "none-mode-anything": ("none", obj({"name": S}, ["name"]), obj({"age": I}, ["age"]), None),
}

FORMATS = {"avro": AVRO, "protobuf": PROTO, "json_schema": JSON}


def _verdict(kind, case):
    mode, old, new, expected = case
    problems = check(parse(kind, old), parse(kind, new), mode)
    if expected is None:
        assert problems == []
    else:
        assert problems, "expected incompatible"
        assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("case", AVRO, ids=str)
def test_avro_rule(case):
    _verdict("avro", AVRO[case])


@pytest.mark.parametrize("case", JSON, ids=str)
def test_json_schema_rule(case):
    _verdict("json_schema", JSON[case])


@pytest.mark.parametrize("case", PROTO, ids=str)
def test_protobuf_rule(case):
    _verdict("protobuf", PROTO[case])


def test_every_rule_case_is_in_the_docs_table_and_back():
    rows = re.findall(r"^\| *(avro|json_schema|protobuf) *\|.*\| *`([a-z0-9-]+)` *\|$",
                      DOC.read_text(), re.M)
    documented = {(fmt, case) for fmt, case in rows}
    tested = {(fmt, case) for fmt, cases in FORMATS.items() for case in cases}
    assert documented - tested == set(), "documented but not tested"
    assert tested - documented == set(), "tested but not documented"


def test_each_mode_has_a_compatible_and_an_incompatible_case_per_format():
    for fmt, cases in FORMATS.items():
        for mode in ("backward", "forward", "full"):
            verdicts = {c[3] is None for c in cases.values() if c[0] == mode}
            assert verdicts == {True, False}, (fmt, mode)


@pytest.mark.parametrize("mode", ["backward", "forward", "full"])
def test_different_types_are_incompatible(mode):
    problems = check(parse("avro", '"string"'), parse("json", '{"type": "string"}'), mode)
    assert problems == ["schema types must match: cannot change from avro to json_schema"]


def test_different_types_pass_under_none_as_upstream():
    assert check(parse("string", b""), parse("number", b""), "none") == []


@pytest.mark.parametrize("kind", ["bytes", "string", "number"])
@pytest.mark.parametrize("mode", ["none", "backward", "forward", "full"])
def test_simple_types_are_compatible_with_themselves(kind, mode):
    assert check(parse(kind, b""), parse(kind, b""), mode) == []


@pytest.mark.parametrize("mode", ["BACKWARD", "transitive", ""])
def test_unknown_mode_is_refused(mode):
    with pytest.raises(SchemaError, match="unknown compatibility mode"):
        check(parse("string", b""), parse("string", b""), mode)


def test_identical_schemas_are_compatible_in_every_mode():
    for kind, text in (("avro", rec(NAME)), ("json_schema", BASE), ("protobuf", USER)):
        for mode in ("backward", "forward", "full"):
            assert check(parse(kind, text), parse(kind, text), mode) == []


def test_checking_against_a_hundred_versions_reuses_parsed_forms(monkeypatch):
    # The registry checks a new version against every existing one: a 20-field record
    # against 100 versions, each adding an optional field. No schema is parsed again.
    from danube.schema import formats
    fields = [f(f"f{i}", "string") for i in range(20)]
    versions = [parse("avro", rec(*fields, *[f(f"x{j}", "int", default=0) for j in range(v)]))
                for v in range(100)]
    new = parse("avro", rec(*fields, *[f(f"x{j}", "int", default=0) for j in range(101)]))
    loads = []
    real = formats._avro.load
    monkeypatch.setattr(formats._avro, "load", lambda text: loads.append(text) or real(text))
    assert all(check(old, new, "full") == [] for old in versions)
    assert loads == []


def test_stored_definitions_are_checked_like_fresh_ones():
    from danube.schema import from_definition_json
    old = from_definition_json(parse("json_schema", BASE).definition_json)
    new = parse("json_schema", obj({"name": S, "email": S}, ["name", "email"]))
    assert check(old, new, "backward") == [
        "backward: field 'email': added required field 'email' without a default: the new "
        "schema requires it, with no default, and data written with the old schema may lack it"]


def test_json_schema_recursion_and_boolean_branches_terminate():
    tree = json.dumps({"type": "object", "properties": {
        "value": I, "children": {"type": "array", "items": {"$ref": "#"}},
        "next": {"anyOf": [{"type": "null"}, {"$ref": "#"}, True]}}})
    assert check(parse("json", tree), parse("json", tree.replace('"integer"', '"number"')),
                 "backward") == []
    deep = S
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(SchemaError, match="nests too deeply"):
        parse("json", json.dumps(deep))
    from danube.schema.compat import json_schema
    problems = json_schema.can_read(deep, json.loads(json.dumps(deep)))
    assert problems == ["field '" + ".".join(["a"] * 151) + "': schemas nest too deeply to "
                        "compare"]
