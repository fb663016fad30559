"""What only the etcd store promises, on a real etcd: a lost connection is retried with
backoff (and shows in ``available`` and the counters) so a call made while etcd restarts
still succeeds; a call to an etcd that stays down fails with MetadataUnavailable, not a
hang; watches resume after the restart without losing or repeating events; the key of a
writer that vanished without deleting it goes when its lease does; several endpoints are
tried in turn; stored layout is what docs/cluster.md says (plain JSON, or the envelope for a
leased key); the writes a cluster broker repeats every second cost no call that cannot
succeed."""

import asyncio
import base64
import json
import threading
import time
import urllib.request

import pytest

from danube.metadata import DELETE, PUT, MetadataUnavailable
from danube.metadata.etcd import EtcdStore
from ports import free_port
from waiting import async_wait_for


def raw_get(etcd, key):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    request = urllib.request.Request(f"http://{etcd.endpoint}/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        kvs = json.load(resp).get("kvs", [])
    return [(base64.b64decode(kv["value"]).decode(), int(kv.get("lease", 0))) for kv in kvs]


@pytest.fixture
async def etcd(etcd_server):
    etcd_server.start()
    etcd_server.wipe()
    yield etcd_server
    etcd_server.start()


async def test_stored_layout(etcd):
    async with await EtcdStore.open([etcd.endpoint]) as store:
        await store.put("/plain", {"a": [1, None]})
        await store.put("/leased", "v", ttl=5)
    assert raw_get(etcd, "/plain") == [('{"a":[1,null]}', 0)]
    [(text, lease)] = raw_get(etcd, "/leased")
    envelope = json.loads(text)
    assert lease != 0 and envelope["v"] == "v" and 0 < envelope["x"] - time.time() <= 5


async def test_call_during_restart_is_retried(etcd):
    async with await EtcdStore.open([etcd.endpoint], retry_for=30) as store:
        await store.put("/r/a", 1)
        etcd.kill()
        restarter = threading.Timer(1.0, etcd.start)
        restarter.start()
        try:
            version = await store.put("/r/b", 2)      # sent while etcd is down
        finally:
            restarter.join()
        assert (await store.get_entry("/r/b")).version == version
        assert await store.get("/r/a") == 1
        assert store.available and store.conn.retries_total > 0
        assert store.conn.failures_total > 0 and "refused" in store.conn.last_error


async def test_etcd_down_fails_cleanly(etcd):
    store = await EtcdStore.open([etcd.endpoint], retry_for=0.5)
    try:
        etcd.kill()
        started = time.monotonic()
        with pytest.raises(MetadataUnavailable, match="unreachable"):
            await store.get("/x")
        # retry_for=0.5: generous for a slow machine, far below a hang's pytest timeout.
        assert time.monotonic() - started < 30
        assert not store.available
    finally:
        await store.close()


async def test_watch_resumes_after_restart(etcd):
    async with await EtcdStore.open([etcd.endpoint], retry_for=30) as writer, \
            await EtcdStore.open([etcd.endpoint], retry_for=30) as reader:
        watch = await reader.watch("/w")
        await writer.put("/w/1", 1)
        assert (await asyncio.wait_for(anext(watch), 5)).key == "/w/1"
        etcd.kill()
        etcd.start()
        for i in range(2, 6):
            await writer.put(f"/w/{i}", i)
        events = [await asyncio.wait_for(anext(watch), 10) for _ in range(4)]
        assert [(e.kind, e.value) for e in events] == [(PUT, i) for i in range(2, 6)]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(watch), 0.3)


