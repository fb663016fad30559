"""The MetadataStore contract, run against every store (embedded SQLite in a temp directory,
memory, and etcd: a real etcd for the module), plus what only the embedded store promises:
data, revisions, counters and TTL deadlines survive a restart, and a write is durable once
acknowledged, even if the writer is SIGKILLed the moment after. What only the etcd store
promises is in test_metadata_etcd.py."""

import asyncio
import gc
import math
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.metadata import (DELETE, PUT, EmbeddedStore, Entry, MemoryStore, MetadataError,
                             MetadataUnavailable, StoreLocked, WatchEvent, WatchOverflow)
from danube.metadata.etcd import EtcdStore
from danube.metadata.store import in_prefix
from killed_child import KilledChild
from waiting import async_holds_for, async_wait_for

TTL = 0.2


async def next_event(watch, timeout=2.0):
    return await asyncio.wait_for(anext(watch), timeout)


async def drain(watch, n, timeout=2.0):
    return [await next_event(watch, timeout) for _ in range(n)]


async def assert_no_event(watch, wait=0.05):
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(watch), wait)


# -- basic operations ------------------------------------------------------------------------

async def test_get_put_delete(store):
    assert await store.get("/a") is None
    assert await store.get_entry("/a") is None
    v1 = await store.put("/a", "one")
    assert await store.get("/a") == "one"
    v2 = await store.put("/a", "two")
    assert v2 > v1
    entry = await store.get_entry("/a")
    assert entry == Entry("/a", "two", v2, None)
    assert await store.delete("/a") is True
    assert await store.get_entry("/a") is None
    assert await store.delete("/a") is False


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2**63 + 5, 1.5, "", "text", "ünïcødé ✓ \U0001f600",
    [], [1, "two", None, [3.0]], {}, {"a": {"b": [1, 2, {"c": None}]}, "n": 18446744073709551615},
])
async def test_json_values_round_trip(store, value):
    await store.put("/v", value)
    assert await store.get("/v") == value
    entry = await store.get_entry("/v")
    assert entry is not None and entry.value == value
    assert await store.scan("/v") == [("/v", value)]


async def test_null_valued_key_exists(store):
    await store.put("/cluster/brokers/1/default/t", None)
    entry = await store.get_entry("/cluster/brokers/1/default/t")
    assert entry is not None and entry.value is None
    assert await store.keys("/cluster/brokers/1") == ["/cluster/brokers/1/default/t"]
    assert await store.delete("/cluster/brokers/1/default/t") is True


async def test_values_are_copies(store):
    value = {"list": [1, 2]}
    await store.put("/v", value)
    value["list"].append(3)
    got = await store.get("/v")
    assert got == {"list": [1, 2]}
    got["list"].append(4)
    assert await store.get("/v") == {"list": [1, 2]}
    await store.put("/t", (1, 2))
    assert await store.get("/t") == [1, 2]


async def test_non_json_values_rejected(store):
    with pytest.raises(TypeError):
        await store.put("/v", object())
    with pytest.raises(ValueError):
        await store.put("/v", math.nan)
    with pytest.raises(TypeError):
        await store.compare_and_swap("/v", None, {1, 2})
    assert await store.get_entry("/v") is None


@pytest.mark.parametrize("key", ["", "a", "a/b", "ns/foo", None, 5, b"/a", "/a\x00b", "/\ud800"])
async def test_invalid_keys_raise_value_error(store, key):
    calls = [
        store.get(key), store.get_entry(key), store.put(key, 1), store.put(key, 1, ttl=1),
        store.delete(key), store.delete_prefix(key), store.scan(key), store.keys(key),
        store.watch(key), store.compare_and_swap(key, None, 1), store.allocate_id(key),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="metadata (key|prefix)"):
            await call
    assert await store.keys("/") == []


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, "1", True])
async def test_invalid_ttl(store, ttl):
    with pytest.raises(ValueError, match="ttl"):
        await store.put("/a", 1, ttl=ttl)
    assert await store.get_entry("/a") is None


