"""A broker's registration under a lease, and the fence that keeps it from serving topics it
may no longer own.

The registration (``/cluster/register/{id}``) is written with a TTL of
``meta_store.lease_ttl_seconds`` and rewritten every third of it. When a broker dies its
lease runs out, etcd deletes the key, and the leader moves its topics. A broker that is
alive but cut off from etcd (a partition, a long pause) must have stopped serving by then,
or two brokers would serve one topic. So the fence goes by this broker's own clock: the lease
of a write cannot run out before ``ttl`` seconds after the write was *sent*, so once
``FENCE_FRACTION`` of the TTL has passed since the last write that succeeded was sent, the
broker fences itself (``on_fenced``: it stops serving every topic) without waiting to hear
from etcd. It fences too when it sees its own registration deleted (the lease ran out
although the refreshes seemed fine, or someone removed it). Afterwards it keeps trying to
register again; once that succeeds, ``on_restored`` lets topics be assigned to it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from danube.metadata import keys
from danube.metadata.errors import MetadataError
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.cluster")

#: Fence once this share of the TTL has passed since the last successful refresh was sent;
#: the rest of the TTL is the margin for stopping before the lease can run out.
FENCE_FRACTION = 0.75
#: A registration renewed within this share of the TTL after the last renewal before a
#: fence was sent never lapsed (its lease cannot run out before the full TTL; the rest is
#: the margin for clock drift between hosts), so no leader moved this broker's topics.
UNLAPSED_FRACTION = 0.9
WATCHDOG_TICK = 0.05


class Membership:
    def __init__(self, store, broker_id: str, record: dict, ttl: float, *,
                 on_fenced: Callable[[str], Awaitable[None]],
                 on_restored: Callable[[], Awaitable[None]], lease=None):
        self.store = store
        self.broker_id = broker_id
        self.record = record
        self.ttl = ttl
        self.on_fenced = on_fenced
        self.on_restored = on_restored
        self.key = keys.cluster_register(broker_id)
        #: The placement's Lease: its deadline is when the fence would fall without another
        #: renewal (every publish checks it before its ack), 0 while fenced.
        self.lease = lease
        self.fenced = False
        self.fences = 0
        self.leaving = False
        self._last_ok_sent: float | None = None
        self._tasks: list[asyncio.Task] = []
        self._fencing: asyncio.Task | None = None
        self._ok_before_fence: float | None = None
        #: After a fence: whether the registration may have lapsed (its lease run out, or
        #: the key deleted), in which case the leader may be moving this broker's topics.
        self.lapsed = False

    @property
    def registered(self) -> bool:
        return not self.fenced and self._last_ok_sent is not None

    async def start(self) -> None:
        await self._register()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._refresh_forever(), name="cluster-lease"),
                       loop.create_task(self._watchdog(), name="cluster-fence")]

    async def stop(self, *, deregister: bool = True) -> None:
        self.leaving = True
        await cancel_and_wait(*self._tasks)
        if deregister and not self.fenced:
            try:
                await self.store.delete(self.key)
            except MetadataError as exc:
                log.warning("could not deregister (the lease will expire): %s", exc)

    async def _register(self) -> float | None:
        """Write the registration; returns when the write that succeeded was sent, or None
        when a fence came while it was on its way (the process stalled with it in flight).
        Such a write did renew the lease, as of when it was sent: it counts as the last
        renewal before the fence, which ``lapsed`` is judged by, and nothing else (judged by
        the renewal before it, a registration that never lapsed was called lapsed, and its
        topics handed to a broker behind what this one acknowledged)."""
        sent = time.monotonic()
        fences = self.fences
        await self.store.put(self.key, self.record, ttl=self.ttl)
        if self.fences != fences:
            if self._ok_before_fence is None or sent > self._ok_before_fence:
                self._ok_before_fence = sent
            return None
        if self.fenced and (self._ok_before_fence is None or time.monotonic() >=
                            self._ok_before_fence + self.ttl * UNLAPSED_FRACTION):
            self.lapsed = True
        self._last_ok_sent = sent
        if not self.fenced:
            self._extend_lease(sent)
        return sent

    def _extend_lease(self, sent: float) -> None:
        if self.lease is not None:
            self.lease.deadline = max(self.lease.deadline, sent + self.ttl * FENCE_FRACTION)

    async def _refresh_forever(self) -> None:
        interval = self.ttl / 3
        limit = self.ttl * FENCE_FRACTION
        pause = interval
        while True:
            await asyncio.sleep(pause)
            pause = interval
            fencing = self._fencing
            if fencing is not None:
                await asyncio.shield(fencing)
            try:
                sent = await self._register()
            except MetadataError as exc:
                log.warning("broker %s could not renew its registration: %s", self.broker_id,
                            exc)
                continue
            if sent is None:
                log.warning("broker %s: a registration sent before the fence was answered "
                            "only after it; registering again", self.broker_id)
                pause = 0.0
                continue
            # The lease counts from when the write was sent: the next one is due an interval
            # after that, at once if the answer came late (a stall, a loaded etcd).
            pause = max(0.0, interval - (time.monotonic() - sent))
            if self.fenced and time.monotonic() - sent > limit:
                # Sent before the stall that fenced us and answered after it: its lease runs
                # out early, so it cannot end the fence.
                log.warning("broker %s: a registration sent %.1fs ago was answered only now; "
                            "registering again", self.broker_id, time.monotonic() - sent)
                continue
            if self.fenced:
                fencing = self._fencing
                if fencing is not None:
                    await asyncio.shield(fencing)
                self.fenced = False
                self._extend_lease(sent)
                log.warning("broker %s registered again after being fenced", self.broker_id)
                await self.on_restored()
                self.lapsed = False

    async def _watchdog(self) -> None:
        limit = self.ttl * FENCE_FRACTION
        while True:
            await asyncio.sleep(WATCHDOG_TICK)
            if not self.fenced and self._last_ok_sent is not None and \
                    time.monotonic() - self._last_ok_sent > limit:
                await self.fence(f"no registration renewed for {limit:.1f}s (lease "
                                 f"{self.ttl:g}s): etcd unreachable")

    def registration_deleted(self) -> None:
        """The view saw our registration go: whatever the cause, the leader will move our
        topics, so stop serving them now."""
        if not self.leaving:
            self.lapsed = True
        if not self.fenced and not self.leaving:
            asyncio.get_running_loop().create_task(
                self.fence("this broker's registration was deleted (lease expired)"))

    async def fence(self, reason: str) -> None:
        if self.fenced:
            return
        self.fenced = True
        if self.lease is not None:
            self.lease.deadline = 0.0
        self.fences += 1
        self._ok_before_fence = self._last_ok_sent
        self._last_ok_sent = None
        log.error("broker %s fenced: %s; it stops serving its topics", self.broker_id, reason)
        # A task of its own, which the renewal loop waits for before registering again
        # (the caller's task, the watchdog, never ends).
        self._fencing = asyncio.get_running_loop().create_task(self.on_fenced(reason),
                                                               name="cluster-fencing")
        try:
            await asyncio.shield(self._fencing)
        finally:
            if self._fencing is not None and self._fencing.done():
                self._fencing = None
