"""The embedded store's writer thread (danube.metadata._writer): writes leave the event loop,
writes queued while a commit runs share the next one (group commit), one failing write does
not fail its neighbours, results and revisions are exactly those of serial execution, close()
lets pending writes finish, and an acknowledged write survives SIGKILL with many writers in
flight. Plus put_many, on both in-process stores."""

import asyncio
import re
import sqlite3
import subprocess
import sys
import threading

import pytest

from danube.metadata import (DELETE, PUT, EmbeddedStore, MemoryStore, MetadataError,
                             MetadataUnavailable, WatchEvent)
from killed_child import KilledChild
from waiting import async_holds_for


@pytest.fixture
async def embedded(tmp_path):
    s = await EmbeddedStore.open(tmp_path / "metadata")
    yield s
    s._writer.resume()
    await s.close()


async def settle():
    """Let submitted calls reach the writer's queue."""
    for _ in range(5):
        await asyncio.sleep(0)


# -- put_many ----------------------------------------------------------------------------

async def test_put_many_is_one_revision_and_one_event_each(store):
    watch = await store.watch("/p")
    rev = await store.put_many({"/p/a": 1, "/p/b": {"x": [2]}})
    assert rev == store.revision
    assert (await store.get_entry("/p/a")).version == rev
    assert (await store.get_entry("/p/b")).version == rev
    events = [await asyncio.wait_for(anext(watch), 2) for _ in range(2)]
    assert events == [WatchEvent(PUT, "/p/a", 1, rev), WatchEvent(PUT, "/p/b", {"x": [2]}, rev)]
    rev2 = await store.put_many([("/p/a", 3)])
    assert rev2 == rev + 1
    assert await store.put_many([]) == rev2
    entry = None
    await store.put_many({"/p/t": 1}, ttl=0.2)
    entry = await store.get_entry("/p/t")
    assert entry.expires_at is not None


async def test_delete_many_is_one_revision(store):
    await store.put_many({"/dm/a": 1, "/dm/b": 2, "/dm/c": 3})
    watch = await store.watch("/dm")
    assert await store.delete_many(["/dm/a", "/dm/missing", "/dm/c", "/dm/a"]) == 2
    events = [await asyncio.wait_for(anext(watch), 2) for _ in range(2)]
    assert [(e.kind, e.key) for e in events] == [(DELETE, "/dm/a"), (DELETE, "/dm/c")]
    assert events[0].version == events[1].version
    assert await store.keys("/dm") == ["/dm/b"]
    assert await store.delete_many([]) == 0
    assert await store.delete_many(["/dm/missing"]) == 0
    with pytest.raises(ValueError):
        await store.delete_many(["no-slash"])


async def test_put_many_is_all_or_nothing(store):
    with pytest.raises(ValueError, match="more than once"):
        await store.put_many([("/d/a", 1), ("/d/a", 2)])
    with pytest.raises(TypeError):
        await store.put_many({"/d/a": 1, "/d/b": object()})
    with pytest.raises(ValueError):
        await store.put_many({"/d/a": 1, "bad-key": 2})
    assert await store.keys("/d") == []


# -- off the loop, group commit ------------------------------------------------------------

async def test_writes_run_in_the_writer_thread(embedded):
    seen = []

    def op(txn):
        seen.append(threading.get_ident())
        return txn.put("/t", '"x"', None)

    await embedded._execute(op)
    assert seen and seen[0] != threading.get_ident()
    assert await embedded.get("/t") == "x"


async def test_loop_runs_while_a_commit_is_held(embedded):
    embedded._writer.pause()                # as if the commit's fsync took long
    put = asyncio.create_task(embedded.put("/slow", 1))
    ticks = 0
    for _ in range(20):
        await asyncio.sleep(0.001)
        ticks += 1
    assert ticks == 20 and not put.done()
    embedded._writer.resume()
    assert await asyncio.wait_for(put, 5) >= 1


async def test_writes_queued_together_share_one_commit(embedded):
    watch = await embedded.watch("/g")
    before = embedded.write_stats
    embedded._writer.pause()
    tasks = [asyncio.create_task(embedded.put(f"/g/{i:03d}", i)) for i in range(200)]
    await settle()
    embedded._writer.resume()
    versions = await asyncio.gather(*tasks)
    after = embedded.write_stats
    assert after["operations"] - before["operations"] == 200
    assert after["commits"] - before["commits"] == 1
    # revisions as serial execution in submission order: consecutive, one each
    assert versions == list(range(versions[0], versions[0] + 200))
    events = [await asyncio.wait_for(anext(watch), 2) for _ in range(200)]
    assert [e.version for e in events] == versions
    assert [e.key for e in events] == [f"/g/{i:03d}" for i in range(200)]
    assert embedded.revision == versions[-1]


