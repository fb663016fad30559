"""danube.storage.wal: appends, reads (cache and segments), rotation, retention, errors."""

import asyncio
import json
import os
import random

import numpy as np
import pytest

from danube.storage._walframes import MAX_PAYLOAD, SCAN_CLEAN, frame_size, scan_frames
from danube.storage import (OffsetTruncatedError, WAL, WALClosedError, WALConfig,
                            WALLockedError)

SMALL = dict(segment_max_bytes=4096, segment_initial_bytes=1024)


def cfg(**kw):
    return WALConfig(**{"durability": "none", **SMALL, **kw})


def payload(off):
    n = (off * 7919) % 301
    return bytes((off + i) % 251 + 1 for i in range(n))


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
async def opened():
    """``await opened(path, config, **kw)`` opens a WAL that is closed at teardown."""
    wals = []

    async def make(path, config=None, **kw):
        wal = await WAL.open(path, config or cfg(), **kw)
        wals.append(wal)
        return wal

    yield make
    for wal in wals:
        await wal.close()


async def fill(wal, n_batches, rnd, max_batch=20):
    """Append random batches of ``payload(offset)``; returns the expected log."""
    expect = []
    for _ in range(n_batches):
        first = wal.next_offset
        batch = [payload(first + i) for i in range(rnd.randint(1, max_batch))]
        assert wal.append(batch) == (first, first + len(batch) - 1)
        expect.extend(batch)
    return expect


def sealed_files_are_exact(wal):
    """A sealed file is its frames and nothing else: no zero tail."""
    for info in wal.segments()[:-1]:
        data = open(info.path, "rb").read()
        offsets, _, valid_end, status = scan_frames(data, 0, -1, info.first_offset)
        assert (len(data), valid_end, status) == (info.size, info.size, SCAN_CLEAN)
        assert offsets[-1] == info.last_offset


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("cache", [0, 16, 1024])
async def test_round_trip_across_rotations(tmp_path, opened, cache):
    wal = await opened(tmp_path, cfg(cache_capacity=cache))
    expect = await fill(wal, 150, random.Random(1))
    assert len(wal.segments()) > 20           # many rotations
    sealed_files_are_exact(wal)
    got = wal.read(0, max_messages=len(expect) + 10)
    assert got == list(enumerate(expect))
    # From every offset, a few messages (crossing segment boundaries and the cache edge).
    for off in range(len(expect)):
        assert wal.read(off, 3) == [(o, expect[o]) for o in range(off, min(off + 3, len(expect)))]
    assert wal.read(len(expect)) == [] and wal.read(len(expect) + 5) == []
    # Contiguous segments, named after their first offset.
    infos = wal.segments()
    for a, b in zip(infos, infos[1:]):
        assert b.first_offset == a.last_offset + 1
        assert os.path.basename(b.path) == f"wal.{b.first_offset:020d}.log"


async def test_cache_and_segment_reads_agree(tmp_path, opened):
    rnd = random.Random(2)
    a = await opened(tmp_path / "a", cfg(cache_capacity=0))
    b = await opened(tmp_path / "b", cfg(cache_capacity=200))
    for _ in range(100):
        batch = [payload(a.next_offset + i) for i in range(rnd.randint(1, 10))]
        assert a.append(batch) == b.append(batch)
    n = a.next_offset
    assert b._state.cache.first_offset == n - 200        # b serves the newest 200 from memory
    for _ in range(300):
        off = rnd.randrange(n)
        mm = rnd.randint(1, 50)
        mb = rnd.choice([None, 0, 1, 100, 1000, 5000])
        ra, rb = a.read(off, mm, mb), b.read(off, mm, mb)
        assert ra == rb
        assert ra[0] == (off, payload(off)) and len(ra) <= mm
        if mb is not None and len(ra) > 1:
            assert sum(len(p) for _, p in ra) <= mb
        if len(ra) < mm and off + len(ra) < n and mb is not None:
            # stopped by the byte limit: the next message would have gone over
            assert sum(len(p) for _, p in ra) + len(payload(off + len(ra))) > mb


async def test_max_bytes_spans_segments(tmp_path, opened):
    wal = await opened(tmp_path, cfg(cache_capacity=0))
    for i in range(100):
        wal.append([bytes([i + 1]) * 300])
    assert len(wal.segments()) > 5
    got = wal.read(0, 1000, max_bytes=3000)
    assert [o for o, _ in got] == list(range(10))
    assert wal.read(5, 1000, max_bytes=10) == [(5, bytes([6]) * 300)]   # first is exempt
    assert len(wal.read(0, 1000)) == 100


