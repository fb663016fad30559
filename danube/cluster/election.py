"""Leader election: the leader is whoever holds ``/cluster/leader``, a key created by
compare-and-swap (absent -> this broker's id) with a TTL, and renewed by compare-and-swap on
the version the holder last wrote.

etcd's own election API would do the same with a lease and a revision-ordered queue; the
CAS form works on every ``MetadataStore`` and keeps the key upstream uses. A leader that
cannot renew within the TTL has lost the key to whoever takes it next, so it steps down as
soon as a renewal fails or the fence (``Membership``) trips, before the TTL can run out.
Followers try to take the key every third of the TTL and at once when they see it deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from danube.metadata import keys
from danube.metadata.errors import MetadataError
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.cluster")


class LeaderElection:
    def __init__(self, store, broker_id: str, ttl: float, *,
                 on_elected: Callable[[], Awaitable[None]],
                 on_deposed: Callable[[], Awaitable[None]],
                 eligible: Callable[[], bool]):
        self.store = store
        self.broker_id = broker_id
        self.ttl = ttl
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.eligible = eligible
        self.is_leader = False
        self._version: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cluster-leader")

    def poke(self) -> None:
        """Try now (the leader key was deleted)."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self.is_leader:
            await self._step_down("broker stopping")
            try:
                entry = await self.store.get_entry(keys.CLUSTER_LEADER)
                if entry is not None and entry.value == self.broker_id:
                    # Let the next leader take over now rather than after the TTL.
                    await self.store.compare_and_swap(keys.CLUSTER_LEADER, entry.version,
                                                      self.broker_id, ttl=0.001)
            except MetadataError:
                pass

    async def stop_leading(self) -> None:
        """Step down at once (this broker is fenced); it may be elected again later."""
        await self._step_down("this broker is fenced")

    async def _run(self) -> None:
        while True:
            try:
                await self._turn()
            except MetadataError as exc:
                if self.is_leader:
                    await self._step_down(f"cannot renew leadership: {exc}")
            self._wake.clear()
            try:
                async with asyncio.timeout(self.ttl / 3):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _turn(self) -> None:
        if not self.eligible():
            if self.is_leader:
                await self._step_down("this broker is fenced")
            return
        if self.is_leader:
            if await self.store.compare_and_swap(keys.CLUSTER_LEADER, self._version,
                                                 self.broker_id, ttl=self.ttl):
                self._version = (await self.store.get_entry(keys.CLUSTER_LEADER)).version
                return
            await self._step_down("another broker took the leadership")
            return
        if await self.store.compare_and_swap(keys.CLUSTER_LEADER, None, self.broker_id,
                                             ttl=self.ttl):
            entry = await self.store.get_entry(keys.CLUSTER_LEADER)
            if entry is None or entry.value != self.broker_id:
                return
            self._version = entry.version
            self.is_leader = True
            log.info("broker %s is the cluster leader", self.broker_id)
            await self.on_elected()

    async def _step_down(self, reason: str) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        self._version = None
        log.warning("broker %s is no longer the leader: %s", self.broker_id, reason)
        await self.on_deposed()
