"""pytest-benchmark for the WAL (danube.storage.wal), next to the physical limit in the same run.

* append of 1000 x 100-byte payloads, no sync (durability "none"): framing into the mmap,
  index and cache upkeep, rotation every 64 MiB included;
* append_durable of the same batch in "always" mode (one group commit: write + fdatasync in
  the executor + wake-up), next to a plain Python loop writing the same frame bytes with
  os.write (appending to a file, and pwrite into a preallocated one) and an os.fdatasync
  after each batch: the disk's limit for one durable batch;
* 200 concurrent append_durable callers of one 100-byte message each (group commit), next to
  200 x (os.write + os.fdatasync), what one-sync-per-message would cost;
* read of 1000 messages from the segments (cache off), from the hot-tail cache, and a
  pure-Python struct loop over the same mmap.

Each benchmark stores messages per second in extra_info["msg/s"]:

    PYTHONPATH=. .venv/bin/pytest bench/test_bench_wal.py --benchmark-only
"""

import asyncio
import os
import random
import struct

import pytest
import uvloop

from danube.storage._walframes import encode_frames_into, frame_size
from danube.storage import WAL, WALConfig

N = 1000
PAYLOADS = [random.Random(i).randbytes(100) for i in range(N)]
BATCH_BYTES = bytearray(sum(frame_size(len(p)) for p in PAYLOADS))
encode_frames_into(BATCH_BYTES, 0, 0, PAYLOADS)
BATCH_BYTES = bytes(BATCH_BYTES)
HDR = struct.Struct("<QII")


def _rate(benchmark, messages, nbytes=None):
    if benchmark.stats is None:      # --benchmark-disable: ran once as a smoke test
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["msg/s"] = round(messages / mean)
    if nbytes:
        benchmark.extra_info["MB/s"] = round(nbytes / mean / 1e6, 1)


@pytest.fixture
def loop():
    loop = uvloop.new_event_loop()          # the broker's loop
    yield loop
    loop.close()


@pytest.fixture
def open_wal(loop, tmp_path):
    wals = []

    def make(name, **kw):
        wal = loop.run_until_complete(WAL.open(tmp_path / name, WALConfig(**kw)))
        wals.append(wal)
        return wal

    yield make
    for wal in wals:
        loop.run_until_complete(wal.close())


# ---------------------------------------------------------------- append, no sync

def test_append_1000x100B_nosync(benchmark, open_wal, loop):
    wal = open_wal("nosync", durability="none")
    benchmark.group = "wal append 1000 x 100 B, no sync"

    def setup():        # let the loop run the WAL's callbacks (prefetch, retirement)
        loop.run_until_complete(asyncio.sleep(0))
        return (PAYLOADS,), {}

    benchmark.pedantic(wal.append, setup=setup, rounds=2000, warmup_rounds=20)
    _rate(benchmark, N, len(BATCH_BYTES))


def test_peer_python_append_loop_1000x100B_nosync(benchmark, tmp_path):
    """What the per-message Python loop the WAL avoids would cost: struct + crc + slice
    assignment into a bytearray, one message at a time."""
    from danube.codec.crc32c import crc32c
    buf = bytearray(len(BATCH_BYTES))
    benchmark.group = "wal append 1000 x 100 B, no sync"
    lens = struct.Struct("<QI")

    def run():
        pos = 0
        for off, p in enumerate(PAYLOADS):
            HDR.pack_into(buf, pos, off, len(p), crc32c(p, crc32c(lens.pack(off, len(p)))))
            buf[pos + 16:pos + 16 + len(p)] = p
            pos += 16 + len(p)

    benchmark(run)
    _rate(benchmark, N, len(BATCH_BYTES))


# ---------------------------------------------------------------- durable batch

def test_append_durable_1000x100B_always(benchmark, open_wal, loop):
    wal = open_wal("always", durability="always")
    benchmark.group = "wal durable batch 1000 x 100 B"
    benchmark(lambda: loop.run_until_complete(wal.append_durable(PAYLOADS)))
    assert wal.durable_offset == wal.last_offset
    _rate(benchmark, N, len(BATCH_BYTES))


