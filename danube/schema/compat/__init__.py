"""Compatibility of a new schema version with an old one.

BACKWARD: a reader using the new schema reads data written with the old one.
FORWARD: a reader using the old schema reads data written with the new one.
FULL: both. NONE: anything goes (even a change of type, as upstream).
Each format module answers one question, "can `reader` read what `writer` wrote?", as a
list of problems; this module picks the direction(s)."""

from danube.schema.errors import SchemaError
from danube.schema.formats import loaded

MODES = ("none", "backward", "forward", "full")
_SIMPLE = ("bytes", "string", "number")


def check(old, new, mode):
    """Problems that make `new` incompatible with `old` under `mode`; [] if compatible."""
    if mode not in MODES:
        raise SchemaError(f"unknown compatibility mode {mode!r}: expected one of "
                          f"{', '.join(MODES)}")
    if mode == "none":
        return []
    if old.schema_type != new.schema_type:
        return [f"schema types must match: cannot change from {old.schema_type} to "
                f"{new.schema_type}"]
    if old.schema_type in _SIMPLE or old.fingerprint == new.fingerprint:
        return []
    module = _module(old.schema_type)
    old_form, new_form = loaded(old), loaded(new)
    problems = []
    try:
        if mode in ("backward", "full"):
            problems += [f"backward: {p}"
                         for p in module.can_read(new_form, old_form, "backward")]
        if mode in ("forward", "full"):
            problems += [f"forward: {p}"
                         for p in module.can_read(old_form, new_form, "forward")]
    except RecursionError:  # the format modules recurse with the schema's nesting
        problems.append(f"{mode}: schemas nest too deeply to compare")
    return problems


def _module(schema_type):
    if schema_type == "avro":
        from danube.schema.compat import avro
        return avro
    if schema_type == "json_schema":
        from danube.schema.compat import json_schema
        return json_schema
    from danube.schema.compat import protobuf
    return protobuf