async def test_lease_removes_key_of_vanished_writer(etcd):
    """A writer that dies cannot reap its own keys; etcd's lease does."""
    async with await EtcdStore.open([etcd.endpoint]) as observer:
        watch = await observer.watch("/cluster/brokers")
        writer = await EtcdStore.open([etcd.endpoint])
        await writer.put("/cluster/brokers/1/broker_addr", "h:1", ttl=1)
        writer._reaper.cancel()        # as if killed: nothing of it deletes the key
        assert (await asyncio.wait_for(anext(watch), 5)).kind == PUT
        started = time.monotonic()
        # No upper bound but the wait's: a lease that never expires never deletes the key.
        event = await asyncio.wait_for(anext(watch), 30)
        assert (event.kind, event.key) == (DELETE, "/cluster/brokers/1/broker_addr")
        assert 0.5 < time.monotonic() - started
        await writer.close()


async def test_dead_endpoint_is_skipped(etcd):
    dead = f"127.0.0.1:{free_port()}"
    async with await EtcdStore.open([dead, etcd.endpoint]) as store:
        await store.put("/e", 1)
        assert await store.get("/e") == 1
        watch = await store.watch("/e")
        await store.put("/e", 2)
        assert (await asyncio.wait_for(anext(watch), 5)).value == 2


def count_calls(store):
    """The etcd gateway paths ``store`` calls, in order (the calls still go to etcd)."""
    paths = []
    call = store.conn.call

    async def counted(path, body, **kwargs):
        paths.append(path)
        return await call(path, body, **kwargs)
    store.conn.call = counted
    return paths


async def test_a_key_rewritten_before_its_deadline_is_not_reaped_in_between(etcd):
    """A registration or load report is rewritten every second with a longer TTL: the
    deadline of each write but the last is passed without a call (its guarded delete could
    only fail); the last write's deadline still deletes the key, with an event."""
    async with await EtcdStore.open([etcd.endpoint]) as store:
        watch = await store.watch("/cluster/load")
        paths = count_calls(store)
        for i in range(8):      # all before the first write's deadline, on any machine
            await store.put("/cluster/load/1", i, ttl=2)
            assert (await asyncio.wait_for(anext(watch), 5)).value == i
        await async_wait_for(lambda: not raw_get(etcd, "/cluster/load/1"),
                             what="the last write's deadline to delete the key")
        event = await asyncio.wait_for(anext(watch), 5)
        assert (event.kind, event.key) == (DELETE, "/cluster/load/1")
        # Each put: a lease and a transaction; then the one guarded delete.
        assert paths == ["lease/grant", "kv/txn"] * 8 + ["kv/txn"], paths


async def test_a_swap_that_cannot_succeed_takes_no_lease(etcd):
    """A follower tries for the leader key every third of its TTL: while it is held, that
    costs one read, not a lease (which etcd would have to expire) and a transaction."""
    async with await EtcdStore.open([etcd.endpoint]) as leader, \
            await EtcdStore.open([etcd.endpoint]) as follower:
        assert await leader.compare_and_swap("/cluster/leader", None, "1", ttl=5)
        held = (await leader.get_entry("/cluster/leader")).version
        paths = count_calls(follower)
        assert not await follower.compare_and_swap("/cluster/leader", None, "2", ttl=5)
        assert not await follower.compare_and_swap("/cluster/leader", held + 1, "2", ttl=5)
        assert paths == ["kv/range", "kv/range"], paths
        # Still a swap when it can succeed: the key's version, then a leased write.
        assert await follower.compare_and_swap("/cluster/leader", held, "2", ttl=5)
        assert paths[2:] == ["kv/range", "lease/grant", "kv/txn"], paths
        [(text, lease)] = raw_get(etcd, "/cluster/leader")
        assert json.loads(text)["v"] == "2" and lease != 0
        await leader.delete("/cluster/leader")
        assert await follower.compare_and_swap("/cluster/leader", None, "2", ttl=5)


def test_bad_endpoint_is_a_clear_error():
    for bad in ["nohost", "h:port", "ftp://h:1", "h:70000"]:
        with pytest.raises(ValueError, match="etcd endpoint"):
            EtcdStore([bad])
    with pytest.raises(ValueError, match="at least one"):
        EtcdStore([])
