"""The leader's load manager: it places every unassigned topic on a broker and moves the
topics of brokers that left.

Only the leader runs it, from the cluster view's events: a new ``/cluster/unassigned/...``
marker is placed with the configured strategy; a deleted registration (a dead or fenced
broker) sends that broker's topics back to unassigned. On election, and every lease TTL
after, it reconciles from the view (assignments to brokers that are gone, markers nobody
handled), so a leader that died half-way through is finished by the next one.

Placing is batched: each pass takes every pending marker, ranks brokers once with exact
assignment counts that it updates as it goes, writes the assignments in transactions of up
to ``BATCH`` keys (``put_many``) and then deletes the markers. A topic is never owned twice:
before a new assignment, the stale one of a broker that left is deleted, and a marker for a
topic whose owner is still registered is simply dropped.

Markers (upstream's): ``null`` for a new topic; ``{"reason": "unload", "from_broker",
"ready"}`` waits until the old owner has let the topic go (``ready``) or is gone, and the
topic goes elsewhere if there is anywhere else; ``{"reason": "rebalance", "from_broker",
"to_broker"}`` prefers ``to_broker``; ``{"reason": "failover", "from_broker"}`` is ours, for
the topics of a broker that left.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from danube.broker.placement import SYSTEM_TOPIC
from danube.cluster import strategies
from danube.metadata import keys
from danube.metadata.errors import MetadataError
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.cluster")

BATCH = 100
RETRY_DELAY = 0.5


class LoadManager:
    def __init__(self, store, view, strategy: str, reconcile_every: float):
        self.store = store
        self.view = view
        self.strategy = strategy
        self.reconcile_every = reconcile_every
        self.assignments_total = 0
        # upstream's danube_broker_assignments_total{broker_id, action}
        self.assignments: dict[tuple[str, str], int] = {}
        self.failovers_total = 0
        self._dirty = asyncio.Event()
        self._full = True
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._full = True
        self._dirty.set()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="load-manager")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def on_event(self, event) -> None:
        """A view event (None: the view was rebuilt)."""
        if event is None:
            self._full = True
            self._dirty.set()
        elif event.key.startswith(keys.CLUSTER_UNASSIGNED + "/") and event.kind == "put":
            self._dirty.set()
        elif event.key.startswith(keys.CLUSTER_REGISTER + "/"):
            self._full = True           # a broker left (or joined: it can take topics)
            self._dirty.set()
        elif event.key.startswith(keys.CLUSTER_BROKERS + "/") and event.key.endswith("/state"):
            self._dirty.set()

    async def _run(self) -> None:
        await self._adopt_orphans()
        while True:
            try:
                async with asyncio.timeout(self.reconcile_every):
                    await self._dirty.wait()
            except TimeoutError:
                self._full = True
            self._dirty.clear()
            try:
                if self._full:
                    self._full = False
                    await self._fail_over_departed()
                await self._place_pending()
            except MetadataError as exc:
                log.warning("load manager pass failed (%s); retrying", exc)
                self._dirty.set()
                await asyncio.sleep(RETRY_DELAY)

    async def _adopt_orphans(self) -> None:
        """Topics recorded in a namespace with neither an owner nor a marker (a leader died
        between the two writes of a creation): mark them unassigned."""
        try:
            rows = await self.store.keys(keys.NAMESPACES)
        except MetadataError as exc:
            log.warning("load manager could not list topics: %s", exc)
            return
        for key in rows:
            parts = key.split("/")
            if len(parts) != 6 or parts[3] != "topics":
                continue
            topic = f"/{parts[4]}/{parts[5]}"
            if topic == SYSTEM_TOPIC:
                continue                # every broker has its own
            if topic not in self.view.owners and topic not in self.view.unassigned:
                await self.store.put(keys.cluster_unassigned(topic), None)

    async def _fail_over_departed(self) -> None:
        departed = collections.defaultdict(list)
        for topic, owner in list(self.view.owners.items()):
            if owner not in self.view.registered:
                departed[owner].append(topic)
        for broker, topics in departed.items():
            log.warning("broker %s left the cluster: moving its %d topics", broker, len(topics))
            marker = {"reason": "failover", "from_broker": broker}
            for i in range(0, len(topics), BATCH):
                chunk = topics[i:i + BATCH]
                # The marker first: if this leader dies before deleting the old assignment,
                # the next one still sees the topic to move.
                await self.store.put_many({keys.cluster_unassigned(t): marker for t in chunk})
                await self.store.delete_many(keys.cluster_broker_topic(broker, t)
                                             for t in chunk)
                await self._seen(lambda: all(self.view.owners.get(t) != broker for t in chunk))
            self.failovers_total += len(topics)

    async def _seen(self, condition) -> None:
        # Act next on a view that includes these writes, or a marker already handled would
        # be placed a second time.
        if not await self.view.until(condition):
            log.warning("load manager: own writes not seen back in the cluster view yet")

    def _target(self, topic, marker, counts) -> str | None:
        """Where ``topic`` goes now; None to leave its marker for later."""
        if not counts:
            return None
        if isinstance(marker, dict):
            source = str(marker.get("from_broker", ""))
            if marker.get("ready") is False and source in self.view.registered:
                return None             # the owner has not let it go yet
            target = str(marker.get("to_broker", ""))
            if marker.get("reason") == "rebalance" and target in counts:
                return target
            if source in counts and len(counts) > 1 and marker.get("reason") == "unload":
                counts = {b: n for b, n in counts.items() if b != source}
        return strategies.pick(self.strategy, counts, self.view.loads)

    async def _place_pending(self) -> None:
        pending = dict(self.view.unassigned)
        if not pending:
            return
        active = self.view.active_brokers()
        counts = {b: 0 for b in active}
        for owner in self.view.owners.values():
            if owner in counts:
                counts[owner] += 1
        done, placed = [], {}
        for topic, marker in pending.items():
            owner = self.view.owners.get(topic)
            if owner is not None and owner in self.view.registered:
                moving_from = marker.get("from_broker") if isinstance(marker, dict) else None
                if str(moving_from) != owner:
                    done.append(topic)              # already served: a late marker
                continue                            # a move whose owner lets go next
            target = self._target(topic, marker, counts)
            if target is None:
                continue
            placed[topic] = (target, owner)
            counts[target] += 1
        items = list(placed.items())
        for i in range(0, len(items), BATCH):
            chunk = items[i:i + BATCH]
            stale = [(t, old) for t, (_, old) in chunk if old is not None]
            await self.store.delete_many(keys.cluster_broker_topic(old, t) for t, old in stale)
            await self.store.put_many({keys.cluster_broker_topic(b, t): None
                                       for t, (b, _) in chunk})
            await self.store.delete_many(keys.cluster_unassigned(t) for t, _ in chunk)
            self.assignments_total += len(chunk)
            for _, (broker, old) in chunk:
                key = (str(broker), "assign")
                self.assignments[key] = self.assignments.get(key, 0) + 1
                if old is not None:
                    key = (str(old), "unassign")
                    self.assignments[key] = self.assignments.get(key, 0) + 1
            await self._seen(lambda: all(t not in self.view.unassigned and
                                         self.view.owners.get(t) == b
                                         for t, (b, _) in chunk))
        if placed:
            log.info("assigned %d topics (%s)", len(placed), self.strategy)
        await self.store.delete_many(keys.cluster_unassigned(t) for t in done)
