"""The broker core is composed, not mixed (docs/architecture.md, "The broker core"):
BrokerCore inherits from nothing, and neither does any class under danube/broker/core; no
module there touches a ``_name`` of an object other than ``self``, or imports a private name
from a sibling (a component reaches another only through its public methods); each mutable
table or lock belongs to one component; and BrokerCore's members beyond wiring and lifecycle
are one-statement delegations or reads (the facade)."""

import asyncio
import pathlib

from code_shape import (longer_than_one_statement, package_classes, private_reaches,
                        shared_tables, statements)

from danube.broker.core import BrokerCore
from danube.broker.registry import ClientRegistry
from danube.config import BrokerConfig
from danube.metadata.memory import MemoryStore

CORE = pathlib.Path(__file__).resolve().parents[2] / "danube" / "broker" / "core"

#: BrokerCore's own work: wiring the components and running their lifecycle.
LIFECYCLE = {"__init__", "start", "stop", "register", "registration_record"}

#: The components BrokerCore composes, by attribute.
COMPONENTS = ("namespaces", "topic_table", "producer_table", "subscription_table",
              "topic_schemas", "admin")


def test_broker_core_inherits_nothing():
    assert BrokerCore.__mro__ == (BrokerCore, object)


def test_no_class_of_the_core_is_a_mixin():
    classes = package_classes(CORE, "danube.broker.core")
    assert len(classes) >= len(COMPONENTS) + 1
    assert [cls for cls in classes if cls.__mro__ != (cls, object)] == []


def test_no_component_reaches_into_another():
    wrong = {path.name: private_reaches(path.read_text()) for path in CORE.glob("*.py")}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_the_private_reach_check_can_fail():
    assert private_reaches("class A:\n"
                           "    def f(self):\n"
                           "        return self.topic_table._lock, self._mine\n") == [
        (3, "self.topic_table._lock")]
    assert private_reaches("from danube.broker.core.topics import _open, TopicTable\n") == [
        (1, "danube.broker.core.topics._open")]
    assert private_reaches("def f(self):\n    return self._x, cls._y, a.__class__\n") == []


def test_the_facade_only_delegates():
    """What BrokerCore offers besides wiring and lifecycle is one statement each: a call to
    a component, or a read of one."""
    assert longer_than_one_statement(BrokerCore, LIFECYCLE) == []


def test_the_facade_check_can_fail():
    def two(self):
        """A docstring is not a statement."""
        self.a.b()
        return self.c
    assert len(statements(two)) == 2


async def test_each_table_and_lock_has_one_owner(tmp_path):
    """A component's dicts, sets, lists and locks are its own: no two components hold the
    same one (the mixins shared one object's), and the facade's tables are the owners'."""
    core = BrokerCore(BrokerConfig(data_dir=str(tmp_path)), await MemoryStore.open(),
                      ClientRegistry())
    parts = {attr: vars(getattr(core, attr)) for attr in COMPONENTS}
    assert shared_tables(parts, (dict, set, list, asyncio.Lock)) == []
    assert core.topics is core.topic_table.topics
    assert core.producers is core.producer_table.producers
    assert core.consumers is core.subscription_table.consumers
