"""The WAL is composed, not mixed (danube/storage/wal/__init__.py, docs/architecture.md):
``WAL`` inherits from nothing, and neither does any class of danube/storage/wal; no module
there touches a ``_name`` of an object other than ``self`` or imports a private name from a
sibling (a part reaches another only through its public methods); each mutable table
belongs to one part; ``WAL``'s members beyond opening and closing are one-statement
delegations or reads (the facade); and the hot calls are the parts' own bound methods, so
the publish path pays no call through the facade."""

import asyncio
import collections
import pathlib

from code_shape import (longer_than_one_statement, package_classes, private_reaches,
                        shared_tables)

from danube.storage.wal import WAL, WALConfig
from danube.storage.wal.append import Appender
from danube.storage.wal.group_commit import GroupCommit
from danube.storage.wal.read import Reader
from danube.storage.wal.state import WalState

WAL_DIR = pathlib.Path(__file__).resolve().parents[2] / "danube" / "storage" / "wal"

#: WAL's own work: opening (recovery) and closing.
LIFECYCLE = {"__init__", "open", "close", "_release", "__aenter__", "__aexit__", "__repr__"}

#: The parts WAL composes, by attribute.
PARTS = ("_state", "_reader", "_commit", "_appender", "_retention")

#: The hot calls, bound to their part's method on each WAL instance.
HOT = {"append": (Appender, "_appender"), "append_packed": (Appender, "_appender"),
       "sync_to": (GroupCommit, "_commit"), "read": (Reader, "_reader")}


def test_wal_inherits_nothing():
    assert WAL.__mro__ == (WAL, object)


def test_no_class_of_the_wal_is_a_mixin():
    classes = package_classes(WAL_DIR, "danube.storage.wal")
    assert len(classes) >= len(PARTS) + 1
    assert [cls for cls in classes if cls.__mro__ != (cls, object)] == []


def test_no_part_reaches_into_another():
    wrong = {path.name: private_reaches(path.read_text()) for path in WAL_DIR.glob("*.py")}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_the_facade_only_delegates():
    assert longer_than_one_statement(WAL, LIFECYCLE) == []


def fields(part):
    if isinstance(part, WalState):
        return {name: getattr(part, name) for name in WalState.__slots__}
    return vars(part)


async def test_hot_calls_are_bound_and_each_table_has_one_owner(tmp_path):
    wal = await WAL.open(tmp_path, WALConfig(durability="always"))
    try:
        for name, (cls, attr) in HOT.items():
            bound = vars(wal)[name]        # on the instance, not the class's delegation
            assert bound.__func__ is vars(cls)[name], name
            assert bound.__self__ is getattr(wal, attr), name
        parts = {attr: fields(getattr(wal, attr)) for attr in PARTS}
        assert shared_tables(parts, (dict, set, list, collections.deque, asyncio.Lock)) == []
        # and the parts share the one state
        assert {id(getattr(wal, attr)._s) for attr in PARTS[1:]} == {id(wal._state)}
        first, last = wal.append([b"a", b"b"])
        assert (first, last) == (0, 1)
        assert await wal.sync_to(last) == 1
        assert wal.read(0) == [(0, b"a"), (1, b"b")]
    finally:
        await wal.close()
