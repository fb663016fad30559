"""The registration's renewal and fence (danube.cluster.membership) with a store whose writes
can be held: a renewal sent before a stall and answered after the fence must not end the
fence (its lease runs out early); the broker writes again at once and is restored by that
write. And that stale renewal counts as the last one before the fence when judging whether
the registration lapsed: a broker whose lease never ran out serves its topics again from its
own WAL (judged by the renewal before it, it handed them to a broker behind what it had
acknowledged; tests/e2e/test_cluster_fence_recovery.py failed so under load)."""

import asyncio
import time
from types import SimpleNamespace

from danube.cluster import membership as membership_module
from danube.cluster.membership import FENCE_FRACTION, Membership
from danube.metadata.memory import MemoryStore
from waiting import async_holds_for, async_wait_for

TTL = 4.0


class HeldStore:
    """A MemoryStore whose next put, once ``hold()`` is called, waits until ``release()``."""

    def __init__(self, store):
        self.store = store
        self.held = None
        self.held_sent = None
        self.puts = []

    def hold(self):
        self.held = asyncio.Event()

    def release(self):
        held, self.held = self.held, None
        held.set()

    async def put(self, key, value, ttl=None):
        sent = time.monotonic()
        held = self.held
        if held is not None:
            self.held_sent = sent
            await held.wait()
        self.puts.append(sent)
        return await self.store.put(key, value, ttl=ttl)

    async def delete(self, key):
        return await self.store.delete(key)


async def test_a_renewal_answered_after_the_fence_does_not_end_it():
    store = HeldStore(await MemoryStore.open())
    fenced, restored = [], []

    async def on_fenced(reason):
        fenced.append(reason)

    async def on_restored():
        restored.append(member._last_ok_sent)

    member = Membership(store, "1", {"broker_id": "1"}, TTL, on_fenced=on_fenced,
                        on_restored=on_restored)
    await member.start()
    try:
        first = len(store.puts)
        await async_wait_for(lambda: len(store.puts) > first, what="a renewal")
        # The next renewal stalls past the fence threshold, then is answered.
        store.hold()
        await async_wait_for(lambda: fenced, timeout=TTL * 10, what="the fence")
        # Answered once even the held write is older than the fence threshold.
        await async_wait_for(lambda: store.held_sent is not None and
                             time.monotonic() - store.held_sent > TTL * FENCE_FRACTION,
                             timeout=TTL * 10, what="the held write going stale")
        released = time.monotonic()
        store.release()
        await async_wait_for(lambda: restored, timeout=TTL * 10, what="the broker restored")
        # Restored by a write sent after the stall, never by the stale one ...
        assert restored[0] >= released
        # ... so it is not fenced a second time by its own stale renewal.
        await async_holds_for(lambda: len(fenced) == 1 and not member.fenced,
                              TTL * FENCE_FRACTION / 2, what="no second fence")
        assert member.fences == 1
    finally:
        await member.stop()
        await store.store.close()


# -- the lapse judged by the stale renewal (a fake clock: the stall is the clock jumping while
# the put is held) --

STALL_TTL = 1.5


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class HeldPuts:
    """Puts succeed; while ``hold`` is set, a put waits for it to be released."""

    def __init__(self):
        self.hold = None
        self.in_flight = asyncio.Event()
        self.puts = 0

    async def put(self, key, value, ttl=None):
        hold = self.hold
        if hold is not None:
            self.in_flight.set()
            await hold.wait()
        self.puts += 1

    async def delete(self, key):
        pass


async def test_a_renewal_in_flight_across_a_stall_ends_no_fence_and_lapses_nothing(
        monkeypatch):
    clock = FakeClock()
    # Membership's own clock only (the event loop's stays real).
    monkeypatch.setattr(membership_module, "time", SimpleNamespace(monotonic=clock))
    store = HeldPuts()
    fenced, restored = [], []

    async def on_fenced(reason):
        fenced.append(reason)

    async def on_restored():
        restored.append(member.lapsed)

    member = Membership(store, "7", {"broker_url": "http://b:6650"}, STALL_TTL,
                        on_fenced=on_fenced, on_restored=on_restored)
    await member.start()
    try:
        clock.now += STALL_TTL / 3          # the next renewal: a third of a lease on
        store.hold = asyncio.Event()
        await asyncio.wait_for(store.in_flight.wait(), 30)
        clock.now += STALL_TTL * 0.8        # the stall: past the fence, within the lease
        await async_wait_for(lambda: member.fenced, timeout=30, what="the fence")
        store.hold.set()                    # the stalled put's answer is read
        store.hold = None
        await async_wait_for(lambda: restored, timeout=30, what="registered again")
        assert restored == [False]          # never lapsed: its topics stay here
        assert member.registered and member.fences == 1 and len(fenced) == 1
        # The last renewal is the fresh one: the watchdog has no reason to fence again.
        assert clock() - member._last_ok_sent < STALL_TTL * FENCE_FRACTION
    finally:
        if store.hold is not None:
            store.hold.set()
        await member.stop(deregister=False)


async def test_the_lease_allows_acks_only_until_the_fence_would_fall():
    """The placement's Lease, which every publish checks before its ack: a renewal moves it
    to FENCE_FRACTION of the TTL after the renewal was sent; a stalled renewal lets it run
    out on time (a paused broker acknowledges nothing once resumed, before its watchdog
    runs); a fence drops it to 0 and a renewal after the fence restores it."""
    from danube.broker.placement import Lease

    store = HeldStore(await MemoryStore.open())
    lease = Lease(0.0)

    async def on_fenced(reason):
        pass

    async def on_restored():
        pass

    member = Membership(store, "1", {"broker_id": "1"}, TTL, on_fenced=on_fenced,
                        on_restored=on_restored, lease=lease)
    await member.start()
    try:
        sent = store.puts[-1]
        # (the store's clock read is a moment after the membership's)
        assert sent - 1 < lease.deadline - TTL * FENCE_FRACTION <= sent
        assert time.monotonic() < lease.deadline
        store.hold()                          # etcd stops answering
        await async_wait_for(lambda: time.monotonic() >= lease.deadline, timeout=TTL * 3)
        await async_wait_for(lambda: member.fenced, timeout=TTL * 3)
        assert lease.deadline == 0.0
        store.release()
        await async_wait_for(lambda: not member.fenced, timeout=TTL * 5)
        assert time.monotonic() < lease.deadline
    finally:
        await member.stop(deregister=False)
