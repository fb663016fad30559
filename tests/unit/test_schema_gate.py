"""The topic schema gate's lookups of versions a subject lacks: re-read at most once per
ABSENT_RETRY per version, and a bounded memory of such versions."""

import asyncio
import copy

from danube.broker.schemas import gate as gate_mod
from danube.broker.schemas.gate import SchemaGate
from danube.broker.schemas.registry import SchemaRegistry


class CountingRegistry:
    """The registry's version lookup over a fixed subject document, counting reads."""

    version_of = staticmethod(SchemaRegistry.version_of)

    def __init__(self):
        self.reads = 0
        self.doc = {"id": 5, "subject": "s", "latest_version": 1,
                    "versions": [{"version": 1}]}

    async def subject(self, subject):
        self.reads += 1
        return copy.deepcopy(self.doc)       # as the store does: a new document per read


def test_an_absent_version_is_not_reread_per_message(monkeypatch):
    async def run():
        registry = CountingRegistry()
        gate = SchemaGate(registry, "/default/t", "s", "enforce")
        assert (await gate._entry(1))["version"] == 1
        assert registry.reads == 1
        for _ in range(100):
            assert await gate._entry(9) is None
        assert registry.reads == 2                   # one re-read for version 9, not 100
        # A version registered since: the next lookup after the retry interval finds it.
        registry.doc["versions"].append({"version": 9})
        now = gate_mod.time.monotonic()
        monkeypatch.setattr(gate_mod.time, "monotonic", lambda: now + gate_mod.ABSENT_RETRY)
        assert (await gate._entry(9))["version"] == 9
        assert 9 not in gate._absent
        # A version never seen before is looked up at once.
        registry.doc["versions"].append({"version": 10})
        assert (await gate._entry(10))["version"] == 10

    asyncio.run(run())


def test_the_memory_of_absent_versions_is_bounded():
    async def run():
        gate = SchemaGate(CountingRegistry(), "/default/t", "s", "enforce")
        for version in range(2, gate_mod.MAX_ABSENT * 2 + 2):
            assert await gate._entry(version) is None
            assert len(gate._absent) <= gate_mod.MAX_ABSENT

    asyncio.run(run())