async def test_non_bytes_payloads(tmp_path, opened):
    wal = await opened(tmp_path)
    ba = bytearray(b"mutable")
    mv = memoryview(b"xxviewxx")[2:6]
    arr = np.arange(4, dtype=np.uint8)
    assert wal.append([ba, mv, arr, b""]) == (0, 3)
    ba[0:1] = b"M"                       # changing the source afterwards changes nothing
    want = [(0, b"mutable"), (1, b"view"), (2, bytes([0, 1, 2, 3])), (3, b"")]
    assert wal.read(0) == want
    wal._state.cache.reset(wal.next_offset)    # and the same from the segment
    assert wal.read(0) == want


async def test_empty_batch(tmp_path, opened):
    wal = await opened(tmp_path)
    assert wal.append([]) == (0, -1)
    assert wal.append([b"a"]) == (0, 0)
    assert wal.append(()) == (1, 0)
    assert await wal.append_durable([]) == (1, 0)


async def test_start_offset_for_empty_directory(tmp_path, opened):
    wal = await opened(tmp_path, start_offset=1000)
    assert (wal.first_offset, wal.next_offset) == (1000, 1000)
    assert wal.append([b"a", b"b"]) == (1000, 1001)
    assert wal.read(1000) == [(1000, b"a"), (1001, b"b")]
    with pytest.raises(OffsetTruncatedError):
        wal.read(999)
    assert os.path.exists(tmp_path / f"wal.{1000:020d}.log")


# ---------------------------------------------------------------- rotation

async def test_rotation_by_size(tmp_path, opened):
    wal = await opened(tmp_path, cfg(cache_capacity=0))
    f100 = frame_size(100)
    per_seg = 4096 // f100                             # 35 frames of 116 bytes
    wal.append([b"a" * 100] * (per_seg - 5))
    # A batch that does not fit the rest of the segment goes whole to a new one.
    first, last = wal.append([b"b" * 100] * 10)
    infos = wal.segments()
    assert len(infos) == 2
    assert (infos[0].last_offset, infos[1].first_offset) == (first - 1, first)
    assert infos[0].size == (per_seg - 5) * f100 == os.path.getsize(infos[0].path)
    # A single frame larger than a segment gets a segment of its own size.
    big = b"c" * 10000
    first, _ = wal.append([big])
    infos = wal.segments()
    assert infos[-1].first_offset == first and infos[-1].size == frame_size(10000)
    wal.append([b"d"])                                  # and the next append moves on
    infos = wal.segments()
    assert infos[-2].first_offset == first and infos[-2].last_offset == first
    assert os.path.getsize(infos[-2].path) == frame_size(10000)
    assert infos[-1].first_offset == first + 1
    # A batch bigger than a segment is split over full segments.
    before = len(infos)
    first, last = wal.append([b"e" * 100] * 100)
    infos = wal.segments()
    new = [i for i in infos[before - 1:] if i.last_offset >= first]
    assert len(new) >= 3
    assert all(i.size <= 4096 for i in new)
    assert new[-1].last_offset == last
    assert wal.read(first, 200) == [(o, b"e" * 100) for o in range(first, last + 1)]
    assert wal.read(0, 1)[0] == (0, b"a" * 100)
    sealed_files_are_exact(wal)


async def test_rotation_by_age(tmp_path, opened):
    clock = Clock()
    config = cfg(max_age_seconds=10, segment_max_bytes=1 << 20)
    wal = await opened(tmp_path, config, clock=clock)
    wal.append([b"a"])
    clock.t += 9
    wal.append([b"b"])
    assert len(wal.segments()) == 1
    clock.t += 2
    wal.append([b"c"])                       # the segment is 11 s old: sealed first
    infos = wal.segments()
    assert [(i.first_offset, i.last_offset) for i in infos] == [(0, 1), (2, 2)]
    assert infos[0].sealed_at == clock.t and infos[1].created_at == clock.t
    clock.t += 100
    assert await wal.rotate() is not None    # an idle segment can be sealed explicitly
    assert await wal.rotate() is None        # nothing to seal in an empty segment
    clock.t += 100
    wal.append([b"d"])                       # an empty segment never rotates by age
    assert len(wal.segments()) == 3
    # The active segment's age survives a restart (through the checkpoint).
    await wal.close()
    clock.t += 11
    wal = await opened(tmp_path, config, clock=clock)
    wal.append([b"e"])
    infos = wal.segments()
    assert [(i.first_offset, i.last_offset) for i in infos][-2:] == [(3, 3), (4, 4)]
    assert [p for _, p in wal.read(0)] == [b"a", b"b", b"c", b"d", b"e"]