async def test_closed_store_is_unavailable(tmp_path, etcd_server):
    for s in (MemoryStore(), EmbeddedStore(tmp_path / "m"), EtcdStore([etcd_server.endpoint])):
        await s.start()
        await s.put("/a", 1)
        await s.close()
        await s.close()
        for call in (s.get("/a"), s.put("/a", 2), s.scan("/"), s.watch("/"),
                     s.allocate_id("/c"), s.delete_prefix("/")):
            with pytest.raises(MetadataUnavailable):
                await call


# -- scans -----------------------------------------------------------------------------------

BOUNDARY_KEYS = ["/ns/fo", "/ns/foo", "/ns/foo-x", "/ns/foo.x", "/ns/foo/a", "/ns/foo/b/c",
                 "/ns/foo0", "/ns/foobar", "/ns/foobar/x", "/ns/fop", "/nsx/foo/a", "/ns"]


async def test_scan_respects_slash_boundary(store):
    for i, key in enumerate(BOUNDARY_KEYS):
        await store.put(key, i)
    expected = ["/ns/foo", "/ns/foo/a", "/ns/foo/b/c"]
    assert await store.keys("/ns/foo") == expected
    assert [k for k, _ in await store.scan("/ns/foo")] == expected
    assert await store.scan("/ns/foo/") == [("/ns/foo/a", 4), ("/ns/foo/b/c", 5)]
    assert await store.keys("/ns/foobar") == ["/ns/foobar", "/ns/foobar/x"]
    assert await store.keys("/ns/foo/b") == ["/ns/foo/b/c"]
    assert await store.keys("/ns/foo/b/c") == ["/ns/foo/b/c"]
    assert await store.keys("/ns/foo/zz") == []
    assert await store.keys("/ns") == sorted(k for k in BOUNDARY_KEYS if k != "/nsx/foo/a")
    assert await store.keys("/") == sorted(BOUNDARY_KEYS)


async def test_scan_sorted(store):
    keys = ["/s/b", "/s/a/z", "/s/é", "/s/a", "/s/Z", "/s/10", "/s/9", "/s/a b", "/s/\U0001f600",
            "/s/\uffff", "/s/a-b", "/s/a.b"]
    for key in keys:
        await store.put(key, key)
    scanned = await store.scan("/s")
    assert [k for k, _ in scanned] == sorted(keys)
    assert all(k == v for k, v in scanned)


async def test_delete_prefix(store):
    for i, key in enumerate(BOUNDARY_KEYS):
        await store.put(key, i)
    watch = await store.watch("/")
    assert await store.delete_prefix("/ns/foo") == 3
    events = await drain(watch, 3)
    assert [(e.kind, e.key) for e in events] == [(DELETE, "/ns/foo"), (DELETE, "/ns/foo/a"),
                                                 (DELETE, "/ns/foo/b/c")]
    assert len({e.version for e in events}) == 1, "one atomic delete shares one revision"
    assert await store.keys("/ns/foobar") == ["/ns/foobar", "/ns/foobar/x"]
    assert await store.delete_prefix("/ns/foo") == 0
    assert await store.delete_prefix("/") == len(BOUNDARY_KEYS) - 3
    assert await store.keys("/") == []


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.sets(st.lists(st.sampled_from(["a", "ab", "a-", "b", "a.b", "é"]),
                             min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts)),
                    max_size=12),
       prefix=st.lists(st.sampled_from(["a", "ab", "b", ""]), min_size=0, max_size=2)
       .map(lambda parts: "/" + "/".join(parts)))
def test_scan_matches_boundary_model(tmp_path, etcd_server, keys, prefix):
    """Range scans agree with a plain filter by the boundary rule, for every store."""
    async def check(s):
        await s.delete_prefix("/")
        for key in keys:
            await s.put(key, key)
        expected = sorted(k for k in keys if in_prefix(k, prefix))
        assert await s.keys(prefix) == expected
        assert [k for k, _ in await s.scan(prefix)] == expected

    async def run():
        for s in (await MemoryStore.open(), await EmbeddedStore.open(tmp_path / "hyp"),
                  await EtcdStore.open([etcd_server.endpoint])):
            try:
                await check(s)
            finally:
                await s.close()

    asyncio.run(run())


