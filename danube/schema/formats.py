"""Schema types, parsing and fingerprints, and upstream's stored form of a definition.

Choices, against upstream's danube-schema (Rust):

- Types and aliases are upstream's `SchemaType::from_str`, case-insensitive.
- bytes, string and number carry no schema text: upstream ignores the data sent with them,
  so `raw` is "" and the fingerprint is the type's name.
- Avro: parsed with fastavro. The fingerprint is sha256 over the Avro Parsing Canonical Form,
  except that the PCF drops what schema resolution depends on (field and enum defaults,
  aliases, logical types); when a schema has any of those, their canonical JSON is hashed
  after the PCF, so that adding a default makes a new version instead of matching the old
  one. Upstream hashes its own re-serialisation, which also keeps them.
- JSON Schema: must be a JSON object or boolean and pass its metaschema (`jsonschema`,
  draft chosen by `$schema`, draft 7 when it names none: the draft payloads are validated
  by). The fingerprint is sha256 over the
  canonical dump (sorted keys, no whitespace), as upstream's serde_json dump of a Value.
- Protobuf: compiled by protoc (grpcio-tools, in process) so that a malformed or
  inconsistent file is refused with protoc's message; upstream stores the text unchecked.
  The fingerprint is sha256 over the raw text, as upstream (comments count). The message
  name is upstream's fixed "DefaultMessage"; the checks use the first message of the file.
"""

import dataclasses
import hashlib
import json

from danube.schema import _avro, _jsonschema, _protobuf
from danube.schema._lru import LRU
from danube.schema.errors import SchemaError

#: Normalised type names, in upstream's order.
SCHEMA_TYPES = ("bytes", "string", "number", "avro", "json_schema", "protobuf")
_ALIASES = {"int64": "number", "int": "number", "float": "number", "double": "number",
            "json": "json_schema", "proto": "protobuf"}
_SIMPLE = ("bytes", "string", "number")
#: serde's variant names of upstream's SchemaDefinition enum.
_VARIANT = {"bytes": "Bytes", "string": "String", "number": "Number", "avro": "Avro",
            "json_schema": "JsonSchema", "protobuf": "Protobuf"}
_TYPE_OF_VARIANT = {v: k for k, v in _VARIANT.items()}
PROTOBUF_MESSAGE_NAME = "DefaultMessage"


@dataclasses.dataclass(frozen=True)
class Definition:
    schema_type: str
    raw: str
    fingerprint: str
    #: upstream's serde JSON of SchemaDefinition, as GetSchemaResponse carries it.
    definition_json: str


def normalize_type(text):
    name = str(text).strip().lower()
    name = _ALIASES.get(name, name)
    if name not in SCHEMA_TYPES:
        accepted = ", ".join(SCHEMA_TYPES + tuple(_ALIASES))
        raise SchemaError(f"unknown schema type {text!r}: expected one of {accepted}")
    return name


def parse(schema_type, raw):
    """The Definition of schema text `raw` (bytes or str) of type `schema_type`."""
    kind = normalize_type(schema_type)
    if kind in _SIMPLE:
        return _simple(kind)
    text = _text(kind, raw)
    if kind == "avro":
        parsed = _avro.load(text)
        fingerprint = _avro.fingerprint(parsed)
    elif kind == "json_schema":
        parsed = _jsonschema.load(text)
        fingerprint = _sha256(_jsonschema.canonical(parsed))
    else:
        parsed = _protobuf.load(text)
        fingerprint = _sha256(text)
    defn = _make(kind, text, fingerprint)
    _remember(defn, parsed)
    return defn


def from_definition_json(text):
    """The Definition stored as upstream's serde JSON (`Definition.definition_json`)."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise SchemaError(f"stored schema definition is not JSON: {exc}") from None
    if isinstance(value, str) and _TYPE_OF_VARIANT.get(value) in _SIMPLE:
        return _simple(_TYPE_OF_VARIANT[value])
    if isinstance(value, dict) and len(value) == 1:
        (variant, body), = value.items()
        kind = _TYPE_OF_VARIANT.get(variant)
        key = "raw_proto" if kind == "protobuf" else "raw_schema"
        if kind not in _SIMPLE and isinstance(body, dict) and isinstance(body.get(key), str) \
                and isinstance(body.get("fingerprint"), str):
            return _make(kind, body[key], body["fingerprint"])
    raise SchemaError(f"stored schema definition has an unknown shape: {text[:200]!r}")


def loaded(defn):
    """The parsed form of `defn` (format-specific), parsed once per fingerprint."""
    hit = _parsed.get((defn.schema_type, defn.fingerprint))
    if hit is not None:
        return hit
    if defn.schema_type == "avro":
        parsed = _avro.load(defn.raw)
    elif defn.schema_type == "json_schema":
        parsed = _jsonschema.load(defn.raw, check=False)
    elif defn.schema_type == "protobuf":
        parsed = _protobuf.load(defn.raw)
    else:
        parsed = defn.schema_type
    _remember(defn, parsed)
    return parsed


# Bounded: a registry holds few schemas, but a long-lived broker must not grow without end.
_PARSED_MAX = 4096
_parsed = LRU(_PARSED_MAX)


def _remember(defn, parsed):
    _parsed.put((defn.schema_type, defn.fingerprint), parsed)


def _simple(kind):
    return Definition(kind, "", kind, json.dumps(_VARIANT[kind]))


def _make(kind, text, fingerprint):
    if kind == "protobuf":
        body = {"raw_proto": text, "message_name": PROTOBUF_MESSAGE_NAME,
                "fingerprint": fingerprint}
    else:
        body = {"raw_schema": text, "fingerprint": fingerprint}
    # ensure_ascii=False: serde_json writes non-ASCII text as UTF-8, escaping only controls.
    definition_json = json.dumps({_VARIANT[kind]: body}, separators=(",", ":"),
                                 ensure_ascii=False)
    return Definition(kind, text, fingerprint, definition_json)


def _text(kind, raw):
    if isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{kind} schema is not valid UTF-8: {exc}") from None


def _sha256(text):
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
