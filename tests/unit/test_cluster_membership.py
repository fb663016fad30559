"""The registration's renewal and fence (danube.cluster.membership) with a store whose writes
can be held: a renewal sent before a stall and answered after the fence must not end the
fence (its lease runs out early); the broker writes again at once and is restored by that
write."""

import asyncio
import time

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