async def test_batch_results_equal_serial_execution(tmp_path):
    """The same calls, submitted at once to the embedded store (one batch) and awaited one
    by one on the memory store, give the same results, versions and final state."""
    def calls(s):
        return [
            lambda: s.put("/k/a", 1), lambda: s.put("/k/b", 2), lambda: s.allocate_id("/k/n"),
            lambda: s.compare_and_swap("/k/a", 1, "a2"), lambda: s.compare_and_swap("/k/a", 1, "x"),
            lambda: s.delete("/k/b"), lambda: s.delete("/k/b"), lambda: s.allocate_id("/k/n"),
            lambda: s.put_many({"/k/c": 3, "/k/d/e": 4}), lambda: s.compare_and_swap("/k/z", None, 0),
            lambda: s.delete_prefix("/k/d"), lambda: s.allocate_id("/k/n"), lambda: s.put("/k/a", 5),
        ]

    mem = await MemoryStore.open()
    serial = [await call() for call in calls(mem)]
    emb = await EmbeddedStore.open(tmp_path / "m")
    try:
        before = emb.write_stats["commits"]
        emb._writer.pause()
        tasks = [asyncio.create_task(call()) for call in calls(emb)]
        await settle()
        emb._writer.resume()
        batched = await asyncio.gather(*tasks)
        assert emb.write_stats["commits"] == before + 1
        assert batched == serial
        for key in await mem.keys("/"):
            assert await emb.get_entry(key) == await mem.get_entry(key)
        assert await emb.keys("/") == await mem.keys("/")
        assert emb.revision == mem.revision
    finally:
        await emb.close()
        await mem.close()


async def test_a_failing_write_does_not_fail_its_neighbours(embedded):
    await embedded.put("/bad", "not a number")
    embedded._writer.pause()
    a = asyncio.create_task(embedded.put("/e/a", 1))
    bad = asyncio.create_task(embedded.allocate_id("/bad"))
    dup = asyncio.create_task(embedded.compare_and_swap("/e/a", 12345, "no"))
    b = asyncio.create_task(embedded.put("/e/b", 2))
    n = asyncio.create_task(embedded.allocate_id("/e/n"))
    await settle()
    before = embedded.write_stats["commits"]
    embedded._writer.resume()
    va = await a
    with pytest.raises(MetadataError, match="not a non-negative integer"):
        await bad
    assert await dup is False
    vb = await b
    assert vb == va + 1, "the failed operation takes no revision"
    assert await n == 1
    assert embedded.write_stats["commits"] == before + 1
    assert await embedded.get("/bad") == "not a number"
    assert await embedded.get("/e/a") == 1 and await embedded.get("/e/b") == 2


class _FailingRows:
    """The writer's row primitives, failing writes of one key the way a SQLite error in
    the middle of an operation would (a fault that cannot be produced on demand)."""

    def __init__(self, rows, key):
        self._rows, self._key = rows, key

    def __getattr__(self, name):
        return getattr(self._rows, name)

    def _set(self, key, *args):
        self._rows._set(key, *args)
        if key == self._key:
            raise sqlite3.OperationalError("simulated failure after a partial write")


async def test_a_sqlite_error_in_one_write_is_rolled_back_alone(embedded):
    writer = embedded._writer
    writer._rows = _FailingRows(writer._rows, "/s/boom")
    writer.pause()
    a = asyncio.create_task(embedded.put("/s/a", 1))
    boom = asyncio.create_task(embedded.put_many({"/s/x": 0, "/s/boom": 1}))
    b = asyncio.create_task(embedded.put("/s/b", 2))
    await settle()
    writer.resume()
    va = await a
    with pytest.raises(MetadataUnavailable, match="simulated"):
        await boom
    assert await b == va + 1
    assert await embedded.keys("/s") == ["/s/a", "/s/b"]     # /s/x was rolled back too


class _FailingCommit:
    """The writer's connection, failing its next COMMIT as a full or failing disk would."""

    def __init__(self, conn):
        self._conn = conn
        self.armed = True

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, sql, *args):
        if sql == "COMMIT" and self.armed:
            self.armed = False
            raise sqlite3.OperationalError("disk I/O error (simulated)")
        return self._conn.execute(sql, *args)


async def test_a_failed_commit_fails_the_batch_and_keeps_revisions(embedded):
    v0 = await embedded.put("/c/first", 0)
    writer = embedded._writer
    writer._conn = _FailingCommit(writer._conn)
    watch = await embedded.watch("/c")
    writer.pause()
    tasks = [asyncio.create_task(embedded.put(f"/c/{i}", i)) for i in range(5)]
    await settle()
    writer.resume()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, MetadataUnavailable) for r in results), results
    assert len({id(r) for r in results}) == 5, "each caller gets its own exception"
    assert await embedded.keys("/c") == ["/c/first"]
    assert embedded.revision == v0
    # the store goes on, with no revision lost or reused, and nothing was announced
    assert await embedded.put("/c/next", 1) == v0 + 1
    event = await asyncio.wait_for(anext(watch), 2)
    assert (event.key, event.version) == ("/c/next", v0 + 1)


