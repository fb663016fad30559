"""PostgreSQL's ``pgoutput`` logical decoding messages (protocol version 1), decoded into
change events: sans-I/O, one message (the ``data`` of one row of
``pg_logical_slot_peek_binary_changes``) at a time.

Message layouts (PostgreSQL docs, "Logical Replication Message Formats"): Begin ``B``,
Commit ``C``, Relation ``R``, Type ``Y``, Origin ``O``, Insert ``I``, Update ``U``, Delete
``D``, Truncate ``T``, logical message ``M``. Column values are in text form (``t``), null
(``n``) or an unchanged TOASTed value that was not sent (``u``).

Values become JSON by their type: booleans, integers, floats and json/jsonb as themselves,
everything else (numeric, timestamps, arrays, bytea, ...) as the text PostgreSQL prints,
so no precision is lost."""

from __future__ import annotations

import dataclasses
import datetime
import json
import struct

# Type OIDs (pg_type.dat) whose text form maps to a JSON value of its own.
BOOL = 16
INTS = {20, 21, 23, 26}             # int8, int2, int4, oid
FLOATS = {700, 701}                 # float4, float8
JSONS = {114, 3802}                 # json, jsonb

PG_EPOCH = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)

_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class DecodeError(ValueError):
    """A message this decoder cannot read (a protocol it does not know, a cut message)."""


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL prints it: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def pg_time(micros: int) -> str:
    """A pgoutput timestamp (microseconds since 2000-01-01 UTC) as ISO 8601."""
    return (PG_EPOCH + datetime.timedelta(microseconds=micros)).isoformat().replace(
        "+00:00", "Z")


@dataclasses.dataclass
class Column:
    name: str
    type_oid: int
    in_key: bool


@dataclasses.dataclass
class Relation:
    oid: int
    schema: str
    table: str
    replica_identity: str
    columns: list

    @property
    def qualified(self):
        return f"{self.schema}.{self.table}"


@dataclasses.dataclass
class Begin:
    final_lsn: int
    commit_time: int
    xid: int


@dataclasses.dataclass
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclasses.dataclass
class Change:
    """One row change: ``op`` insert, update, delete (``truncate`` has no rows).
    ``old`` is the old row (all columns with REPLICA IDENTITY FULL, the key's otherwise,
    None when PostgreSQL sent none); ``new`` the new row; ``unchanged`` the columns whose
    TOASTed value did not change and was not sent."""
    op: str
    relation: Relation
    old: dict | None
    new: dict | None
    unchanged: list


@dataclasses.dataclass
class Truncate:
    relations: list
    cascade: bool
    restart_identity: bool


def _value(type_oid, text):
    if type_oid == BOOL:
        return text == "t"
    if type_oid in INTS:
        return int(text)
    if type_oid in FLOATS:
        try:
            value = float(text)
        except ValueError:
            return text
        # NaN and Infinity are not JSON: keep PostgreSQL's spelling.
        return value if value == value and value not in (float("inf"), float("-inf")) \
            else text
    if type_oid in JSONS:
        return json.loads(text)
    return text


class Decoder:
    """Keeps the relations announced so far (``R`` comes before a relation's first change
    in every decoding session, and again after its schema changed)."""

    def __init__(self):
        self.relations = {}

    def decode(self, data: bytes):
        """The event of one message: Begin, Commit, Relation, Change, Truncate, or None for
        those that carry nothing for us (Type, Origin, logical messages)."""
        try:
            return self._decode(memoryview(data))
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise DecodeError(f"cut or malformed pgoutput message "
                              f"{bytes(data[:1])!r}: {exc}") from None

    def _decode(self, m):
        kind = chr(m[0])
        if kind == "B":
            return Begin(_U64.unpack_from(m, 1)[0], _I64.unpack_from(m, 9)[0],
                         _U32.unpack_from(m, 17)[0])
        if kind == "C":
            return Commit(_U64.unpack_from(m, 2)[0], _U64.unpack_from(m, 10)[0],
                          _I64.unpack_from(m, 18)[0])
        if kind == "R":
            return self._relation(m)
        if kind in "IUD":
            return self._change(kind, m)
        if kind == "T":
            count = _I32.unpack_from(m, 1)[0]
            options = m[5]
            rels = [self._known(_U32.unpack_from(m, 6 + 4 * i)[0]) for i in range(count)]
            return Truncate(rels, bool(options & 1), bool(options & 2))
        if kind in "YOM":
            return None
        raise DecodeError(f"unknown pgoutput message {kind!r} (protocol version 1 expected)")

    def _relation(self, m):
        oid = _U32.unpack_from(m, 1)[0]
        pos = 5
        schema, pos = _cstring(m, pos)
        table, pos = _cstring(m, pos)
        identity = chr(m[pos])
        ncols = _I16.unpack_from(m, pos + 1)[0]
        pos += 3
        columns = []
        for _ in range(ncols):
            flags = m[pos]
            name, pos = _cstring(m, pos + 1)
            type_oid = _U32.unpack_from(m, pos)[0]
            pos += 8                        # type oid, type modifier
            columns.append(Column(name, type_oid, bool(flags & 1)))
        rel = Relation(oid, schema, table, identity, columns)
        self.relations[oid] = rel
        return rel

    def _known(self, oid):
        rel = self.relations.get(oid)
        if rel is None:
            raise DecodeError(f"a change for relation {oid} before its Relation message")
        return rel

    def _change(self, kind, m):
        rel = self._known(_U32.unpack_from(m, 1)[0])
        pos = 5
        old = new = None
        unchanged = []
        tag = chr(m[pos])
        if tag in "KO":
            old, pos, _ = self._tuple(rel, m, pos + 1, key_only=(tag == "K"))
            if kind != "D":
                tag = chr(m[pos])
        if kind != "D":
            if tag != "N":
                raise DecodeError(f"expected the new tuple ('N') in {kind!r}, got {tag!r}")
            new, pos, unchanged = self._tuple(rel, m, pos + 1, key_only=False)
        op = {"I": "insert", "U": "update", "D": "delete"}[kind]
        return Change(op, rel, old, new, unchanged)

    @staticmethod
    def _tuple(rel, m, pos, key_only):
        ncols = _I16.unpack_from(m, pos)[0]
        pos += 2
        row, unchanged = {}, []
        columns = rel.columns
        for i in range(ncols):
            col = columns[i]
            tag = m[pos]
            pos += 1
            if tag == 0x6E:                                     # 'n': null
                if not key_only or col.in_key:
                    row[col.name] = None
            elif tag == 0x75:                                   # 'u': unchanged TOAST
                unchanged.append(col.name)
            elif tag in (0x74, 0x62):                           # 't' text, 'b' binary
                size = _I32.unpack_from(m, pos)[0]
                raw = bytes(m[pos + 4:pos + 4 + size])
                if len(raw) != size:
                    raise IndexError("column value cut")
                pos += 4 + size
                if tag == 0x62:
                    raise DecodeError("binary column values: the slot must be read "
                                      "without the binary option")
                if not key_only or col.in_key:
                    row[col.name] = _value(col.type_oid, raw.decode())
            else:
                raise DecodeError(f"unknown column tag {chr(tag)!r}")
        return row, pos, unchanged


def _cstring(m, pos):
    end = pos
    while m[end] != 0:
        end += 1
    return bytes(m[pos:end]).decode(), end + 1
