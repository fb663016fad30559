"""The PostgreSQL connectors' pure parts: pgoutput messages (protocol 1) decoded into change
events with JSON values by type, cut or unknown messages refused with the reason; LSNs;
the change event's message key; and the connectors' declared keys."""

import struct

import pytest

from danube.connect import ConfigError
from danube.connect.config import load
from danube.connectors import pgoutput
from danube.connectors.postgres_cdc import PostgresCdcSource, _key_text
from danube.connectors.postgres_sink import PostgresSink


def cstr(s):
    return s.encode() + b"\0"


def relation(oid=16384, cols=(("id", 23, 1), ("name", 25, 0), ("price", 1700, 0),
                              ("meta", 3802, 0), ("ok", 16, 0), ("f", 701, 0))):
    body = b"R" + struct.pack(">I", oid) + cstr("public") + cstr("orders") + b"d"
    body += struct.pack(">h", len(cols))
    for name, type_oid, flags in cols:
        body += bytes([flags]) + cstr(name) + struct.pack(">Ii", type_oid, -1)
    return body


def tuple_data(*values):
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is ...:
            out += b"u"
        else:
            raw = v.encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def decoder():
    d = pgoutput.Decoder()
    assert d.decode(relation()).table == "orders"
    return d


def test_begin_commit_and_an_insert_with_values_by_type():
    d = decoder()
    begin = d.decode(b"B" + struct.pack(">QqI", 0x16B3748, 1_000_000, 726))
    assert (begin.final_lsn, begin.xid) == (0x16B3748, 726)
    assert pgoutput.pg_time(begin.commit_time) == "2000-01-01T00:00:01Z"
    change = d.decode(b"I" + struct.pack(">I", 16384) + b"N" +
                      tuple_data("1", "tea", "3.50", '{"a": [1]}', "t", "NaN"))
    assert change.op == "insert" and change.old is None
    assert change.new == {"id": 1, "name": "tea", "price": "3.50", "meta": {"a": [1]},
                          "ok": True, "f": "NaN"}
    commit = d.decode(b"C\0" + struct.pack(">QQq", 10, 20, 30))
    assert (commit.commit_lsn, commit.end_lsn) == (10, 20)


def test_update_with_old_key_unchanged_toast_and_delete():
    d = decoder()
    change = d.decode(b"U" + struct.pack(">I", 16384) + b"K" +
                      tuple_data("2", None, None, None, None, None) + b"N" +
                      tuple_data("3", ..., None, None, "f", "1.5"))
    assert change.old == {"id": 2}
    assert change.new == {"id": 3, "price": None, "meta": None, "ok": False, "f": 1.5}
    assert change.unchanged == ["name"]
    full = d.decode(b"D" + struct.pack(">I", 16384) + b"O" +
                    tuple_data("3", "x", None, None, "t", None))
    assert full.op == "delete" and full.new is None
    assert full.old == {"id": 3, "name": "x", "price": None, "meta": None, "ok": True,
                        "f": None}
    trunc = d.decode(b"T" + struct.pack(">iBI", 1, 1, 16384))
    assert trunc.cascade and [r.table for r in trunc.relations] == ["orders"]


@pytest.mark.parametrize("data,needle", [
    (b"I" + struct.pack(">I", 99) + b"N" + tuple_data("1"), "before its Relation"),
    (b"I" + struct.pack(">I", 16384) + b"N" + struct.pack(">h", 1) + b"t\0\0\0\x09ab",
     "cut or malformed"),
    (b"Z", "unknown pgoutput message"),
    (b"B\0\0", "cut or malformed"),
    (b"I" + struct.pack(">I", 16384) + b"X", "expected the new tuple"),
])
def test_cut_and_unknown_messages_are_refused(data, needle):
    with pytest.raises(pgoutput.DecodeError, match=needle):
        decoder().decode(data)


def test_lsns_and_keys():
    assert pgoutput.lsn_text(0x16B3748) == "0/16B3748"
    assert pgoutput.parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert _key_text({"id": 7}) == "7"
    assert _key_text({"code": "a-1"}) == "a-1"
    assert _key_text({"a": 1, "b": "x"}) == '[1,"x"]'
    assert _key_text({}) is None and _key_text(None) is None


BASE = {"connector": "x", "connector_name": "n"}


@pytest.mark.parametrize("cls,own,needle", [
    (PostgresCdcSource, {"connection_url": "postgresql://h/db", "routes": []},
     "postgres.routes: at least 1"),
    (PostgresCdcSource, {"connection_url": "postgresql://h/db", "slot_name": "Bad-Slot",
                         "routes": [{"table": "t", "to": "/a/b"}]}, "postgres.slot_name"),
    (PostgresCdcSource, {"connection_url": "postgresql://h/db",
                         "routes": [{"table": "a.b.c", "to": "/a/b"}]},
     "postgres.routes[0].table: 'a.b.c' is not a table name"),
    (PostgresCdcSource, {"connection_url": "host=h port",
                         "routes": [{"table": "t", "to": "/a/b"}]},
     "postgres.connection_url: not a PostgreSQL connection string"),
    (PostgresSink, {"connection_url": "postgresql://h/db",
                    "routes": [{"from": "/a/b", "subscription": "s", "to": "t",
                                "format": "avro"}]}, "postgres.routes[0].format"),
    (PostgresSink, {"connection_url": "postgresql://h/db",
                    "routes": [{"from": "/a/b", "subscription": "s", "to": "t",
                                "columns": [{"name": "id"}]}]},
     "postgres.routes[0].columns: [0]: expected"),
])
def test_declared_keys_name_the_problem(cls, own, needle):
    with pytest.raises(ConfigError) as info:
        load(dict(BASE, postgres=own), cls.CONFIG, env={})
    assert needle in str(info.value)


def test_the_url_from_the_environment():
    _, own = load(dict(BASE, postgres={"routes": [{"table": "t", "to": "/a/b"}]}),
                  PostgresCdcSource.CONFIG, env={"POSTGRES_URL": "postgresql://h/db"})
    assert own.postgres.connection_url == "postgresql://h/db"
    assert own.postgres.slot_name == "danube_cdc"
