"""The broker's journal (danube/storage/journal): its records, its files, its replay, and the
WALs that make their appends durable through it."""

import asyncio
import os

import pytest

from danube.storage.errors import WALLockedError
from danube.storage.journal import open_journal
from danube.storage.journal import journal as journal_mod
from danube.storage.journal.journal import DIRECTORY, journal_files, lock_journal
from danube.storage.journal.records import FORGET, FRAMES, encode_header, read_records
from danube.storage.wal import WAL, WALConfig


def plain(_key):
    return WALConfig()


def record(seq, kind, key, first, count, body):
    return bytes(encode_header(seq, kind, key, first, count, body)) + bytes(body)


def test_records_read_back_and_end_at_the_first_that_does_not_check_out():
    data = (record(7, FRAMES, b"ns/a", 0, 2, b"frames") + record(7, FORGET, b"ns/b", 0, 0, b"")
            + record(6, FRAMES, b"ns/a", 2, 1, b"old file's"))      # a recycled file's tail
    records, end = read_records(data, 7)
    assert [(r.kind, r.key, r.first_offset, r.count, r.body) for r in records] == [
        (FRAMES, "ns/a", 0, 2, b"frames"), (FORGET, "ns/b", 0, 0, b"")]
    assert end == len(data) - len(record(6, FRAMES, b"ns/a", 2, 1, b"old file's"))
    torn = bytearray(record(7, FRAMES, b"ns/a", 0, 1, b"x" * 100))
    torn[-1] ^= 0xFF
    assert read_records(bytes(torn), 7) == ([], 0)
    assert read_records(record(7, FRAMES, b"ns/a", 0, 1, b"abc")[:-1], 7) == ([], 0)
    assert read_records(bytes(4096), 7) == ([], 0)
    with pytest.raises(ValueError):
        encode_header(1, FRAMES, b"k" * 5000, 0, 0, b"")


def test_appends_of_many_wals_share_group_commits(tmp_path):
    async def main():
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        cfg = WALConfig(journal=j)
        wals = [await WAL.open(tmp_path / "ns" / f"t{i}", cfg) for i in range(50)]
        for _ in range(5):
            waits = []
            for w in wals:
                _, last = w.append([b"m" * 100])
                waits.append(w.sync_to(last))
            await asyncio.gather(*waits)
        assert all(w.durable_offset == 4 for w in wals)
        assert j.commits < 5 * 50, "one commit per append: no grouping"
        assert wals[3].read(0, 10) == [(i, b"m" * 100) for i in range(5)]
        # The WAL syncs no file of its own: no lock file either.
        assert not os.path.exists(tmp_path / "ns" / "t0" / "wal.lock")
        for w in wals:
            await w.close()
        await j.close()
        assert journal_files(str(tmp_path / DIRECTORY)) == []
    asyncio.run(main())


def test_a_directory_opens_in_one_wal_only_and_a_root_in_one_journal(tmp_path):
    async def main():
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        w = await WAL.open(tmp_path / "ns" / "t", WALConfig(journal=j))
        with pytest.raises(WALLockedError):
            await WAL.open(tmp_path / "ns" / "t", WALConfig(journal=j))
        with pytest.raises(WALLockedError):
            lock_journal(str(tmp_path / DIRECTORY))
        await w.close()
        w = await WAL.open(tmp_path / "ns" / "t", WALConfig(journal=j))     # again, closed
        await w.close()
        await j.close()
    asyncio.run(main())


def crash(journal):
    """The process dies: the writer stops where it is, nothing is closed or trimmed."""
    journal._stopping = True
    journal._event.set()
    journal._thread.join()
    journal._trim.shutdown(wait=True)
    os.close(journal._lock_fd)


