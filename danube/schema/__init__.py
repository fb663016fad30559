"""Schema registry formats: parsing, fingerprints, compatibility and payload validation.

Pure functions over schema text; this package imports nothing else from danube so the
registry, the publish path and the CLI can all use it."""

from danube.schema.errors import PayloadInvalid, SchemaError
from danube.schema.formats import (
    SCHEMA_TYPES, Definition, from_definition_json, normalize_type, parse)

__all__ = ["SCHEMA_TYPES", "Definition", "PayloadInvalid", "SchemaError",
           "from_definition_json", "normalize_type", "parse"]
