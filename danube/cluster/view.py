"""This broker's picture of the cluster, kept from one watch on ``/cluster``.

Every part of the cluster layer reads the same in-memory tables (who is registered and with
which URLs, each broker's state, who owns which topic, what waits to be assigned, the load
reports, the leader), so lookups and ownership checks cost no metadata read. The tables are
filled by a scan taken after the watch started (events are idempotent updates), and
rebuilt the same way if the watch ends (it fell behind, or etcd compacted it away).

Listeners (``on_change``) are called, on the loop, with each event after the tables took
it; they must not block (they hand work to tasks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from danube.metadata import keys
from danube.metadata.errors import MetadataError
from danube.metadata.store import DELETE, WatchEvent
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.cluster")

RESYNC_BACKOFF = 0.5


def topic_of(rest: str) -> str | None:
    """``/ns/topic`` out of the tail of an assignment or unassigned key, else None."""
    parts = rest.split("/")
    return rest if len(parts) == 3 and not parts[0] and parts[1] and parts[2] else None


class ClusterView:
    def __init__(self, store):
        self.store = store
        self.registered: dict[str, dict] = {}      # broker id -> registration record
        self.states: dict[str, dict] = {}          # broker id -> {"mode", "reason"}
        self.owners: dict[str, str] = {}           # topic -> broker id
        self.unassigned: dict[str, object] = {}    # topic -> marker (None for a new topic)
        self.loads: dict[str, dict] = {}           # broker id -> load report
        self.leader: str | None = None
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self.synced = asyncio.Event()
        self._task: asyncio.Task | None = None

    # -- queries ----------------------------------------------------------------------------

    def topics_of(self, broker_id: str) -> list[str]:
        return sorted(t for t, b in self.owners.items() if b == broker_id)

    def mode_of(self, broker_id: str) -> str:
        state = self.states.get(broker_id)
        mode = state.get("mode") if isinstance(state, dict) else None
        return mode if mode in ("active", "draining", "drained") else "active"

    def active_brokers(self) -> list[str]:
        return sorted(b for b in self.registered if self.mode_of(b) == "active")

    async def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until ``condition()`` holds of the tables (a write of this broker's has come
        back through the watch); False if that takes longer than ``timeout``."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    # -- upkeep -----------------------------------------------------------------------------

    async def start(self) -> None:
        watch = await self._resync()
        self._task = asyncio.get_running_loop().create_task(self._follow(watch),
                                                            name="cluster-view")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _resync(self):
        watch = await self.store.watch(keys.CLUSTER)
        try:
            rows = await self.store.scan(keys.CLUSTER)
        except BaseException:
            watch.close()
            raise
        self.registered.clear()
        self.states.clear()
        self.owners.clear()
        self.unassigned.clear()
        self.loads.clear()
        self.leader = None
        for key, value in rows:
            self._apply("put", key, value)
        self.synced.set()
        return watch

    async def _follow(self, watch) -> None:
        while True:
            try:
                async with watch:
                    async for event in watch:
                        self._apply(event.kind, event.key, event.value)
                        for listener in list(self.listeners):
                            listener(event)
            except MetadataError as exc:
                log.warning("cluster view lost its watch (%s); reading the cluster again", exc)
            while True:
                try:
                    watch = await self._resync()
                    break
                except MetadataError as exc:
                    log.warning("cluster view cannot resync yet: %s", exc)
                    await asyncio.sleep(RESYNC_BACKOFF)
            for listener in list(self.listeners):
                listener(None)          # "everything may have changed"

    def _apply(self, kind: str, key: str, value) -> None:
        deleted = kind == DELETE
        if key == keys.CLUSTER_LEADER:
            self.leader = None if deleted else str(value)
            return
        for root, table in ((keys.CLUSTER_REGISTER, self.registered),
                            (keys.CLUSTER_LOAD, self.loads)):
            if key.startswith(root + "/"):
                broker = key[len(root) + 1:]
                if deleted:
                    table.pop(broker, None)
                elif isinstance(value, dict):
                    table[broker] = value
                return
        if key.startswith(keys.CLUSTER_UNASSIGNED + "/"):
            topic = topic_of(key[len(keys.CLUSTER_UNASSIGNED):])
            if topic is not None:
                if deleted:
                    self.unassigned.pop(topic, None)
                else:
                    self.unassigned[topic] = value
            return
        if key.startswith(keys.CLUSTER_BROKERS + "/"):
            broker, _, rest = key[len(keys.CLUSTER_BROKERS) + 1:].partition("/")
            if rest == "state":
                if deleted:
                    self.states.pop(broker, None)
                else:
                    self.states[broker] = value
                return
            topic = topic_of("/" + rest)
            if topic is None:
                return
            if deleted:
                if self.owners.get(topic) == broker:
                    del self.owners[topic]
            else:
                self.owners[topic] = broker
