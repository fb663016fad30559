"""What a sink needs of the schema registry: a subject's latest schema, as the columns of a
table (JSON Schema ``properties`` or an Avro record's ``fields``)."""

import json

from danube.client import errors as client_errors
from danube.connect.errors import ConfigError, Unavailable
from danube.proto import SchemaRegistry_pb2 as sr
from danube.rpc import RpcError

_JSON_TYPES = {"string": "Utf8", "integer": "Int64", "number": "Float64",
               "boolean": "Boolean"}
_AVRO_TYPES = {"string": "Utf8", "int": "Int32", "long": "Int64", "float": "Float32",
               "double": "Float64", "boolean": "Boolean", "bytes": "Binary"}


async def latest_schema(client, subject):
    """(schema_type, definition bytes, version) of ``subject``'s latest version."""
    stub = client.pool.stub(client.service_url)
    try:
        response = await stub.get_latest_schema(sr.GetLatestSchemaRequest(subject=subject),
                                                timeout=client.rpc_timeout)
    except RpcError as exc:
        error = client_errors.from_rpc(exc, f"schema subject {subject!r}")
        if isinstance(error, client_errors.NotFound):
            raise ConfigError(f"expected_schema_subject: no subject {subject!r} in the "
                              f"registry") from None
        raise Unavailable(str(error)) from None
    return response.schema_type, response.schema_definition, response.version


def schema_document(subject, definition):
    """The schema itself, parsed, from a definition as the registry returns it."""
    try:
        doc = json.loads(definition)
    except ValueError as exc:
        raise ConfigError(f"schema {subject!r} is not JSON: {exc}") from None
    if isinstance(doc, dict) and len(doc) == 1:
        # The registry's wire form (upstream's serde JSON of SchemaDefinition):
        # {"JsonSchema": {"raw_schema": "<the schema's text>", "fingerprint": ...}}.
        (body,) = doc.values()
        if isinstance(body, dict) and isinstance(body.get("raw_schema"), str):
            try:
                doc = json.loads(body["raw_schema"])
            except ValueError as exc:
                raise ConfigError(f"schema {subject!r} is not JSON: {exc}") from None
    return doc


def is_avro(schema_type):
    return schema_type.lower() == "avro"


def columns_of(subject, schema_type, definition):
    """[(column, data_type, nullable)] of a JSON Schema object or an Avro record; a property
    of another type (object, array, union of several types) becomes a Utf8 column holding
    its JSON."""
    doc = schema_document(subject, definition)
    kind = schema_type.lower().replace("-", "_")
    if kind in ("json_schema", "jsonschema", "json"):
        props = doc.get("properties")
        if doc.get("type") != "object" or not isinstance(props, dict) or not props:
            raise ConfigError(f"schema {subject!r}: a table needs a JSON Schema of type "
                              f"object with properties")
        required = set(doc.get("required", ()))
        out = []
        for name, spec in props.items():
            t = spec.get("type") if isinstance(spec, dict) else None
            nullable = name not in required
            if isinstance(t, list):
                nullable = nullable or "null" in t
                rest = [x for x in t if x != "null"]
                t = rest[0] if len(rest) == 1 else None
            out.append((name, _JSON_TYPES.get(t, "Json"), nullable))
        return out
    if kind == "avro":
        if doc.get("type") != "record" or not isinstance(doc.get("fields"), list):
            raise ConfigError(f"schema {subject!r}: a table needs an Avro record")
        out = []
        for field in doc["fields"]:
            t, nullable = field.get("type"), False
            if isinstance(t, list):
                nullable = "null" in t
                rest = [x for x in t if x != "null"]
                t = rest[0] if len(rest) == 1 else None
            if isinstance(t, dict):
                t = t.get("type")
            out.append((field["name"], _AVRO_TYPES.get(t, "Json") if isinstance(t, str)
                        else "Json", nullable))
        return out
    raise ConfigError(f"schema {subject!r} is {schema_type}: a table's columns come from a "
                      f"JSON Schema or an Avro record")