# -- watches ---------------------------------------------------------------------------------

async def test_watch_put_and_delete_events_in_order(store):
    watch = await store.watch("/w")
    v1 = await store.put("/w/a", {"n": 1})
    v2 = await store.put("/w/b", [1])
    v3 = await store.put("/w/a", {"n": 2})
    assert await store.delete("/w/b") is True
    events = await drain(watch, 4)
    assert events[:3] == [WatchEvent(PUT, "/w/a", {"n": 1}, v1), WatchEvent(PUT, "/w/b", [1], v2),
                          WatchEvent(PUT, "/w/a", {"n": 2}, v3)]
    assert events[3].kind == DELETE and events[3].key == "/w/b" and events[3].value is None
    assert [e.version for e in events] == sorted({e.version for e in events})
    assert await store.delete("/w/b") is False
    await assert_no_event(watch)


async def test_watch_respects_boundary(store):
    watch = await store.watch("/ns/foo")
    for key in BOUNDARY_KEYS:
        await store.put(key, None)
    events = await drain(watch, 3)
    assert [e.key for e in events] == ["/ns/foo", "/ns/foo/a", "/ns/foo/b/c"]
    await assert_no_event(watch)


async def test_watch_sees_only_later_commits(store):
    await store.put("/w/old", 1)
    watch = await store.watch("/w")
    await store.put("/w/new", 2)
    assert (await next_event(watch)).key == "/w/new"