# ---------------------------------------------------------------- waiting and errors

async def test_wait_for(tmp_path, opened):
    wal = await opened(tmp_path)
    assert await wal.wait_for(-1) == -1              # nothing to wait for
    got = []

    async def reader():
        nxt = 0
        while nxt < 6:
            await wal.wait_for(nxt)
            batch = wal.read(nxt)
            got.extend(batch)
            nxt = batch[-1][0] + 1

    tasks = [asyncio.create_task(reader()) for _ in range(3)]
    await asyncio.sleep(0)
    for i in range(3):
        wal.append([b"%d" % (2 * i), b"%d" % (2 * i + 1)])
        await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert sorted(got) == sorted([(i, b"%d" % i) for i in range(6)] * 3)
    # A waiter is woken with an error when the WAL closes; a cancelled waiter is harmless.
    t1 = asyncio.create_task(wal.wait_for(100))
    t2 = asyncio.create_task(wal.wait_for(100))
    await asyncio.sleep(0.01)
    t2.cancel()
    await wal.close()
    with pytest.raises(WALClosedError):
        await t1


async def test_errors(tmp_path, opened):
    wal = await opened(tmp_path)
    huge = np.zeros(MAX_PAYLOAD + 1, dtype=np.uint8)     # calloc'ed: no memory touched
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        wal.append([b"ok", huge])
    assert wal.next_offset == 0 and wal.read(0) == []    # nothing of the batch written
    with pytest.raises(TypeError):
        wal.append(["not bytes"])
    with pytest.raises(ValueError):
        wal.read(-1)
    wal.append([b"x"])
    with pytest.raises(ValueError, match="not been appended"):
        await wal.sync_to(5)
    with pytest.raises(WALLockedError):
        await WAL.open(tmp_path, cfg())
    await asyncio.gather(wal.close(), wal.close())       # idempotent, also concurrently
    await wal.close()
    assert wal.closed
    for call in (lambda: wal.append([b"y"]), lambda: wal.read(0)):
        with pytest.raises(WALClosedError):
            call()
    with pytest.raises(WALClosedError):
        await wal.append_durable([b"y"])
    with pytest.raises(WALClosedError):
        await wal.wait_for(10)
    assert wal._commit.worker.done()
    # The directory is free again.
    wal2 = await opened(tmp_path)
    assert wal2.read(0) == [(0, b"x")]


async def test_invalid_config():
    for kw in (dict(durability="sometimes"), dict(segment_max_bytes=10),
               dict(validate_sealed="never"), dict(sync_interval_ms=0),
               dict(max_age_seconds=0), dict(cache_capacity=-1)):
        with pytest.raises(ValueError):
            WALConfig(**kw)


# ---------------------------------------------------------------- retention

async def make_segments(wal, n_segments):
    """Append until ``n_segments`` segments exist, the last one active and non-empty."""
    while len(wal.segments()) < n_segments:
        wal.append([payload(wal.next_offset) or b"x"])
    wal.append([b"tail"])
    return wal.segments()


async def test_truncate_before(tmp_path, opened):
    wal = await opened(tmp_path, cfg(cache_capacity=0))
    infos = await make_segments(wal, 5)
    deleted = await wal.truncate_before(infos[2].first_offset + 1)
    assert deleted == infos[:2]
    assert not os.path.exists(infos[0].path) and not os.path.exists(infos[1].path)
    assert wal.first_offset == infos[2].first_offset
    with pytest.raises(OffsetTruncatedError) as ei:
        wal.read(infos[1].last_offset)
    assert ei.value.first_offset == infos[2].first_offset
    assert wal.read(infos[2].first_offset, 1)[0][0] == infos[2].first_offset
    # Never the active segment, even past the head of the log.
    deleted = await wal.truncate_before(wal.next_offset + 100)
    assert deleted == infos[2:4]
    assert wal.segments() == [wal.segments()[-1]] and os.path.exists(infos[4].path)
    assert wal.first_offset == infos[4].first_offset
    assert wal.read(wal.first_offset)[-1] == (wal.last_offset, b"tail")
    # The checkpoint follows (written by the worker).
    await wal.close()
    with open(tmp_path / "wal.ckpt") as f:
        ck = json.load(f)["checkpoint"]
    assert ck["first_offset"] == infos[4].first_offset and ck["segments"] == []
    assert ck["next_offset"] == ck["durable_offset"] + 1 == infos[4].last_offset + 1


