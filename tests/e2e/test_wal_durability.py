"""danube.storage.wal durability: group commit, the three modes, sync failure, and a real
kill -9 of a writer in ``always`` mode."""

import asyncio
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import uvloop

import danube
from danube.storage import WAL, WALConfig, WALFailedError
# The sync worker's module: its fdatasync and checkpoint writes are wrapped below.
from danube.storage.wal import group_commit as wal_module

from waiting import async_holds_for, async_wait_for

SMALL = dict(segment_max_bytes=64 << 10, segment_initial_bytes=8 << 10)


@pytest.fixture
def fdatasyncs(monkeypatch):
    """Count (and timestamp, with the thread that made them) the WAL's fdatasync calls."""
    calls = []
    real = wal_module._fdatasync

    def counting(fd):
        real(fd)
        calls.append((time.monotonic(), threading.get_ident()))

    monkeypatch.setattr(wal_module, "_fdatasync", counting)
    return calls


def run_on(loop_name, coro_fn):
    factory = uvloop.new_event_loop if loop_name == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro_fn())


# ---------------------------------------------------------------- always: group commit

@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_group_commit(tmp_path, fdatasyncs, loop_name):
    async def main():
        wal = await WAL.open(tmp_path, WALConfig(durability="always", **SMALL))
        events = []          # ("sync", covered) in completion order, ("ret", offset)
        wal.on_sync = lambda covered: events.append(("sync", covered))

        async def producer(i):
            lasts = []
            for _ in range(5):
                first, last = await wal.append_durable([b"m%d" % i] * (1 + i % 3))
                assert wal.durable_offset >= last
                events.append(("ret", last))
                lasts.append(last)
            return lasts

        lasts = await asyncio.gather(*(producer(i) for i in range(200)))
        syncs = wal.sync_count
        await wal.close()
        return [x for ls in lasts for x in ls], events, syncs

    calls_before = len(fdatasyncs)
    lasts, events, syncs = run_on(loop_name, main)
    n_fdatasync = len(fdatasyncs) - calls_before
    assert len(lasts) == len(set(lasts)) == 1000
    # 1000 durable appends from 200 concurrent callers: far fewer syncs than calls (each
    # round of the 200 callers lands in one or two groups).
    assert 1 <= syncs <= 50, syncs
    assert n_fdatasync <= syncs + 2          # one file per sync (+ the close)
    # Every caller returned after a sync that covers its offset.
    covered = -1
    for kind, off in events:
        if kind == "sync":
            covered = max(covered, off)
        else:
            assert off <= covered
    # The syncs ran off the event loop's thread.
    assert all(tid != threading.get_ident() for _, tid in fdatasyncs[calls_before:])


async def test_appends_during_a_sync_go_to_the_next_group(tmp_path, monkeypatch):
    release = threading.Event()
    started = threading.Event()
    real = wal_module._fdatasync

    def slow(fd):
        started.set()
        release.wait(5)
        real(fd)

    wal = await WAL.open(tmp_path, WALConfig(durability="always"))
    monkeypatch.setattr(wal_module, "_fdatasync", slow)
    try:
        t1 = asyncio.create_task(wal.append_durable([b"a"]))
        await async_wait_for(started.is_set, what="the sync for offset 0 to start")
        # A sync for offset 0 is running; these land in the next group.
        t2 = [asyncio.create_task(wal.append_durable([b"b%d" % i])) for i in range(50)]
        # Nothing is acknowledged while it is held (watched over a bounded window).
        await async_holds_for(lambda: not t1.done() and wal.durable_offset == -1, 0.02,
                              what="no acknowledgement while the sync is held")
        release.set()
        assert await t1 == (0, 0)
        await asyncio.gather(*t2)
        assert wal.durable_offset == 50
        assert wal.sync_count == 2            # one for "a", one for all fifty others
    finally:
        release.set()
        await wal.close()


async def test_always_mode_plain_append_is_synced_soon(tmp_path, fdatasyncs):
    wal = await WAL.open(tmp_path, WALConfig(durability="always"))
    try:
        wal.append([b"x"] * 10)
        await async_wait_for(lambda: wal.durable_offset == 9, what="offset 9 to be synced")
        assert wal.sync_count == 1
    finally:
        await wal.close()


async def test_durable_across_rotations(tmp_path, fdatasyncs):
    wal = await WAL.open(tmp_path, WALConfig(durability="always", segment_max_bytes=4096,
                                             segment_initial_bytes=1024))
    try:
        for i in range(20):
            wal.append([b"z" * 100] * 10)          # rotates every few batches
        await wal.sync_to()
        assert wal.durable_offset == 199
        assert all(s.synced_pos == s.write_pos for s in wal._state.segments)
        assert len(wal.segments()) > 5
    finally:
        await wal.close()


