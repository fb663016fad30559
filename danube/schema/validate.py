"""Payload validators, compiled once per schema and cached by fingerprint.

- bytes: anything; string: UTF-8; number: 4 or 8 bytes (upstream's NumberValidator);
- json_schema: JSON text (parsed by orjson: RFC 8259, so NaN and Infinity are refused, as
  upstream's serde_json refuses them) valid under the schema, by code fastjsonschema
  generates (drafts 4, 6 and 7); a schema using 2019-09/2020-12 keywords, or one
  fastjsonschema cannot compile, is validated by `jsonschema` instead (slower). Defaults
  are not applied and remote `$ref`s are never fetched;
- avro: exactly one Avro binary datum (no container header, no trailing bytes), decoded by
  fastavro's schemaless reader; a batch is decoded from one buffer, each datum having to end
  where its payload does;
- protobuf: the payload parses as the file's first message (wire format and proto3 UTF-8
  only: unknown fields are allowed, as every protobuf parser allows them). Upstream leaves
  protobuf payloads unvalidated (its validator is unimplemented).
"""

import io
import json

try:
    # 2-3x faster than json.loads on small documents, and strict as upstream's serde_json:
    # NaN and Infinity are not JSON.
    from orjson import loads as _json_loads
except ImportError:  # pragma: no cover - orjson is a dependency; json is the fallback
    _json_loads = json.loads
#: json.loads takes no memoryview; orjson takes any buffer without a copy.
_JSON_TAKES_BUFFERS = _json_loads is not json.loads

from danube.schema._avrocheck import AvroChecker
from danube.schema._lru import LRU
from danube.schema.errors import PayloadInvalid
from danube.schema.formats import loaded

_CACHE_MAX = 256
_cache = LRU(_CACHE_MAX)


def validator_for(defn):
    """The Validator of `defn` (a formats.Definition), built once per fingerprint."""
    key = (defn.schema_type, defn.fingerprint)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    validator = _BUILDERS[defn.schema_type](defn)
    _cache.put(key, validator)
    return validator


class Validator:
    """`check(payload)` raises PayloadInvalid naming what failed; `check_many(payloads)` is
    the index of the first invalid payload, or None. Payloads are any bytes-like objects
    (bytes, bytearray, memoryview of bytes)."""

    def check(self, payload):
        raise NotImplementedError

    def check_many(self, payloads):
        check = self.check
        for i, payload in enumerate(payloads):
            try:
                check(payload)
            except PayloadInvalid:
                return i
        return None


class _Bytes(Validator):
    def check(self, payload):
        return None

    def check_many(self, payloads):
        return None


class _String(Validator):
    def check(self, payload):
        try:
            bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadInvalid(f"payload is not a valid UTF-8 string: {exc}") from None


class _Number(Validator):
    def check(self, payload):
        if len(payload) not in (4, 8):
            raise PayloadInvalid(f"payload is not a number: expected 4 or 8 bytes, got "
                                 f"{len(payload)}")

    def check_many(self, payloads):
        for i, payload in enumerate(payloads):
            if len(payload) not in (4, 8):
                return i
        return None


def _no_remote(uri):
    import fastjsonschema
    raise fastjsonschema.JsonSchemaDefinitionException(f"remote $ref {uri} is not fetched")


#: Keywords of drafts 2019-09 and 2020-12, which fastjsonschema (drafts 4 to 7) would ignore.
_NEWER_KEYWORDS = frozenset((
    "prefixItems", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
    "unevaluatedItems", "minContains", "maxContains", "$anchor", "$dynamicRef",
    "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"))


class _Json(Validator):
    def __init__(self, defn):
        schema = loaded(defn)
        self._validate = None
        if not _uses(schema, _NEWER_KEYWORDS):
            import fastjsonschema       # on first use, as fastavro: not at every start
            try:
                self._validate = fastjsonschema.compile(
                    schema, handlers={"http": _no_remote, "https": _no_remote},
                    use_default=False)
                self._error = fastjsonschema.JsonSchemaValueException
            except Exception:  # a construct fastjsonschema cannot compile
                self._validate = None
        if self._validate is None:
            import jsonschema.validators
            slow = jsonschema.validators.validator_for(schema)(schema)
            self._validate = slow.validate
            self._error = jsonschema.exceptions.ValidationError

    def check(self, payload):
        if not _JSON_TAKES_BUFFERS and type(payload) is not bytes:
            payload = bytes(payload)
        try:
            value = _json_loads(payload)
        except (ValueError, TypeError) as exc:
            raise PayloadInvalid(f"payload is not JSON: {exc}") from None
        try:
            self._validate(value)
        except self._error as exc:
            raise PayloadInvalid(f"payload does not match schema: {_json_message(exc)}") \
                from None
        except Exception as exc:  # e.g. a $ref that cannot be resolved (never fetched)
            raise PayloadInvalid(f"payload cannot be validated: {type(exc).__name__}: "
                                 f"{exc}") from None

    def check_many(self, payloads):
        loads, validate, copy = _json_loads, self._validate, not _JSON_TAKES_BUFFERS
        for i, payload in enumerate(payloads):
            if copy and type(payload) is not bytes:
                payload = bytes(payload)
            try:
                validate(loads(payload))
            except Exception:  # not JSON, not valid, or not checkable: as check() says
                return i
        return None