# -- close ---------------------------------------------------------------------------------

async def test_close_lets_pending_writes_finish(tmp_path):
    path = tmp_path / "metadata"
    s = await EmbeddedStore.open(path)
    watch = await s.watch("/w")
    s._writer.pause()
    tasks = [asyncio.create_task(s.put(f"/w/{i:02d}", i)) for i in range(30)]
    await settle()
    closing = asyncio.create_task(s.close())
    # close() waits for the held writes (watched over a bounded window).
    await async_holds_for(lambda: not closing.done(), 0.05, what="close() waiting")
    with pytest.raises(MetadataUnavailable):
        await s.put("/w/late", 1)            # refused at once, while the others finish
    s._writer.resume()
    versions = await asyncio.gather(*tasks)
    await asyncio.wait_for(closing, 5)
    assert len(set(versions)) == 30
    events = []
    while True:                               # buffered events, then the end of the watch
        try:
            events.append(await asyncio.wait_for(anext(watch), 2))
        except MetadataUnavailable:
            break
    assert [e.key for e in events] == [f"/w/{i:02d}" for i in range(30)]
    assert not s._writer._thread.is_alive()
    async with await EmbeddedStore.open(path) as s2:
        assert await s2.scan("/w") == [(f"/w/{i:02d}", i) for i in range(30)]
        assert s2.revision == versions[-1]


async def test_close_without_any_write(tmp_path):
    s = EmbeddedStore(tmp_path / "m")
    await s.close()
    assert not s._writer.started
    async with await EmbeddedStore.open(tmp_path / "m") as s2:      # the lock was released
        assert await s2.keys("/") == []


async def test_delete_events_after_batched_deletes(embedded):
    await embedded.put_many({"/x/a": 1, "/x/b": 2, "/y": 3})
    watch = await embedded.watch("/")
    embedded._writer.pause()
    t1 = asyncio.create_task(embedded.delete_prefix("/x"))
    t2 = asyncio.create_task(embedded.delete("/y"))
    await settle()
    embedded._writer.resume()
    assert await t1 == 2 and await t2 is True
    events = [await asyncio.wait_for(anext(watch), 2) for _ in range(3)]
    assert [(e.kind, e.key) for e in events] == [(DELETE, "/x/a"), (DELETE, "/x/b"),
                                                 (DELETE, "/y")]
    assert events[0].version == events[1].version == events[2].version - 1


# -- writes that skip the fsync (durable=False) -------------------------------------------------

def committed(store_or_stats):
    stats = getattr(store_or_stats, "write_stats", store_or_stats)
    return stats["commits"], stats["synced_commits"]


async def test_non_durable_writes_are_synced_by_the_next_durable_one(embedded):
    await embedded.sync()
    stats = embedded.write_stats
    await embedded.put_many({"/n/a": 1}, durable=False)
    await embedded.put_many({"/n/b": 2}, durable=False)
    after = embedded.write_stats
    assert after["commits"] == stats["commits"] + 2
    assert after["synced_commits"] == stats["synced_commits"], "no fsync for either"
    assert await embedded.get("/n/a") == 1 and await embedded.get("/n/b") == 2
    await embedded.sync()
    synced = embedded.write_stats
    assert synced["synced_commits"] == after["synced_commits"] + 1, "sync() is one commit"
    await embedded.sync()
    assert committed(embedded) == committed(synced), "nothing left to sync: no commit"
    await embedded.put_many({"/n/c": 3}, durable=False)
    await embedded.put("/n/d", 4)
    last = embedded.write_stats
    assert last["synced_commits"] == synced["synced_commits"] + 1
    await embedded.sync()
    assert committed(embedded) == committed(last), "the durable put synced what came before"


async def test_a_batch_with_one_durable_write_is_synced(embedded):
    await embedded.sync()
    stats = embedded.write_stats
    embedded._writer.pause()
    tasks = [asyncio.create_task(embedded.put_many({f"/m/{i}": i}, durable=False))
             for i in range(5)]
    tasks.append(asyncio.create_task(embedded.put("/m/durable", 1)))
    await settle()
    embedded._writer.resume()
    await asyncio.gather(*tasks)
    after = embedded.write_stats
    assert after["commits"] - stats["commits"] == 1
    assert after["synced_commits"] - stats["synced_commits"] == 1