def test_replay_restores_what_a_segment_lost_and_keeps_sequence_numbers_growing(tmp_path):
    async def main():
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        w = await WAL.open(tmp_path / "ns" / "t", WALConfig(journal=j))
        for n in range(30):
            _, last = w.append([b"msg-%d" % n])
            await w.sync_to(last)
        first_seq = j._seq
        crash(j)
        w._release()
        # A power cut took the segment's unsynced data, and the directory with it.
        for name in os.listdir(tmp_path / "ns" / "t"):
            os.unlink(tmp_path / "ns" / "t" / name)
        os.rmdir(tmp_path / "ns" / "t")
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        assert j._seq > first_seq, "a recycled file's records could pass for the new file's"
        w = await WAL.open(tmp_path / "ns" / "t", WALConfig(journal=j))
        assert w.read(0, 100) == [(n, b"msg-%d" % n) for n in range(30)]
        await w.close()
        await j.close()
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        assert j._seq > first_seq + 1
        await j.close()
    asyncio.run(main())


def test_replay_applies_nothing_past_a_gap_and_nothing_before_a_forget(tmp_path, caplog):
    async def main():
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        seq = j._seq
        crash(j)
        # Hand-made records: ns/gap's offset 1 never reached the journal; ns/gone was
        # forgotten (deleted), then made again with one message.
        from danube.storage._walframes import encode_frame

        def frames(first, payloads):
            return b"".join(encode_frame(first + i, p) for i, p in enumerate(payloads))
        data = b"".join([
            record(seq, FRAMES, b"ns/gap", 0, 1, frames(0, [b"a"])),
            record(seq, FRAMES, b"ns/gap", 2, 1, frames(2, [b"c"])),
            record(seq, FRAMES, b"ns/gone", 0, 2, frames(0, [b"old", b"old2"])),
            record(seq, FORGET, b"ns/gone", 0, 0, b""),
            record(seq, FRAMES, b"ns/gone", 0, 1, frames(0, [b"new"])),
            record(seq, FRAMES, b"../escape", 0, 1, frames(0, [b"x"])),
        ])
        path = os.path.join(tmp_path, DIRECTORY, journal_mod.file_name(seq))
        with open(path, "r+b") as f:
            f.write(data)
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        gap = await WAL.open(tmp_path / "ns" / "gap", WALConfig(journal=j))
        gone = await WAL.open(tmp_path / "ns" / "gone", WALConfig(journal=j))
        assert gap.read(0, 10) == [(0, b"a")]
        assert gone.read(0, 10) == [(0, b"new")]
        assert not os.path.exists(tmp_path.parent / "escape")
        await gap.close()
        await gone.close()
        await j.close()
    asyncio.run(main())
    assert "never acknowledged" in caplog.text


def open_segment_files(root):
    """The descriptors this process holds on WAL segment files under ``root``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith(".log"):
            out.append(target)
    return out


def test_idle_active_segments_close_their_descriptors_beyond_the_bound(tmp_path):
    async def main():
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain, max_open_segments=5)
        cfg = WALConfig(journal=j)
        wals = [await WAL.open(tmp_path / "ns" / f"t{i}", cfg) for i in range(30)]
        for rnd in range(3):
            for w in wals:
                _, last = w.append([b"round-%d" % rnd])
                await w.sync_to(last)
                assert len(open_segment_files(tmp_path)) <= 6
        # Every log still reads and appends (its file opened again), and closes.
        for i, w in enumerate(wals):
            assert w.read(0, 10) == [(r, b"round-%d" % r) for r in range(3)]
        assert len(open_segment_files(tmp_path)) <= 6
        for w in wals:
            await w.close()
        await j.close()
        # Reopened from disk, everything is there.
        j = await open_journal(str(tmp_path), file_bytes=1 << 20, executor=None,
                               config_for=plain)
        w = await WAL.open(tmp_path / "ns" / "t7", WALConfig(journal=j))
        assert w.read(0, 10) == [(r, b"round-%d" % r) for r in range(3)]
        await w.close()
        await j.close()
    asyncio.run(main())
