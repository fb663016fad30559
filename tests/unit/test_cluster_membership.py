"""danube.cluster.membership: a renewal that was on its way when the broker stalled past the
fence threshold (its put applied by etcd, its answer read only after the stall) renewed the
lease as of when it was sent: the broker is fenced, then registered again by a fresh renewal,
and judged never lapsed (it serves its topics again from its own WAL). Counting the stale
put as the last renewal had the watchdog fence it again at once and the next renewal call
the registration lapsed, handing its topics to a broker behind what it acknowledged
(tests/e2e/test_cluster_fence_recovery.py failed so under load). Time is a fake clock; the
stall is the clock jumping while the put is held."""

import asyncio
from types import SimpleNamespace

from danube.cluster import membership as membership_module
from danube.cluster.membership import Membership
from waiting import async_wait_for

TTL = 1.5


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class HeldStore:
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
    clock = Clock()
    # Membership's own clock only (the event loop's stays real).
    monkeypatch.setattr(membership_module, "time", SimpleNamespace(monotonic=clock))
    store = HeldStore()
    fenced, restored = [], []

    async def on_fenced(reason):
        fenced.append(reason)

    async def on_restored():
        restored.append(member.lapsed)

    member = Membership(store, "7", {"broker_url": "http://b:6650"}, TTL,
                        on_fenced=on_fenced, on_restored=on_restored)
    await member.start()
    try:
        clock.now += TTL / 3                # the next renewal is sent a third of a lease on
        store.hold = asyncio.Event()
        await asyncio.wait_for(store.in_flight.wait(), 30)
        clock.now += TTL * 0.8              # the stall: past the fence, within the lease
        await async_wait_for(lambda: member.fenced, timeout=30, what="the fence")
        store.hold.set()                    # the stalled put's answer is read
        store.hold = None
        await async_wait_for(lambda: restored, timeout=30, what="registered again")
        assert restored == [False]          # never lapsed: its topics stay here
        assert member.registered and member.fences == 1 and len(fenced) == 1
        # The last renewal is the fresh one: the watchdog has no reason to fence again.
        assert clock() - member._last_ok_sent < TTL * membership_module.FENCE_FRACTION
    finally:
        if store.hold is not None:
            store.hold.set()
        await member.stop(deregister=False)
