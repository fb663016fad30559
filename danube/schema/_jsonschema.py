"""JSON Schema text to its parsed value, checked against its metaschema (see formats)."""

import json

from danube.schema.errors import SchemaError


def load(text, check=True):
    """The schema's value; `check` validates it against its metaschema (a stored schema
    passed that when it was registered)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"json_schema is not JSON: {exc}") from None
    except RecursionError:
        raise SchemaError("json_schema nests too deeply") from None
    if not isinstance(value, (dict, bool)):
        raise SchemaError(f"json_schema must be a JSON object or boolean, not "
                          f"{type(value).__name__}")
    if not check:
        return value
    # Imported here: jsonschema takes ~250 ms to import, paid by the first JSON schema
    # registered, not by every broker start and CLI run.
    import jsonschema
    import jsonschema.exceptions
    import jsonschema.validators
    try:
        # Draft 7 when $schema names none: the draft payloads are validated by (fastjsonschema
        # knows drafts 4 to 7), and its metaschema checks several times faster than 2020-12's.
        cls = jsonschema.validators.validator_for(value, default=jsonschema.Draft7Validator)
        cls.check_schema(value)
    except RecursionError:
        raise SchemaError("json_schema nests too deeply to check against its metaschema") \
            from None
    except jsonschema.exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise SchemaError(f"json_schema does not match its metaschema at {where}: "
                          f"{exc.message}") from None
    return value


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