async def test_truncate_everything_then_reopen(tmp_path, opened):
    wal = await opened(tmp_path)
    await make_segments(wal, 3)
    await wal.rotate()                                     # active now empty
    nxt = wal.next_offset
    await wal.truncate_before(nxt)
    assert wal.first_offset == wal.next_offset == nxt and wal.read(nxt) == []
    await wal.close()
    wal = await opened(tmp_path)
    assert wal.first_offset == wal.next_offset == nxt     # the empty file carries it
    assert wal.append([b"z"]) == (nxt, nxt)


async def test_retention_limits(tmp_path, opened):
    clock = Clock()
    wal = await opened(tmp_path, cfg(), clock=clock)
    sealed = []
    for i in range(6):                 # six sealed segments, sealed 100 s apart
        for _ in range(20):
            wal.append([b"r" * 100])
        clock.t += 100
        sealed.append(await wal.rotate())
    wal.append([b"active"])
    total = sum(i.size for i in wal.segments())
    # Age: sealed more than 250 s ago -> the first three (sealed 500, 400, 300 s ago).
    assert clock.t == 1_000_600
    deleted = await wal.retention(max_age_seconds=250)
    assert deleted == sealed[:3]
    # keep_from_offset protects the segment holding it and everything after.
    keep = sealed[4].first_offset + 3
    deleted = await wal.retention(max_bytes=0, keep_from_offset=keep)
    assert deleted == sealed[3:4]
    assert await wal.retention(max_age_seconds=0, keep_from_offset=keep) == []
    # Size: over the limit, oldest first -- but never the active segment.
    deleted = await wal.retention(max_bytes=0, keep_from_offset=keep, force=True)
    assert deleted == sealed[4:]
    assert len(wal.segments()) == 1 and wal.read(wal.first_offset) == [
        (wal.last_offset, b"active")]
    assert await wal.retention(max_bytes=0, force=True) == []
    assert total > 0


async def test_retention_by_size_keeps_under_limit(tmp_path, opened):
    wal = await opened(tmp_path)
    infos = await make_segments(wal, 8)
    total = sum(i.size for i in infos)
    limit = total - infos[0].size - infos[1].size // 2     # needs two segments gone
    deleted = await wal.retention(max_bytes=limit)
    assert deleted == infos[:2]
    assert sum(i.size for i in wal.segments()) <= limit
    assert await wal.retention(max_bytes=limit) == []


async def test_lru_of_mapped_sealed_segments(tmp_path, opened):
    wal = await opened(tmp_path, cfg(cache_capacity=0, max_mapped_sealed=2))
    expect = await fill(wal, 200, random.Random(3))
    assert len(wal.segments()) > 10
    for _ in range(3):
        for off in range(0, len(expect), 7):
            assert wal.read(off, 1) == [(off, expect[off])]
            assert sum(s.mm is not None for s in wal._state.segments[:-1]) <= 2


async def test_active_segment_grows_ahead_of_the_writes(tmp_path, opened):
    """The active segment is preallocated in doubling chunks as appends (pwrite) reach its
    end, every frame lands where the index says, and on close the file ends at the data."""
    wal = await opened(tmp_path, WALConfig(durability="none", segment_initial_bytes=1 << 16,
                                           cache_capacity=0))
    seg = wal._state.active
    batch = [b"p" * 1000] * 100                      # ~100 KB
    sizes = set()
    for i in range(40):
        first, _ = wal.append(batch)
        assert seg.size >= seg.write_pos
        sizes.add(seg.size)
        assert wal.read(first, 1, 0) == [(first, batch[0])]        # through the mapping
    assert len(sizes) > 3 and seg.write_pos > 3 << 20 and len(wal.segments()) == 1
    offsets, _, valid_end, status = scan_frames(seg.mm, 0, -1, 0)
    assert (len(offsets), valid_end, status) == (4000, seg.write_pos, SCAN_CLEAN)
    await wal.close()
    assert os.path.getsize(seg.path) == seg.write_pos
