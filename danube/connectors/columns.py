"""Records -> Arrow rows for the table sinks (Delta Lake, Iceberg): the columns come from
``field_mappings`` (upstream sink-deltalake's json_path / column / data_type / nullable),
from the registry subject's schema, or, with neither, are the raw message (payload bytes,
key, attributes as JSON). ``_danube_metadata`` (upstream's column, JSON) adds the topic,
partition, offset and publish time. A record that does not fit (not JSON, a required field
missing, a value of the wrong type) is an ``InvalidRecord`` naming the field.

Payloads are JSON, or, when the columns come from an Avro subject, one Avro binary datum
each (what the broker validates for an Avro subject), decoded with fastavro."""

import base64
import datetime
import json

import io

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from danube.connect import ConfigError, InvalidRecord

_INTS = {"Int8": (pa.int8(), -2**7, 2**7 - 1), "Int16": (pa.int16(), -2**15, 2**15 - 1),
         "Int32": (pa.int32(), -2**31, 2**31 - 1), "Int64": (pa.int64(), -2**63, 2**63 - 1),
         "UInt8": (pa.uint8(), 0, 2**8 - 1), "UInt16": (pa.uint16(), 0, 2**16 - 1),
         "UInt32": (pa.uint32(), 0, 2**32 - 1), "UInt64": (pa.uint64(), 0, 2**64 - 1)}
_OTHERS = {"Utf8": pa.string(), "Float32": pa.float32(), "Float64": pa.float64(),
           "Boolean": pa.bool_(), "Timestamp": pa.timestamp("us", tz="UTC"),
           "Binary": pa.binary(), "Json": pa.string()}
DATA_TYPES = tuple(_INTS) + tuple(_OTHERS)
METADATA = "_danube_metadata"


def arrow_type(name):
    return _INTS[name][0] if name in _INTS else _OTHERS[name]


def _convert(kind, value):
    """``value`` as column type ``kind``, or raise ValueError naming what is wrong."""
    if kind in _INTS:
        _, low, high = _INTS[kind]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {type(value).__name__}")
        if not low <= value <= high:
            raise ValueError(f"{value} is out of range for {kind}")
        return value
    if kind == "Utf8":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type(value).__name__}")
        return value
    if kind in ("Float32", "Float64"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {type(value).__name__}")
        return float(value)
    if kind == "Boolean":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {type(value).__name__}")
        return value
    if kind == "Timestamp":
        if isinstance(value, str):
            parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=datetime.timezone.utc)
            return parsed
        if isinstance(value, int) and not isinstance(value, bool):
            return datetime.datetime.fromtimestamp(value / 1e6, datetime.timezone.utc)
        raise ValueError("expected an ISO 8601 string or microseconds since the epoch")
    if kind == "Binary":
        if isinstance(value, bytes):            # an Avro bytes field
            return value
        if not isinstance(value, str):
            raise ValueError("expected base64 text")
        return base64.b64decode(value, validate=True)
    return json.dumps(value, separators=(",", ":"), default=_jsonable)        # Json


def _jsonable(value):
    if isinstance(value, bytes):                # Avro bytes inside a nested value
        return base64.b64encode(value).decode()
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    return str(value)


