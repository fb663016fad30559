"""danube.storage.wal: what a rotation costs the event loop and the appends waiting for a sync.

``WAL.rotate()`` (the tiered uploader seals the active segment with it every upload interval)
is made by the sync worker between two syncs, with what is pending written in the executor,
so the loop never waits for a sync in flight; and the checkpoint that records the new segment
is written after the sync job that acknowledges appends, not inside it. Neither may weaken
recovery: a process killed right after acknowledgements whose checkpoint never got written
still recovers every acknowledged message."""

import asyncio
import os
import threading
import time

import pytest

from danube.storage import WAL, WALConfig
from danube.storage.wal import group_commit as wal_module
from danube.storage.checkpoint import read_checkpoint
from killed_child import KilledChild
from waiting import async_holds_for, async_wait_for



def _file_frames(path):
    from danube.storage._walframes import scan_frames
    with open(path, "rb") as f:
        data = f.read()
    offsets, _, _, _ = scan_frames(data)
    return offsets.tolist()


async def _ticks_while(held, stop: asyncio.Event) -> int:
    """How often the loop ran this task (1 ms sleeps) while `held()` was true."""
    ticks = 0
    while not stop.is_set():
        await asyncio.sleep(0.001)
        ticks += held()
    return ticks


async def test_rotate_does_not_block_the_loop_on_a_sync_in_flight(tmp_path, monkeypatch):
    release, entered, returned = threading.Event(), threading.Event(), threading.Event()
    real = wal_module._fdatasync

    def held(fd):
        entered.set()
        release.wait(5)
        returned.set()
        real(fd)

    monkeypatch.setattr(wal_module, "_DEFER_MIN", 0)      # appends go to the sync job
    wal = await WAL.open(tmp_path, WALConfig(durability="always", cache_capacity=0))
    try:
        wal.append([b"x" * 100] * 10)
        await wal.sync_to(9)
        monkeypatch.setattr(wal_module, "_fdatasync", held)
        wal.append([b"a" * 1000] * 10)                    # a job takes these, then waits
        assert await asyncio.to_thread(entered.wait, 15), "the sync job never started"
        assert wal._commit._inflight is not None
        wal.append([b"b" * 1000] * 10)                    # pending behind it
        stop = asyncio.Event()
        ticker = asyncio.create_task(_ticks_while(lambda: not returned.is_set(), stop))
        rotating = asyncio.create_task(wal.rotate())
        # It waits for the worker (watched over a bounded window) ...
        await async_holds_for(lambda: not rotating.done(), 0.2,
                              what="rotate() waiting for the sync in flight")
        stop.set()
        # ... without holding the loop: the loop ran other tasks while the sync was still
        # held. A rotate() that blocked the loop until the sync returned would leave none.
        assert await ticker > 0
        assert not returned.is_set()
        release.set()
        info = await asyncio.wait_for(rotating, 5)
        assert (info.first_offset, info.last_offset) == (0, 29)
        assert _file_frames(info.path) == list(range(30))
        wal.append([b"c"])
        assert await wal.sync_to(30) == 30
    finally:
        release.set()
        await wal.close()
    wal = await WAL.open(tmp_path, WALConfig(durability="always", validate_sealed="open"))
    try:
        assert [o for o, _ in wal.read(0, 100)] == list(range(31))
    finally:
        await wal.close()


async def test_rotate_of_an_empty_segment_and_after_close(tmp_path):
    wal = await WAL.open(tmp_path, WALConfig(durability="always"))
    assert await wal.rotate() is None
    wal.append([b"m"])
    rotating = asyncio.create_task(wal.rotate())
    info = await rotating
    assert (info.first_offset, info.last_offset) == (0, 0)
    assert await wal.rotate() is None                    # the new segment is empty
    await wal.close()
    with pytest.raises(Exception):
        await wal.rotate()


async def test_acknowledgements_do_not_wait_for_the_checkpoint(tmp_path, monkeypatch):
    release = threading.Event()
    written = []
    real = wal_module.write_checkpoint

    def held(directory, body, *durable):
        release.wait(60)
        real(directory, body, *durable)
        written.append(body)

    monkeypatch.setattr(wal_module, "write_checkpoint", held)
    wal = await WAL.open(tmp_path, WALConfig(durability="always"))
    try:
        await wal.append_durable([b"a"] * 5)
        t = time.perf_counter()
        info = await asyncio.wait_for(wal.rotate(), 30)   # sealed and synced ...
        first, last = await asyncio.wait_for(wal.append_durable([b"b"] * 5), 30)
        # ... with the checkpoint held (for 60 s: waiting for it would take that long)
        assert time.perf_counter() - t < 30
        assert (info.last_offset, first, last) == (4, 5, 9)
        assert wal.durable_offset == 9 and not written
        release.set()
        await async_wait_for(lambda: written, what="the held checkpoint to be written")
        assert [s["name"] for s in written[0]["segments"]] == [os.path.basename(info.path)]
    finally:
        release.set()
        await wal.close()
    ckpt = read_checkpoint(str(tmp_path))
    assert ckpt["next_offset"] == 10 and ckpt["segments"][0]["synced"] is True


CHILD = r"""
import asyncio, sys, threading
from danube.storage import WAL, WALConfig
from danube.storage.wal import group_commit as wal_module

never = threading.Event()

def no_checkpoint(directory, body, *durable):
    never.wait()        # the checkpoint of a rotation never reaches the disk

async def main():
    wal = await WAL.open(sys.argv[1], WALConfig(durability="always"))
    print("ready", flush=True)
    wal_module.write_checkpoint = no_checkpoint
    i = 0
    while True:
        first, last = await wal.append_durable([b"%d" % j for j in range(i, i + 7)])
        i = last + 1
        if i % 70 == 0:
            await wal.rotate()
        print(last, flush=True)

asyncio.run(main())
"""


def test_kill_before_the_checkpoint_loses_no_acknowledged_message(tmp_path):
    acked = -1
    with KilledChild(CHILD, tmp_path) as child:
        assert child.line().strip() == "ready"
        while acked < 700:
            acked = int(child.line())
        child.sigkill()
    names = sorted(n for n in os.listdir(tmp_path) if n.startswith("wal.0"))
    assert len(names) > 5                                 # it rotated, checkpoints or not

    async def check():
        wal = await WAL.open(tmp_path, WALConfig(durability="always", validate_sealed="open"))
        try:
            got = []
            while True:
                batch = wal.read(len(got), 1000)
                if not batch:
                    break
                got += batch
            assert len(got) >= acked + 1
            assert got[:acked + 1] == [(j, b"%d" % j) for j in range(acked + 1)]
        finally:
            await wal.close()

    asyncio.run(check())