def _uses(node, words):
    if isinstance(node, dict):
        return any(k in words for k in node) or any(_uses(v, words) for v in node.values())
    if isinstance(node, list):
        return any(_uses(v, words) for v in node)
    return False


def _json_message(exc):
    import fastjsonschema
    if isinstance(exc, fastjsonschema.JsonSchemaValueException):
        return exc.message
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
    return f"data{path}: {exc.message}"


class _Avro(Validator):
    """Valid: exactly one datum. Checked in C by ``_avrocheck.AvroChecker``, which walks the
    bytes without building values (about 0.25 us a message, against 19 us for fastavro's
    reader, which builds a dict per record); fastavro's reader words the error of a payload
    the checker refused. The checker holds to the specification where fastavro is lenient:
    a boolean byte must be 0 or 1, an int at most 5 bytes."""

    def __init__(self, defn):
        # parse_schema's default (write hint on) marks the result parsed, so the reader does
        # not parse it again for every payload.
        import fastavro     # on first use: it costs a broker or CLI start ~0.1 s otherwise
        raw = json.loads(defn.raw)
        self._schema = fastavro.parse_schema(raw)
        self._name = loaded(defn).name
        try:
            self._checker = AvroChecker(raw)
        except (ValueError, KeyError, TypeError):   # a schema it does not model: fastavro
            self._checker = None

    def check(self, payload):
        if self._checker is not None:
            if self._checker.valid(bytes(payload)):
                return
            self._fastavro_check(payload)
            raise PayloadInvalid(self._message("not one datum of the schema (a boolean byte "
                                               "other than 0 or 1, or an over-long int)"))
        self._fastavro_check(payload)

    def _fastavro_check(self, payload):
        from fastavro import schemaless_reader
        buf = io.BytesIO(payload)
        try:
            schemaless_reader(buf, self._schema, None)
        except Exception as exc:  # fastavro raises EOFError, IndexError, UnicodeDecodeError...
            raise PayloadInvalid(self._message(_avro_error(exc))) from None
        left = len(payload) - buf.tell()
        if left:
            raise PayloadInvalid(self._message(f"{left} bytes left after the datum"))

    def check_many(self, payloads):
        if self._checker is not None:
            bad = self._checker.first_invalid(payloads if isinstance(payloads, list)
                                              else list(payloads))
            return None if bad < 0 else bad
        # Datums delimit themselves: read them from one buffer and require each to end where
        # its payload ends (a short datum would read into the next payload and miss it).
        buf = io.BytesIO(b"".join(payloads))
        from fastavro import schemaless_reader as read
        schema, end = self._schema, 0
        for i, payload in enumerate(payloads):
            end += len(payload)
            try:
                read(buf, schema, None)
            except Exception:
                return i
            if buf.tell() != end:
                return i
        return None

    def _message(self, what):
        return f"payload is not valid Avro for schema {self._name}: {what}"


def _avro_error(exc):
    text = str(exc)
    if isinstance(exc, EOFError):
        return f"payload ends early ({text})" if text else "payload ends early"
    if isinstance(exc, IndexError):
        return "an enum symbol or union branch index is out of range"
    return f"{type(exc).__name__}: {text}"


class _Protobuf(Validator):
    def __init__(self, defn):
        from google.protobuf import descriptor_pool, message_factory
        schema = loaded(defn)
        pool = descriptor_pool.DescriptorPool()
        for f in schema.files:
            pool.Add(f)
        self._cls = message_factory.GetMessageClass(
            pool.FindMessageTypeByName(schema.top.lstrip(".")))
        self._name = schema.top.lstrip(".")

    def check(self, payload):
        from google.protobuf.message import DecodeError
        try:
            self._cls.FromString(bytes(payload))
        except DecodeError as exc:
            raise PayloadInvalid(f"payload is not a valid protobuf {self._name}: {exc}") \
                from None


_BUILDERS = {"bytes": lambda d: _Bytes(), "string": lambda d: _String(),
             "number": lambda d: _Number(), "json_schema": _Json, "avro": _Avro,
             "protobuf": _Protobuf}
