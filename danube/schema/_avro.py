"""Avro schema text to fastavro's parsed form, and its fingerprint (see formats)."""

import dataclasses
import hashlib
import json

from danube.schema.errors import SchemaError

#: Attributes the Parsing Canonical Form drops that resolution or decoding depend on.
_KEPT = ("default", "aliases", "logicalType", "precision", "scale")


@dataclasses.dataclass(frozen=True, eq=False)
class AvroSchema:
    #: fastavro's parsed schema: named types by full name, references as full-name strings.
    parsed: object
    #: every named type (record, enum, fixed) by full name.
    names: dict

    @property
    def name(self):
        p = self.parsed
        if isinstance(p, dict):
            return p.get("name") or p.get("type")
        return "union" if isinstance(p, list) else str(p)


def load(text):
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"avro schema is not JSON: {exc}") from None
    except RecursionError:
        raise SchemaError("avro schema nests too deeply") from None
    _check_records(value)
    import fastavro     # on first use: it costs a broker or CLI start ~0.1 s otherwise
    names = {}
    try:
        parsed = fastavro.parse_schema(value, named_schemas=names, _write_hint=False)
    except fastavro.schema.UnknownType as exc:
        raise SchemaError(f"avro schema does not parse: unknown type {exc.name!r}") from None
    except Exception as exc:  # fastavro raises several types (KeyError, ValueError, ...)
        raise SchemaError(f"avro schema does not parse: {type(exc).__name__}: {exc}") \
            from None
    return AvroSchema(parsed, names)


def fingerprint(schema):
    from fastavro.schema import to_parsing_canonical_form
    pcf = to_parsing_canonical_form(schema.parsed)
    extras = []
    _extras(schema.parsed, "", extras)
    text = pcf if not extras else pcf + "\n" + json.dumps(extras, separators=(",", ":"),
                                                             sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _extras(node, path, out):
    if isinstance(node, list):
        for i, branch in enumerate(node):
            _extras(branch, f"{path}[{i}]", out)
        return
    if not isinstance(node, dict):
        return
    here = f"{path}/{node.get('name', node.get('type'))}"
    kept = {k: node[k] for k in _KEPT if k in node}
    if kept:
        out.append([here, kept])
    for field in node.get("fields", ()):
        fkept = {k: field[k] for k in _KEPT if k in field}
        if fkept:
            out.append([f"{here}.{field['name']}", fkept])
        _extras(field["type"], f"{here}.{field['name']}", out)
    for key in ("items", "values"):
        if key in node:
            _extras(node[key], f"{here}.{key}", out)
    if isinstance(node.get("type"), (dict, list)):
        _extras(node["type"], here, out)


def _check_records(value):
    # fastavro accepts a record without "fields", which the specification requires.
    if isinstance(value, list):
        for v in value:
            _check_records(v)
    elif isinstance(value, dict):
        if value.get("type") in ("record", "error") and not isinstance(value.get("fields"),
                                                                      list):
            raise SchemaError(f"avro schema does not parse: record {value.get('name')!r} "
                              f"has no \"fields\" list")
        for field in value.get("fields", ()) if isinstance(value.get("fields"), list) else ():
            if isinstance(field, dict):
                _check_records(field.get("type"))
        for key in ("items", "values", "type"):
            if isinstance(value.get(key), (dict, list)):
                _check_records(value[key])