# ---------------------------------------------------------------- interval and none

async def test_interval_mode(tmp_path, fdatasyncs):
    wal = await WAL.open(tmp_path / "a", WALConfig(durability="interval", sync_interval_ms=50))
    try:
        assert await wal.append_durable([b"a", b"b"]) == (0, 1)
        assert wal.durable_offset == -1 and wal.sync_count == 0    # returned after the write
        await async_wait_for(lambda: wal.durable_offset >= 1,
                             what="the timer to sync offset 1")
        assert wal.sync_count == 1
        # Idle intervals: no sync, watched over three of them (a bounded window).
        await async_holds_for(lambda: wal.sync_count == 1, 0.15,
                              what="no sync on idle intervals")
    finally:
        await wal.close()
    # An explicit sync_to does not wait for the interval.
    wal = await WAL.open(tmp_path / "b", WALConfig(durability="interval", sync_interval_ms=60_000))
    try:
        wal.append([b"c"])
        t1 = time.monotonic()
        assert await wal.sync_to() == 0
        assert time.monotonic() - t1 < 30 and wal.sync_count == 1   # the interval is 60 s
    finally:
        await wal.close()


async def test_none_mode(tmp_path, fdatasyncs):
    wal = await WAL.open(tmp_path, WALConfig(durability="none", segment_max_bytes=4096,
                                             segment_initial_bytes=1024))
    n0 = len(fdatasyncs)
    try:
        for _ in range(20):
            assert (await wal.append_durable([b"q" * 100] * 10))[1] == wal.last_offset
        # No sync happens by itself (watched over a bounded window).
        await async_holds_for(lambda: wal.sync_count == 0 and len(fdatasyncs) == n0, 0.1,
                              what="no sync in durability none")
        assert wal.durable_offset == -1
        assert len(wal.segments()) > 5                   # rotated without syncing
        # Asked explicitly, it syncs everything, sealed segments included.
        assert await wal.sync_to(150) == 199
        assert all(s.synced_pos == s.write_pos for s in wal._state.segments)
        assert len(fdatasyncs) - n0 == len(wal.segments())
    finally:
        await wal.close()


async def test_close_syncs_in_every_mode(tmp_path, fdatasyncs):
    for mode in ("none", "interval", "always"):
        wal = await WAL.open(tmp_path / mode, WALConfig(durability=mode))
        wal.append([b"x"])
        n0 = len(fdatasyncs)
        await wal.close()
        assert len(fdatasyncs) > n0 and wal.durable_offset == 0


# ---------------------------------------------------------------- failure

async def test_failed_sync_stops_the_wal(tmp_path, monkeypatch):
    """A failed fdatasync cannot be produced for real; it is injected here."""
    wal = await WAL.open(tmp_path, WALConfig(durability="always"))

    def failing(fd):
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(wal_module, "_fdatasync", failing)
    waiters = [asyncio.create_task(wal.append_durable([b"x"])) for _ in range(5)]
    for t in waiters:
        with pytest.raises(WALFailedError) as ei:
            await t
        assert isinstance(ei.value.__cause__, OSError)
    with pytest.raises(WALFailedError):
        wal.append([b"y"])
    assert wal.durable_offset == -1
    assert wal.read(0) == [(o, b"x") for o in range(5)]     # still readable
    await wal.close()
    assert wal.closed
    monkeypatch.undo()
    wal = await WAL.open(tmp_path, WALConfig())           # the page cache still has it
    assert wal.next_offset == 5
    await wal.close()


async def test_cancelled_waiter_does_not_disturb_others(tmp_path):
    wal = await WAL.open(tmp_path, WALConfig(durability="always"))
    try:
        wal.append([b"a"])
        t1 = asyncio.create_task(wal.sync_to(0))
        t2 = asyncio.create_task(wal.sync_to(0))
        await asyncio.sleep(0)
        t1.cancel()
        assert await t2 == 0
        assert t1.cancelled()
    finally:
        await wal.close()


async def test_shared_executor(tmp_path):
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        wals = [await WAL.open(tmp_path / str(i), WALConfig(**SMALL), executor=ex)
                for i in range(5)]
        await asyncio.gather(*(w.append_durable([b"p%d" % j for j in range(100)])
                               for w in wals for _ in range(4)))
        assert all(w.durable_offset == 399 for w in wals)
        await asyncio.gather(*(w.close() for w in wals))
        ex.submit(lambda: None).result()                   # not shut down by the WALs


# ---------------------------------------------------------------- kill -9