async def test_sync_on_the_memory_store_returns():
    async with await MemoryStore.open() as mem:
        await mem.put_many({"/a": 1}, durable=False)
        await mem.sync()
        assert await mem.get("/a") == 1


async def test_a_reopened_store_syncs_what_a_killed_process_left(tmp_path):
    """A process killed after a non-durable write leaves it unsynced in the page cache;
    the next process's first sync() must cover it, though it wrote nothing itself."""
    path = tmp_path / "metadata"
    async with await EmbeddedStore.open(path) as s:
        before = s.write_stats["synced_commits"]
        await s.sync()
        assert s.write_stats["synced_commits"] == before, "the open already synced"
    # (the open's own purge transaction is the first durable batch: it syncs)
    async with await EmbeddedStore.open(path) as s:
        assert s.write_stats["synced_commits"] == 1


FSYNC_CHILD = r"""
import asyncio, os, sys
from danube.metadata import EmbeddedStore

def mark(text):
    os.write(2, f"@@ {text}\n".encode())

async def main():
    s = await EmbeddedStore.open(sys.argv[1])
    mark("non-durable")
    for i in range(5):
        await s.put_many({f"/a/{i}": i}, durable=False)
    mark("sync")
    await s.sync()
    mark("sync-again")
    await s.sync()
    mark("durable")
    await s.put("/b", 1)
    mark("end")
    os._exit(0)

asyncio.run(main())
"""


def test_only_durable_commits_fsync(tmp_path):
    """Counted by the kernel, not by our counters: strace sees the writer thread's
    fsync/fdatasync calls between the child's markers."""
    import shutil
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed: run `bash bin/test` (it installs it with "
                    "`apt-get install strace`)", pytrace=False)
    trace = tmp_path / "trace"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,write",
         "-e", "signal=none", sys.executable, "-P", "-c", FSYNC_CHILD,
         str(tmp_path / "metadata")],
        capture_output=True, text=True, timeout=60)
    # No ptrace (a container without CAP_SYS_PTRACE, or a Yama setting) fails rather than
    # skips: the fsync count is only checked here, so a skip would hide a regression.
    if "PTRACE_TRACEME" in proc.stderr or "ptrace" in proc.stderr.lower():
        pytest.fail(f"strace cannot trace here ({proc.stderr.splitlines()[0]}): run the tests "
                    "where ptrace is permitted (e.g. `docker run --cap-add SYS_PTRACE`)",
                    pytrace=False)
    assert proc.returncode == 0, proc.stderr
    syncs, section = {}, None
    for line in trace.read_text().splitlines():
        marker = re.search(r'write\(2, "@@ ([a-z-]+)', line)
        if marker:
            section = marker.group(1)
            syncs[section] = 0
        elif section is not None and re.search(r"\b(fsync|fdatasync)\(", line):
            syncs[section] += 1
    assert syncs == {"non-durable": 0, "sync": 1, "sync-again": 0, "durable": 1, "end": 0}, \
        trace.read_text()


# -- durability with many writers in flight --------------------------------------------------

CHILD = r"""
import asyncio, sys
from danube.metadata import EmbeddedStore

async def main():
    store = await EmbeddedStore.open(sys.argv[1])

    async def writer(w):
        i = 0
        while True:
            if i % 3 == 2:
                # Half the writers' pairs skip the fsync: a kill must not lose them either.
                await store.put_many({f"/acked/{w}/{i:06d}": i, f"/acked/{w}/{i:06d}/x": i},
                                     durable=w % 2 == 0)
            else:
                await store.put(f"/acked/{w}/{i:06d}", i)
            print(w, i, flush=True)
            i += 1

    await asyncio.gather(*(writer(w) for w in range(8)))

asyncio.run(main())
"""


def test_acknowledged_writes_survive_sigkill_under_group_commit(tmp_path):
    path = tmp_path / "metadata"
    acked = {}
    with KilledChild(CHILD, path) as child:
        while sum(acked.values()) < 400:
            w, i = map(int, child.line().split())
            acked[w] = i + 1
        child.sigkill()

    async def check():
        async with await EmbeddedStore.open(path) as s:
            scanned = dict(await s.scan("/acked"))
            stats = s.write_stats
        for w, n in acked.items():
            for i in range(n):
                assert scanned[f"/acked/{w}/{i:06d}"] == i
                if i % 3 == 2:
                    assert scanned[f"/acked/{w}/{i:06d}/x"] == i
        # what survives is a prefix per writer: no hole before the last acknowledged write
        for w in acked:
            got = sorted(int(k.split("/")[3]) for k in scanned
                         if k.startswith(f"/acked/{w}/") and k.count("/") == 3)
            assert got == list(range(len(got)))
        return stats

    asyncio.run(check())