def test_peer_write_fdatasync_1000x100B(benchmark, tmp_path):
    """The physical limit: the same frame bytes, one os.write + os.fdatasync per batch, the
    file growing (as an append-only file does)."""
    fd = os.open(tmp_path / "plain.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    benchmark.group = "wal durable batch 1000 x 100 B"

    def run():
        os.write(fd, BATCH_BYTES)
        os.fdatasync(fd)

    try:
        benchmark(run)
    finally:
        os.close(fd)
    _rate(benchmark, N, len(BATCH_BYTES))


def test_peer_pwrite_fdatasync_prealloc_1000x100B(benchmark, tmp_path):
    """The same into a preallocated file (os.pwrite + os.fdatasync), as the WAL's segments
    are: no size change per sync."""
    fd = os.open(tmp_path / "prealloc.log", os.O_RDWR | os.O_CREAT, 0o644)
    size = 1 << 30
    os.posix_fallocate(fd, 0, size)
    pos = [0]
    benchmark.group = "wal durable batch 1000 x 100 B"

    def run():
        if pos[0] + len(BATCH_BYTES) > size:
            pos[0] = 0
        os.pwrite(fd, BATCH_BYTES, pos[0])
        os.fdatasync(fd)
        pos[0] += len(BATCH_BYTES)

    try:
        benchmark(run)
    finally:
        os.close(fd)
    _rate(benchmark, N, len(BATCH_BYTES))


# ---------------------------------------------------------------- group commit

def test_group_commit_200_callers_x1(benchmark, open_wal, loop):
    wal = open_wal("group", durability="always")
    one = [PAYLOADS[0]]
    benchmark.group = "wal 200 concurrent durable appends of 1 x 100 B"

    async def burst():
        await asyncio.gather(*(wal.append_durable(one) for _ in range(200)))

    s0 = wal.sync_count
    benchmark(lambda: loop.run_until_complete(burst()))
    if benchmark.stats is not None:
        rounds = benchmark.stats.stats.rounds
        benchmark.extra_info["syncs per 200 callers"] = round((wal.sync_count - s0) / rounds, 2)
    _rate(benchmark, 200)


def test_peer_fdatasync_per_message_200x1(benchmark, tmp_path):
    fd = os.open(tmp_path / "each.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    frame = BATCH_BYTES[:frame_size(100)]
    benchmark.group = "wal 200 concurrent durable appends of 1 x 100 B"

    def run():
        for _ in range(200):
            os.write(fd, frame)
            os.fdatasync(fd)

    try:
        benchmark.pedantic(run, rounds=5, iterations=1)
    finally:
        os.close(fd)
    _rate(benchmark, 200)


# ---------------------------------------------------------------- reads

def _filled(open_wal, name, cache):
    wal = open_wal(name, durability="none", cache_capacity=cache)
    for _ in range(100):
        wal.append(PAYLOADS)
    return wal


def test_read_1000_from_segments(benchmark, open_wal):
    wal = _filled(open_wal, "read-seg", 0)
    benchmark.group = "wal read 1000 x 100 B"
    got = benchmark(wal.read, 50_000, 1000)
    assert len(got) == 1000 and got[0] == (50_000, PAYLOADS[0])
    _rate(benchmark, N, len(BATCH_BYTES))


def test_read_1000_from_cache(benchmark, open_wal):
    wal = _filled(open_wal, "read-cache", 1024)
    benchmark.group = "wal read 1000 x 100 B"
    got = benchmark(wal.read, wal.next_offset - 1000, 1000)
    assert len(got) == 1000 and got[-1] == (wal.last_offset, PAYLOADS[-1])
    _rate(benchmark, N, len(BATCH_BYTES))


def test_peer_python_read_loop_1000(benchmark, open_wal):
    wal = _filled(open_wal, "read-py", 0)
    seg = wal._state.segments[0]
    seg.read_into([], 50_000, 1, -1, False)     # the active segment is mapped on a read
    mm = seg.mm
    start = int(seg.index[50_000 - seg.base])
    benchmark.group = "wal read 1000 x 100 B"

    def run():
        out, pos = [], start
        for _ in range(1000):
            off, n, _ = HDR.unpack_from(mm, pos)
            out.append((off, mm[pos + 16:pos + 16 + n]))
            pos += 16 + n
        return out

    got = benchmark(run)
    assert got[0] == (50_000, PAYLOADS[0])
    _rate(benchmark, N, len(BATCH_BYTES))