async def test_watch_order_under_concurrent_writers(store):
    watch = await store.watch("/c")

    async def writer(n):
        for i in range(20):
            await store.put(f"/c/{n}", i)
            await asyncio.sleep(0)

    await asyncio.gather(*(writer(n) for n in range(5)))
    events = await drain(watch, 100)
    versions = [e.version for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 100
    for n in range(5):
        assert [e.value for e in events if e.key == f"/c/{n}"] == list(range(20))


async def test_many_watchers(store):
    watches = [await store.watch("/m" if i % 2 else "/m/x") for i in range(40)]
    assert store.watch_count == 40
    await store.put("/m/x", 1)
    await store.put("/m/y", 2)
    for i, watch in enumerate(watches):
        expected = ["/m/x", "/m/y"] if i % 2 else ["/m/x"]
        assert [e.key for e in await drain(watch, len(expected))] == expected
    # every watcher has its own copy of the value
    await store.put("/m/x", {"k": []})
    first = await next_event(watches[0])
    first.value["k"].append("mutated")
    assert (await next_event(watches[2])).value == {"k": []}
    for watch in watches:
        watch.close()
    assert store.watch_count == 0


async def test_closing_a_watch_unregisters_it(store):
    watch = await store.watch("/u")
    assert store.watch_count == 1
    await store.put("/u/1", 1)
    watch.close()
    assert store.watch_count == 0
    with pytest.raises(StopAsyncIteration):
        await anext(watch)
    await store.put("/u/2", 2)
    assert watch.closed

    # leaving `async with` (here by cancellation of the consuming task) unregisters too
    seen = []

    async def consume():
        async with await store.watch("/u") as w:
            async for event in w:
                seen.append(event.key)

    task = asyncio.create_task(consume())
    await async_wait_for(lambda: store.watch_count == 1, what="the watch registered")
    await store.put("/u/3", 3)
    await async_wait_for(lambda: seen, what="the event seen by the watching task")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["/u/3"]
    assert store.watch_count == 0

    # a watch dropped without closing unregisters when collected
    await store.watch("/u")
    gc.collect()
    assert store.watch_count == 0


async def test_cancelled_wait_loses_no_event(store):
    watch = await store.watch("/x")
    await assert_no_event(watch)  # cancels a pending __anext__
    await store.put("/x", 1)
    assert (await next_event(watch)).key == "/x"


async def test_slow_watcher_overflows_without_blocking_writers(store):
    slow = await store.watch("/o", max_pending=5)
    fast = await store.watch("/o")
    for i in range(5):
        await store.put(f"/o/{i}", i)
    assert store.watch_count == 2
    await store.put("/o/5", 5)  # the sixth undelivered event ends the slow watch
    assert store.watch_count == 1
    with pytest.raises(WatchOverflow):
        await anext(slow)
    with pytest.raises(StopAsyncIteration):
        await anext(slow)
    assert [e.value for e in await drain(fast, 6)] == list(range(6))
    # a watcher that keeps up never overflows, whatever the volume
    keeping_up = await store.watch("/o", max_pending=1)
    for i in range(20):
        await store.put("/o/k", i)
        assert (await next_event(keeping_up)).value == i


async def test_store_close_ends_watches(tmp_path, etcd_server):
    for s in (await MemoryStore.open(), await EmbeddedStore.open(tmp_path / "c"),
              await EtcdStore.open([etcd_server.endpoint])):
        watch = await s.watch("/")
        await s.put("/a", 1)
        await s.close()
        assert (await next_event(watch)).key == "/a"  # buffered events still arrive first
        with pytest.raises(MetadataUnavailable):
            await anext(watch)


# -- TTL -------------------------------------------------------------------------------------

async def test_ttl_key_expires_and_emits_delete(store):
    # A TTL long enough that a loaded machine still reads the key before it expires (with
    # 0.2 s, a stalled run once found it gone already).
    ttl = 3.0
    watch = await store.watch("/t")
    await store.put("/t/k", "v", ttl=ttl)
    await store.put("/t/perm", "p")
    entry = await store.get_entry("/t/k")
    assert entry.expires_at is not None and 0 < entry.expires_at - time.time() <= ttl
    assert [e.kind for e in await drain(watch, 2)] == [PUT, PUT]
    event = await next_event(watch, timeout=ttl + 30)  # the reaper announces the expiry
    assert (event.kind, event.key, event.value) == (DELETE, "/t/k", None)
    assert await store.get_entry("/t/k") is None
    assert await store.keys("/t") == ["/t/perm"]


async def test_expired_keys_invisible_before_reaping(store):
    await store.put("/t/k", 1, ttl=TTL)
    await store.put("/t/k2", 2, ttl=TTL)
    await store.allocate_id("/t/counter")
    # Time passing is the condition here, not an event: the sleep blocks the loop, so the
    # reaper cannot run and only the expiry deadlines can hide the keys.
    time.sleep(TTL + 0.05)
    assert await store.get("/t/k") is None
    assert await store.get_entry("/t/k2") is None
    assert await store.scan("/t") == [("/t/counter", 1)]
    assert await store.keys("/t/k") == []
    assert await store.delete("/t/k") is False
    assert await store.compare_and_swap("/t/k2", None, "fresh") is True


async def test_expiry_is_announced_before_a_later_write(store):
    """A broker re-registering after its TTL ran out is first seen to leave."""
    await store.put("/cluster/register/7", {"v": 1}, ttl=TTL)
    watch = await store.watch("/cluster/register")
    # Blocks the loop past the TTL, so the reaper has not announced the expiry yet: the
    # write must announce it first.
    time.sleep(TTL + 0.05)
    await store.put("/cluster/register/7", {"v": 2}, ttl=TTL)
    events = await drain(watch, 2)
    assert [(e.kind, e.value) for e in events] == [(DELETE, None), (PUT, {"v": 2})]
    assert events[0].version < events[1].version


async def test_ttl_refresh_extends(store):
    await store.put("/t/r", 1, ttl=0.3)
    first = (await store.get_entry("/t/r")).expires_at
    await asyncio.sleep(0.2)            # the refresh comes at least 0.2 s later
    await store.put("/t/r", 2, ttl=0.3)
    refreshed = await store.get_entry("/t/r")
    # The deadline moved with the refresh: 0.3 s from it, not from the first put ...
    assert refreshed.value == 2 and refreshed.expires_at - first >= 0.15
    # ... and the key is there until that deadline, not the first one.

    async def gone():
        return await store.get("/t/r") is None
    await async_wait_for(gone, what="the refreshed key to expire")
    assert time.time() >= refreshed.expires_at


async def test_put_without_ttl_makes_key_permanent(store):
    await store.put("/t/p", 1, ttl=TTL)
    await store.put("/t/p", 2)
    assert (await store.get_entry("/t/p")).expires_at is None

    async def kept():
        return await store.get("/t/p") == 2
    # Past the first put's TTL, watched over a bounded window: the key does not expire.
    await async_holds_for(kept, TTL + 0.1, what="the permanent key kept")


async def test_reaper_follows_earlier_deadlines(store):
    """A short TTL put after a long one still expires on time."""
    watch = await store.watch("/t")
    await store.put("/t/long", 1, ttl=30)
    await asyncio.sleep(0.05)  # the reaper is now sleeping towards the 30 s deadline
    await store.put("/t/short", 2, ttl=0.1)
    await drain(watch, 2)
    event = await next_event(watch, timeout=1.0)
    assert (event.kind, event.key) == (DELETE, "/t/short")


# -- CAS and ids -----------------------------------------------------------------------------

async def test_compare_and_swap(store):
    assert await store.compare_and_swap("/l", None, "a") is True
    v = (await store.get_entry("/l")).version
    assert await store.compare_and_swap("/l", None, "b") is False
    assert await store.compare_and_swap("/l", v + 1, "b") is False
    assert await store.get("/l") == "a"
    assert await store.compare_and_swap("/l", v, "b", ttl=TTL) is True
    entry = await store.get_entry("/l")
    assert entry.value == "b" and entry.version > v and entry.expires_at is not None
    assert await store.compare_and_swap("/l", v, "c") is False
    with pytest.raises(TypeError):
        await store.compare_and_swap("/l", "1", "c")
    await asyncio.sleep(TTL + 0.05)
    assert await store.compare_and_swap("/l", entry.version, "d") is False
    assert await store.compare_and_swap("/l", None, "e") is True  # expired counts as absent


async def test_put_many_if_writes_only_under_the_guards_value(store):
    """A fencing token: the writer holding epoch 1 writes; once another raised the epoch,
    the same write changes nothing, and a watch sees only what was written."""
    assert await store.allocate_id("/t/epoch") == 1
    watch = await store.watch("/t/seg/")
    try:
        assert await store.put_many_if({"/t/seg/1": {"a": 1}, "/t/seg/cur": 1},
                                       "/t/epoch", 1) is True
        assert await store.get("/t/seg/1") == {"a": 1}
        assert await store.allocate_id("/t/epoch") == 2
        assert await store.put_many_if({"/t/seg/2": {"b": 2}, "/t/seg/cur": 2},
                                       "/t/epoch", 1, durable=False) is False
        assert await store.get("/t/seg/2") is None and await store.get("/t/seg/cur") == 1
        assert await store.put_many_if({"/t/seg/2": {"b": 3}}, "/t/epoch", 2) is True
        assert await store.put_many_if({"/x": 1}, "/no/such/key", 1) is False
        events = []
        async with asyncio.timeout(5):
            async for event in watch:
                events.append((event.key, event.value))
                if len(events) == 3:
                    break
        assert events == [("/t/seg/1", {"a": 1}), ("/t/seg/cur", 1), ("/t/seg/2", {"b": 3})]
    finally:
        watch.close()


async def test_concurrent_cas_exactly_one_wins(store):
    results = await asyncio.gather(*(store.compare_and_swap("/leader", None, i)
                                     for i in range(50)))
    assert results.count(True) == 1
    assert await store.get("/leader") == results.index(True)


async def test_cas_increment_loop_loses_no_update(store):
    await store.put("/n", 0)

    async def increment():
        while True:
            entry = await store.get_entry("/n")
            await asyncio.sleep(0)  # let the others interleave between read and write
            if await store.compare_and_swap("/n", entry.version, entry.value + 1):
                return

    await asyncio.gather(*(increment() for _ in range(20)))
    assert await store.get("/n") == 20


async def test_allocate_id_strictly_increasing(store):
    ids = await asyncio.gather(*(store.allocate_id("/schemas/_global/next_schema_id")
                                 for _ in range(100)))
    assert sorted(ids) == list(range(1, 101))
    assert await store.allocate_id("/schemas/_global/next_schema_id") == 101
    assert await store.get("/schemas/_global/next_schema_id") == 101
    assert await store.allocate_id("/other") == 1


async def test_allocate_id_rejects_non_integer_counter(store):
    await store.put("/bad", "7")
    with pytest.raises(MetadataError):
        await store.allocate_id("/bad")
    assert await store.get("/bad") == "7"


# -- embedded store: restart, durability, exclusivity ----------------------------------------

async def test_embedded_reopen_keeps_data_versions_and_revision(tmp_path):
    path = tmp_path / "metadata"
    async with await EmbeddedStore.open(path) as s:
        await s.put("/a", {"x": [1, None]})
        await s.put("/b", None)
        await s.put("/z", 1)
        await s.delete("/z")  # the newest revision belongs to a deleted key
        entry_a = await s.get_entry("/a")
        revision = s.revision
    async with await EmbeddedStore.open(path) as s:
        assert await s.get_entry("/a") == entry_a
        assert (await s.get_entry("/b")).value is None
        assert await s.keys("/") == ["/a", "/b"]
        assert s.revision == revision
        assert await s.put("/z", 2) == revision + 1  # versions never go backwards


async def test_embedded_allocate_id_continues_after_reopen(tmp_path):
    path = tmp_path / "metadata"
    async with await EmbeddedStore.open(path) as s:
        ids = [await s.allocate_id("/ids") for _ in range(5)]
    async with await EmbeddedStore.open(path) as s:
        assert await s.allocate_id("/ids") == ids[-1] + 1


async def test_embedded_ttl_across_restart(tmp_path):
    path = tmp_path / "metadata"
    async with await EmbeddedStore.open(path) as s:
        await s.put("/t/short", 1, ttl=TTL)
        await s.put("/t/long", 2, ttl=60)
        await s.put("/t/perm", 3)
        long_expiry = (await s.get_entry("/t/long")).expires_at
    await asyncio.sleep(TTL + 0.05)
    async with await EmbeddedStore.open(path) as s:
        watch = await s.watch("/t")
        assert await s.keys("/t") == ["/t/long", "/t/perm"]
        assert (await s.get_entry("/t/long")).expires_at == long_expiry
        await assert_no_event(watch)  # expiries that happened while closed are not replayed


async def test_embedded_store_is_exclusive(tmp_path):
    path = tmp_path / "metadata"
    async with await EmbeddedStore.open(path):
        with pytest.raises(StoreLocked):
            EmbeddedStore(path)
    async with await EmbeddedStore.open(path):
        pass


CHILD = r"""
import asyncio, sys
from danube.metadata import EmbeddedStore

async def main():
    store = await EmbeddedStore.open(sys.argv[1])
    i = 0
    while True:
        await store.put(f"/acked/{i:06d}", {"i": i})
        print(i, flush=True)
        i += 1

asyncio.run(main())
"""


def test_embedded_acknowledged_put_survives_sigkill(tmp_path):
    path = tmp_path / "metadata"
    last = -1
    with KilledChild(CHILD, path) as child:
        while last < 25:
            last = int(child.line())
        child.sigkill()
    assert child.returncode == -signal.SIGKILL

    async def check():
        async with await EmbeddedStore.open(path) as s:
            scanned = dict(await s.scan("/acked"))
        for i in range(last + 1):
            assert scanned[f"/acked/{i:06d}"] == {"i": i}

    asyncio.run(check())