class Columns:
    """``mappings``: [(json_path, column, data_type, nullable)], or None for raw columns;
    ``avro_schema``: the Avro schema (text or parsed) when payloads are Avro datums."""

    def __init__(self, mappings, include_metadata, avro_schema=None):
        self.include_metadata = include_metadata
        self.avro = None
        if avro_schema is not None:
            import fastavro
            try:
                self.avro = fastavro.parse_schema(
                    json.loads(avro_schema) if isinstance(avro_schema, (str, bytes))
                    else avro_schema)
            except Exception as exc:    # noqa: BLE001 - fastavro raises several types
                raise ConfigError(f"the Avro schema does not parse: {exc}") from None
        self.raw = mappings is None
        fields = []
        if self.raw:
            fields = [pa.field("payload", pa.binary(), False), pa.field("key", pa.string()),
                      pa.field("attributes", pa.string(), False)]
            self.mappings = []
        else:
            seen = set()
            for path, column, kind, nullable in mappings:
                if kind not in DATA_TYPES:
                    raise ConfigError(f"field_mappings: column {column!r}: data_type {kind!r} "
                                      f"is not one of {', '.join(DATA_TYPES)}")
                if column in seen or column == METADATA:
                    raise ConfigError(f"field_mappings: column {column!r} appears twice")
                seen.add(column)
                fields.append(pa.field(column, arrow_type(kind), nullable))
            self.mappings = [(path.split("."), column, kind, nullable)
                             for path, column, kind, nullable in mappings]
        if include_metadata:
            fields.append(pa.field(METADATA, pa.string(), False))
        self.schema = pa.schema(fields)

    def row(self, record):
        """The record's row (a dict), or InvalidRecord."""
        if self.raw:
            row = {"payload": record.payload, "key": record.key,
                   "attributes": json.dumps(record.attributes, sort_keys=True)}
        else:
            doc = self._decode(record)
            if not isinstance(doc, dict):
                raise InvalidRecord(f"expected a JSON object, got {type(doc).__name__}",
                                    record)
            row = {}
            for parts, column, kind, nullable in self.mappings:
                value = doc
                for part in parts:
                    value = value.get(part) if isinstance(value, dict) else None
                if value is None:
                    if not nullable:
                        raise InvalidRecord(f"field {'.'.join(parts)!r} (column {column!r}) "
                                            f"is missing or null and the column is not "
                                            f"nullable", record)
                    row[column] = None
                    continue
                try:
                    row[column] = _convert(kind, value)
                except ValueError as exc:
                    raise InvalidRecord(f"field {'.'.join(parts)!r} (column {column!r}, "
                                        f"{kind}): {exc}", record) from None
        if self.include_metadata:
            row[METADATA] = self._metadata(record)
        return row

    def _decode(self, record):
        if self.avro is not None:
            from fastavro import schemaless_reader
            buf = io.BytesIO(record.payload)
            try:
                doc = schemaless_reader(buf, self.avro, None)
            except Exception as exc:    # noqa: BLE001 - EOFError, IndexError, UnicodeError...
                raise InvalidRecord(f"invalid Avro datum: {type(exc).__name__}: {exc}",
                                    record) from None
            if buf.tell() != len(record.payload):
                raise InvalidRecord("invalid Avro datum: bytes left after the record", record)
            return doc
        try:
            return orjson.loads(record.payload)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecord(f"invalid JSON: {exc}", record) from None

    @staticmethod
    def _metadata(record):
        return json.dumps({"topic": record.topic, "partition": record.partition,
                           "offset": record.offset, "timestamp": record.publish_time},
                          separators=(",", ":"))

    def _fast(self, records):
        """The whole batch parsed in C by Arrow's JSON reader, when the mappings allow it
        (top-level fields of plain types) and every record fits: 3-4x
        faster than row by row. None sends the batch down the row-by-row path, which
        names each record that does not fit."""
        if self.raw or not self.mappings or self.avro is not None:
            return None
        if any(len(parts) != 1 or parts[0] != column or kind in ("Timestamp", "Binary", "Json")
               for parts, column, kind, _ in self.mappings):
            return None
        payloads = [r.payload for r in records]
        if any(b"\n" in p for p in payloads):
            return None
        data = self.schema.remove(self.schema.get_field_index(METADATA)) \
            if self.include_metadata else self.schema
        try:
            table = pa_json.read_json(
                io.BytesIO(b"\n".join(payloads)),
                parse_options=pa_json.ParseOptions(explicit_schema=data,
                                                   unexpected_field_behavior="ignore"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != len(records):
            return None
        for field in data:
            if not field.nullable and table.column(field.name).null_count:
                return None
        try:
            table = table.select(data.names).cast(data)
        except (pa.ArrowInvalid, KeyError):
            return None
        if self.include_metadata:
            table = table.append_column(self.schema.field(METADATA), pa.array(
                [self._metadata(r) for r in records], pa.string()))
        return table

    def split(self, records):
        """(arrow table of the good records, [InvalidRecord] of the bad)."""
        fast = self._fast(records)
        if fast is not None:
            return fast, []
        rows, bad = [], []
        for record in records:
            try:
                rows.append(self.row(record))
            except InvalidRecord as exc:
                bad.append(exc)
        return pa.Table.from_pylist(rows, schema=self.schema), bad