CHILD = r"""
import asyncio, sys, random
import uvloop
from danube.storage import WAL, WALConfig

def payload(off):
    n = (off * 7919) % 300 + 1
    return (off.to_bytes(8, "little") * (n // 8 + 1))[:n]

async def main(path, seed):
    rnd = random.Random(seed)
    wal = await WAL.open(path, WALConfig(durability="always", segment_max_bytes=64 << 10,
                                         segment_initial_bytes=8 << 10))
    print("start", wal.next_offset, flush=True)

    async def producer():
        while True:
            first = wal.next_offset
            # Small batches are written at append, large ones (>= 16 KiB) by the sync job.
            k = rnd.randint(1, 40) if rnd.random() < 0.7 else rnd.randint(100, 300)
            f, l = await wal.append_durable([payload(first + i) for i in range(k)])
            assert f == first
            sys.stdout.write(f"ack {l}\n")
            sys.stdout.flush()
            if rnd.random() < 0.3:
                await asyncio.sleep(0)

    await asyncio.gather(*(producer() for _ in range(4)))

uvloop.run(main(sys.argv[1], int(sys.argv[2])))
"""


def child_payload(off):
    n = (off * 7919) % 300 + 1
    return (off.to_bytes(8, "little") * (n // 8 + 1))[:n]


def test_kill_9_loses_no_acknowledged_offset(tmp_path):
    path = str(tmp_path / "wal")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(danube.__file__))}
    rnd = random.Random(9)
    expected_next = 0
    for run in range(5):
        proc = subprocess.Popen([sys.executable, "-P", "-c", CHILD, path, str(run)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 20
        while not lines and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.005)
        assert lines and lines[0].startswith(b"start"), proc.stderr.read()
        assert int(lines[0].split()[1]) == expected_next          # offsets continue
        time.sleep(rnd.uniform(0.05, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        reader.join(10)
        proc.stdout.close()
        proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        acks = [int(x.split()[1]) for x in lines[1:] if x.endswith(b"\n")]
        assert acks, "the child acknowledged nothing before the kill"
        max_ack = max(acks)

        async def verify():
            wal = await WAL.open(path, WALConfig(validate_sealed="open", verify_reads=True,
                                                 segment_max_bytes=64 << 10))
            try:
                assert wal.next_offset > max_ack
                got, off = [], 0
                while off < wal.next_offset:
                    batch = wal.read(off, 5000)
                    got.extend(batch)
                    off = batch[-1][0] + 1
                assert [o for o, _ in got] == list(range(wal.next_offset))  # contiguous
                bad = [o for o, p in got if p != child_payload(o)]
                assert not bad, bad[:5]
                return wal.next_offset, wal.recovery
            finally:
                await wal.close()

        expected_next, report = asyncio.run(verify())
        assert report.segments > 0


# ---------------------------------------------------------------- always: writes by the sync job

def _file_frames(path):
    from danube.storage._walframes import scan_frames
    with open(path, "rb") as f:
        data = f.read()
    offsets, _, _, _ = scan_frames(data)
    return offsets.tolist()


async def test_always_mode_writes_in_the_sync_job_and_reads_pending_frames(tmp_path,
                                                                          monkeypatch):
    """An append in mode always (of 16 KiB or more, or after one still pending) is framed at
    once and written by the next sync job, just before its fdatasync; until then reads come
    from the pending buffers, and a read spanning written and pending frames is seamless
    (byte budget included)."""
    release = threading.Event()
    real = wal_module._fdatasync

    def held(fd):
        release.wait(5)
        real(fd)

    wal = await WAL.open(tmp_path, WALConfig(durability="always", cache_capacity=0))
    try:
        first = wal.append([b"a%d" % i for i in range(5)])
        await wal.sync_to(4)
        seg = wal._state.active
        assert _file_frames(seg.path) == [0, 1, 2, 3, 4]
        monkeypatch.setattr(wal_module, "_fdatasync", held)
        big = [bytes([i]) * 70000 for i in range(3)]     # pooled buffers (>= 64 KiB)
        wal.append(big)
        wal.append([b"b%d" % i for i in range(3)])      # small, but after pending frames
        assert first == (0, 4) and wal.next_offset == 11
        assert [(p.first_offset, p.count) for p in wal._state.pending] == [(5, 3), (8, 3)]
        want = [b"a%d" % i for i in range(5)] + big + [b"b%d" % i for i in range(3)]
        assert wal.read(0, 100) == list(enumerate(want))
        assert wal.read(3, 4) == list(enumerate(want[3:7], 3))
        assert wal.read(4, 100, 2 + 70000) == list(enumerate(want[4:6], 4))
        assert wal.read(6, 100, 1) == [(6, big[1])]
        assert wal.read(7, 100, 70000 + 4) == list(enumerate(want[7:10], 7))
        # A job is writing (or has written) them, but its fdatasync is held: nothing becomes
        # durable (watched over a bounded window).
        await async_holds_for(lambda: wal.durable_offset == 4, 0.05,
                              what="nothing durable while the fdatasync is held")
        release.set()
        await wal.sync_to(10)
        assert _file_frames(seg.path) == list(range(11))
        assert not wal._state.pending and seg.file_end == seg.write_pos
        assert wal.read(0, 100) == list(enumerate(want))
    finally:
        release.set()
        await wal.close()


async def test_always_mode_rotation_writes_the_sealed_segment_first(tmp_path, monkeypatch):
    """A rotation writes what is pending before the segment is sealed and the next one
    created: at no moment does a later segment exist while an earlier one lacks frames."""
    release = threading.Event()
    real = wal_module._fdatasync

    def held(fd):
        release.wait(5)
        real(fd)

    wal = await WAL.open(tmp_path, WALConfig(durability="always", segment_max_bytes=4096,
                                             segment_initial_bytes=1024, cache_capacity=0))
    monkeypatch.setattr(wal_module, "_fdatasync", held)
    monkeypatch.setattr(wal_module, "_DEFER_MIN", 0)     # these small appends are deferred
    try:
        payloads = [bytes([i % 256]) * 300 for i in range(40)]
        for i in range(0, 40, 4):
            wal.append(payloads[i:i + 4])
            assert wal._state.pending
            segs = wal.segments()
            for info in segs[:-1]:          # every sealed segment is complete on disk
                assert _file_frames(info.path) == list(range(info.first_offset,
                                                             info.last_offset + 1))
        assert len(wal.segments()) > 3
        assert wal.read(0, 100) == list(enumerate(payloads))
        release.set()
        await wal.sync_to(39)
    finally:
        release.set()
        await wal.close()
    wal = await WAL.open(tmp_path, WALConfig(durability="always", segment_max_bytes=4096,
                                             validate_sealed="open"))
    try:
        assert wal.read(0, 100) == list(enumerate(payloads))
    finally:
        await wal.close()


def test_write_pending_coalesces_and_skips_written(tmp_path):
    from danube.storage.segment import PendingWrite, write_pending

    class Seg:
        pass

    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        a, b = Seg(), Seg()
        a.fd = b.fd = fd
        writes = [PendingWrite(a, 0, bytearray(b"AAAA..."), 4, 0, 1),
                  PendingWrite(a, 4, bytearray(b"BB"), 2, 1, 1),
                  PendingWrite(a, 6, bytearray(b"CCC"), 3, 2, 1),
                  PendingWrite(b, 20, bytearray(b"DD"), 2, 3, 1),
                  PendingWrite(b, 22, bytearray(b"XX"), 2, 4, 1, written=True),
                  PendingWrite(b, 30, bytearray(b"EE"), 2, 5, 1)]
        write_pending(writes)
        assert all(w.written for w in writes)
        data = os.pread(fd, 100, 0)
        assert data == b"AAAABBCCC" + b"\0" * 11 + b"DD" + b"\0" * 8 + b"EE"
    finally:
        os.close(fd)


async def test_always_mode_writes_ahead_while_a_sync_runs(tmp_path, monkeypatch):
    """Appends made while a sync job is in its fdatasync are written by a second job at
    once (once they add up to 64 KiB), so the next sync finds them in the file; nothing is
    lost or doubled."""
    release, started = threading.Event(), threading.Event()
    real = wal_module._fdatasync

    def held(fd):
        started.set()
        release.wait(5)
        real(fd)

    wal = await WAL.open(tmp_path, WALConfig(durability="always", cache_capacity=0))
    monkeypatch.setattr(wal_module, "_fdatasync", held)
    try:
        first = asyncio.ensure_future(wal.append_durable([b"first"]))
        await async_wait_for(started.is_set, what="the first fdatasync to start")
        batches = [[b"%d-%d." % (k, i) * 300 for i in range(50)] for k in range(3)]
        for batch in batches:
            wal.append(batch)
        # Written while the fdatasync is still held.
        await async_wait_for(lambda: _file_frames(wal._state.active.path) == list(range(151)),
                             what="the 151 frames in the file")
        assert wal.durable_offset == -1
        release.set()
        await first
        await wal.sync_to(150)
        assert not wal._state.pending and wal._state.active.file_end == wal._state.active.write_pos
        want = [b"first"] + [p for batch in batches for p in batch]
        assert wal.read(0, 1000) == list(enumerate(want))
    finally:
        release.set()
        await wal.close()
    assert _file_frames(tmp_path / wal._state.active.name) == list(range(151))
