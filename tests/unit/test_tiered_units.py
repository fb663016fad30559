"""Tiered storage pieces on their own: the catalogue, uploading a sealed segment (checked,
conditional, adopted on retry), reading history back through the sparse index in ranges of
any size (frames cut by a range, frames bigger than one, damage reported with the object and
byte), and a subscription's history cursor streaming across segments and riding out store
failures and damage."""

import asyncio
import concurrent.futures
import dataclasses
import errno
import os
import threading
import time
from pathlib import Path

import pytest

from danube.storage.durable.base import (ObjectExists, ObjectInfo, ObjectNotFound,
                                         ObjectStore, ObjectStoreError)
from danube.storage.durable.fs import TMP_PREFIX, FsObjectStore
from danube.storage.errors import OffsetTruncatedError
from danube.storage.tiered.catalog import (Catalog, SegmentDescriptor, object_key,
                                           parse_object_key, segment_id)
from danube.storage.tiered.history import HistoryCursor
from danube.storage._walframes import (SCAN_CLEAN, SCAN_CORRUPT, SCAN_GAP, SCAN_TORN,
                                       encode_frame, scan_frames, walk_frames)
from danube.storage.tiered.segments import (SegmentReader, SegmentUploadError, read_history,
                                            upload_segment)
from danube.storage.wal import WAL, WALConfig


class DictStore(ObjectStore):
    backend = "dict"

    def __init__(self):
        self.objects = {}
        self.gets = 0
        self.fail = 0              # the next `fail` calls raise
        self.lock = threading.Lock()
        self.delay = 0.0           # seconds each get takes
        self.in_flight = self.max_in_flight = 0

    def _maybe_fail(self):
        with self.lock:
            if self.fail:
                self.fail -= 1
                raise ObjectStoreError("injected failure")

    def describe(self):
        return "dict store"

    def check(self):
        self._maybe_fail()

    def put(self, key, data, *, if_absent=False):
        self._maybe_fail()
        if if_absent and key in self.objects:
            raise ObjectExists(key)
        self.objects[key] = bytes(data)
        return ObjectInfo(key, len(data), f"e{len(self.objects)}")

    def put_file(self, key, path, size, *, if_absent=False):
        with open(path, "rb") as f:
            return self.put(key, f.read(size), if_absent=if_absent)

    def get(self, key, start=0, end=None):
        self._maybe_fail()
        with self.lock:
            self.gets += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                time.sleep(self.delay)
            if key not in self.objects:
                raise ObjectNotFound(key)
            return self.objects[key][start:end]
        finally:
            with self.lock:
                self.in_flight -= 1

    def head(self, key):
        if key not in self.objects:
            raise ObjectNotFound(key)
        return ObjectInfo(key, len(self.objects[key]), "etag")

    def list(self, prefix):
        return [self.head(k) for k in sorted(self.objects) if k.startswith(prefix)]

    def delete(self, key):
        self.objects.pop(key, None)

    def close(self):
        pass


def _payload(i):
    return b"payload-%d-" % i + b"x" * (i % 97)


async def _sealed_segment(tmp_path, n, first=0):
    wal = await WAL.open(tmp_path / "wal", WALConfig(durability="none"), start_offset=first)
    for i in range(first, first + n, 500):
        wal.append([_payload(j) for j in range(i, min(i + 500, first + n))])
    info = await wal.rotate()
    await wal.close()
    return info


def test_object_keys_carry_their_offsets():
    key = object_key("/default/t-part-1", 5, 99)
    assert key == ("storage/topics/default/t-part-1/segments/"
                   "data-00000000000000000005-00000000000000000099.dnb1")
    assert parse_object_key(key) == (5, 99)
    assert segment_id(key) == "data-00000000000000000005-00000000000000000099"
    assert parse_object_key("storage/topics/default/t/segments/other") is None


def test_catalog_locates_and_refuses_overlap():
    mk = lambda s, e: SegmentDescriptor(f"d{s}", f"k{s}", s, e, 10, None, 0.0)  # noqa: E731
    cat = Catalog([mk(10, 19), mk(0, 9), mk(30, 39)])
    assert cat.end_offset == 39 and cat.first_offset == 0
    assert cat.locate(15).start_offset == 10
    assert cat.locate(25) is None
    assert cat.next_start_after(25) == 30
    assert cat.next_start_after(39) is None
    with pytest.raises(ValueError):
        cat.add(mk(35, 50))
    desc = mk(40, 49)
    assert SegmentDescriptor.from_json(desc.to_json()) == desc
    assert SegmentDescriptor.from_json({"bogus": 1}) is None


async def test_upload_then_read_back_every_offset_in_small_chunks(tmp_path):
    info = await _sealed_segment(tmp_path, 2600, first=1000)
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, info.first_offset,
                          info.last_offset, info.size)
    assert (desc.start_offset, desc.end_offset, desc.size) == (1000, 3599, info.size)
    assert [o for o, _ in desc.offset_index] == [1000, 2000, 3000]
    for offset in (1000, 1001, 1999, 2000, 2500, 3599):
        for chunk in (64, 4096, 1 << 20):
            got = read_history(store, desc, offset, max_bytes=chunk)
            assert got[0] == (offset, _payload(offset))
            assert [o for o, _ in got] == list(range(offset, offset + len(got)))
            assert all(p == _payload(o) for o, p in got)


async def test_read_history_with_a_coarse_index_walks_forward(tmp_path):
    info = await _sealed_segment(tmp_path, 1500)
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, 0, 1499, info.size)
    bare = SegmentDescriptor(desc.segment_id, desc.object_key, 0, 1499, desc.size, None, 0.0)
    got = read_history(store, bare, 1234, max_bytes=2000)
    assert got[0] == (1234, _payload(1234))


def test_walk_frames_finds_where_the_complete_frames_end():
    frames = [encode_frame(40 + i, b"p" * i) for i in range(10)]
    data = b"".join(frames)
    ends = [sum(len(f) for f in frames[:k]) for k in range(11)]
    assert walk_frames(data, 0, len(data), 40) == (10, len(data), SCAN_CLEAN)
    assert walk_frames(data, 0, len(data), 40, 3) == (3, ends[3], SCAN_CLEAN)
    assert walk_frames(data, ends[2], len(data), 42) == (8, len(data), SCAN_CLEAN)
    assert walk_frames(data, 0, len(data) - 1, 40) == (9, ends[9], SCAN_TORN)
    assert walk_frames(data, 0, ends[5] + 7, 40) == (5, ends[5], SCAN_TORN)   # header cut
    assert walk_frames(data, 0, len(data), 41) == (0, 0, SCAN_GAP)
    bad = bytearray(data)
    bad[ends[4] + 8:ends[4] + 12] = (1 << 31).to_bytes(4, "little")
    assert walk_frames(bytes(bad), 0, len(data), 40) == (4, ends[4], SCAN_CORRUPT)
    bad = bytearray(data)
    bad[ends[6] + 20] ^= 0xFF                    # payloads are not read: no CRC check
    assert walk_frames(bytes(bad), 0, len(data), 40) == (10, len(data), SCAN_CLEAN)

def _read_all(reader, store, batch=7):
    """Every message a SegmentReader yields, its ranges fetched from ``store`` in order."""
    out = []
    while (rng := reader.next_range()) is not None:
        for chunk in reader.feed(*rng, store.get(reader.desc.object_key, *rng)):
            while got := chunk.read(batch):
                out += got
    return out


async def test_segment_reader_ranges_need_not_fall_on_frame_boundaries(tmp_path):
    info = await _sealed_segment(tmp_path, 2600, first=1000)
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, 1000, 3599, info.size)
    for offset in (1000, 1001, 2000, 3598):
        for step in (13, 100, 4096, 100_000, 1 << 20):
            reader = SegmentReader("dict store", desc, offset, step)
            got = _read_all(reader, store)
            assert [o for o, _ in got] == list(range(offset, 3600)), (offset, step)
            assert all(p == _payload(o) for o, p in got)


async def test_frames_bigger_than_a_range_are_assembled(tmp_path):
    big = [bytes([i % 251]) * (70_000 + 1000 * i) for i in range(12)]
    wal = await WAL.open(tmp_path / "wal", WALConfig(durability="none"))
    wal.append(big[:5])
    wal.append([b"small"] * 3)
    wal.append(big[5:])
    info = await wal.rotate()
    await wal.close()
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, 0, 14, info.size)
    expected = big[:5] + [b"small"] * 3 + big[5:]
    for step in (5, 4096, 65_536, 100_000):
        reader = SegmentReader("dict store", desc, 0, step)
        assert [p for _, p in _read_all(reader, store, 3)] == expected
        got = read_history(store, desc, 6, max_bytes=step)
        assert got[0] == (6, b"small")


async def test_a_damaged_object_is_reported_with_its_key_and_byte_position(tmp_path):
    info = await _sealed_segment(tmp_path, 3000)
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, 0, 2999, info.size)
    _, positions, _, _ = scan_frames(store.objects[desc.object_key])
    good = store.objects[desc.object_key]
    at = int(positions[1500])

    def damaged(patch_at, patch):
        data = bytearray(good)
        data[patch_at:patch_at + len(patch)] = patch
        store.objects[desc.object_key] = bytes(data)

    damaged(at + 20, b"\xff")                       # a payload byte: CRC mismatch
    reader = SegmentReader("dict store", desc, 0, 64 << 10)
    got = []
    with pytest.raises(SegmentUploadError) as err:
        _read_all_into(reader, store, got)
    assert [o for o, _ in got] == list(range(1500))          # everything before the damage
    assert desc.object_key in str(err.value) and f"byte {at} " in str(err.value)
    assert "CRC mismatch" in str(err.value)
    with pytest.raises(SegmentUploadError, match=f"byte {at} "):
        read_history(store, desc, 1500)
    assert read_history(store, desc, 1400, max_bytes=1 << 20)[-1][0] == 1499

    damaged(at, (7).to_bytes(8, "little"))           # a misnumbered frame
    with pytest.raises(SegmentUploadError, match=f"offset 7 at byte {at},"):
        _read_all_into(SegmentReader("dict store", desc, 0, 64 << 10), store, [])
    damaged(at + 8, (1 << 31).to_bytes(4, "little"))  # an impossible length
    with pytest.raises(SegmentUploadError, match=f"impossible frame length at byte {at}"):
        _read_all_into(SegmentReader("dict store", desc, 0, 64 << 10), store, [])

    store.objects[desc.object_key] = good[:-10]      # shorter than the catalogue says
    with pytest.raises(SegmentUploadError, match=f"ends at byte {desc.size - 10}"):
        _read_all_into(SegmentReader("dict store", desc, 2900, 64 << 10), store, [])
    cut = dataclasses.replace(desc, size=desc.size - 10)   # a frame cut short at the end
    with pytest.raises(SegmentUploadError, match="last frame.*cut short"):
        _read_all_into(SegmentReader("dict store", cut, 2900, 64 << 10), store, [])
    store.objects[desc.object_key] = good
    wrong_end = dataclasses.replace(desc, end_offset=3005)
    with pytest.raises(SegmentUploadError, match="ends at offset 2999, the catalogue says 3005"):
        _read_all_into(SegmentReader("dict store", wrong_end, 2900, 64 << 10), store, [])


def _read_all_into(reader, store, out):
    while (rng := reader.next_range()) is not None:
        for chunk in reader.feed(*rng, store.get(reader.desc.object_key, *rng)):
            while got := chunk.read(100):
                out += got


async def _segments(tmp_path, store, sizes, first=0):
    """Upload consecutive sealed segments of the given message counts; their descriptors."""
    wal = await WAL.open(tmp_path / "wal", WALConfig(durability="none"), start_offset=first)
    descs = []
    off = first
    for n in sizes:
        for i in range(off, off + n, 500):
            wal.append([_payload(j) for j in range(i, min(i + 500, off + n))])
        seg = await wal.rotate()
        descs.append(upload_segment(store, "/default/t", seg.path, seg.first_offset,
                                    seg.last_offset, seg.size))
        off += n
    await wal.close()
    return descs


async def test_history_cursor_streams_across_segments_with_gets_in_flight(tmp_path, monkeypatch):
    import danube.storage.tiered.history as history

    store = DictStore()
    descs = await _segments(tmp_path, store, [2500, 40, 3000])
    monkeypatch.setattr(history, "READ_CHUNK", 16 << 10)
    monkeypatch.setattr(history, "READ_AHEAD", 32 << 10)
    tier = _Tier(store, Catalog(descs))
    tier.tiered.executor = concurrent.futures.ThreadPoolExecutor(4)
    store.delay = 0.002
    woke = asyncio.Event()
    cursor = HistoryCursor(tier, woke.set)
    got = await _drain(cursor, 0, 5540, woke)
    assert [o for o, _ in got] == list(range(5540))
    assert all(p == _payload(o) for o, p in got)
    stats = tier.tiered.stats
    assert stats["history_messages"] == 5540 and stats["read_failures"] == 0
    assert stats["history_reads"] == store.gets
    assert store.max_in_flight == history.MAX_IN_FLIGHT == 2
    # A GET failing in the middle of the stream: retried, nothing skipped or repeated.
    monkeypatch.setattr(history, "RETRY_FIRST", 0.01)
    got = await _drain(cursor, 0, 1000, woke)
    store.fail = 1
    got += await _drain(cursor, got[-1][0] + 1, 5540, woke)
    assert [o for o, _ in got] == list(range(5540)) and stats["read_failures"] == 1
    store.delay = 0.0
    # Reading again from the middle, then jumping back, then ahead: each starts over there.
    got = await _drain(cursor, 2510, 2600, woke)
    assert got[0] == (2510, _payload(2510)) and got[-1][0] >= 2599
    got = await _drain(cursor, 100, 200, woke)
    assert got[0][0] == 100
    got = await _drain(cursor, 4000, 4100, woke)
    assert got[0][0] == 4000
    cursor.close()


async def test_history_cursor_waits_out_a_damaged_object(tmp_path, monkeypatch, caplog):
    import danube.storage.tiered.history as history

    monkeypatch.setattr(history, "RETRY_FIRST", 0.05)
    store = DictStore()
    (desc,) = await _segments(tmp_path, store, [3000])
    good = store.objects[desc.object_key]
    _, positions, _, _ = scan_frames(good)
    at = int(positions[2000])
    store.objects[desc.object_key] = good[:at + 30] + b"\x00" + good[at + 31:]
    tier = _Tier(store, Catalog([desc]))
    woke = asyncio.Event()
    cursor = HistoryCursor(tier, woke.set)
    out, offset = [], 0
    while tier.tiered.stats["read_failures"] < 2:
        got = cursor.read(offset, 256, 3000)
        if got is None:
            await asyncio.wait_for(woke.wait(), 10)
            woke.clear()
            continue
        out += got
        offset = got[-1][0] + 1
    assert offset == 2000 and [o for o, _ in out] == list(range(2000))
    assert f"{desc.object_key} is damaged: a CRC mismatch at byte {at}" in caplog.text
    store.objects[desc.object_key] = good                  # repaired: it goes on
    out += await _drain(cursor, 2000, 3000, woke)
    assert [o for o, _ in out] == list(range(3000))
    cursor.close()


async def test_a_retried_upload_adopts_the_existing_object(tmp_path):
    info = await _sealed_segment(tmp_path, 100)
    store = DictStore()
    first = upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    again = upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    assert again.object_key == first.object_key and len(store.objects) == 1


@pytest.mark.parametrize("kind", ["dict", "fs"])
@pytest.mark.parametrize("orphan", ["shorter", "same size"])
async def test_an_earlier_owners_unrecorded_upload_is_replaced(tmp_path, kind, orphan, caplog):
    """A previous owner killed between its PUT and its catalogue write left an object at
    the key of this owner's next segment, holding other messages: it is replaced, not
    adopted (even at the same size) and not refused (which stopped the uploads for good)."""
    info = await _sealed_segment(tmp_path, 100)
    with open(info.path, "rb") as f:
        ours = f.read(info.size)
    store = DictStore() if kind == "dict" else FsObjectStore(str(tmp_path / "store"))
    key = object_key("/default/t", 0, 99)
    theirs = bytes(b ^ 0xFF for b in ours) if orphan == "same size" else ours[:-7]
    store.put(key, theirs)
    desc = upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    assert desc.object_key == key and store.get(key) == ours
    assert "no catalogue names" in caplog.text


@pytest.mark.parametrize("kind", ["dict", "fs"])
async def test_a_corrupt_segment_is_not_uploaded(tmp_path, kind):
    info = await _sealed_segment(tmp_path, 100)
    with open(info.path, "r+b") as f:
        f.seek(info.size // 2)
        f.write(b"\xff\xff\xff")
    store = DictStore() if kind == "dict" else FsObjectStore(str(tmp_path / "store"))
    with pytest.raises(SegmentUploadError, match="not clean"):
        upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    assert not store.list("")


async def test_the_fs_store_keeps_a_sealed_segment_as_a_hard_link(tmp_path):
    info = await _sealed_segment(tmp_path, 2600)
    store = FsObjectStore(str(tmp_path / "store"))
    desc = upload_segment(store, "/default/t", info.path, 0, 2599, info.size)
    obj = os.path.join(store.root, *desc.object_key.split("/"))
    assert os.path.samefile(obj, info.path)
    assert store.head(desc.object_key) == ObjectInfo(desc.object_key, info.size, desc.etag)
    got = read_history(store, desc, 1234, max_bytes=1 << 20)
    assert got[0] == (1234, _payload(1234)) and got[-1] == (2599, _payload(2599))
    # A retry (the catalogue write was lost) adopts the object; the local file can go.
    again = upload_segment(store, "/default/t", info.path, 0, 2599, info.size)
    assert again.object_key == desc.object_key and again.etag == desc.etag
    os.unlink(info.path)
    assert read_history(store, desc, 0)[0] == (0, _payload(0))
    # An unconditional put of a sealed file replaces the object, also by a link.
    other = await _sealed_segment(tmp_path / "b", 10)
    assert store.put_sealed_file("x/y", other.path, other.size).size == other.size
    assert os.path.samefile(os.path.join(store.root, "x", "y"), other.path)
    assert not [p for p in Path(store.root).rglob(TMP_PREFIX + "*")]


@pytest.mark.parametrize("why", ["other-filesystem", "longer-file"])
async def test_the_fs_store_copies_a_segment_it_cannot_link(tmp_path, monkeypatch, why):
    info = await _sealed_segment(tmp_path, 500)
    size = info.size
    if why == "other-filesystem":
        real_link = os.link

        def link(src, dst, **kw):
            if os.path.samefile(src, info.path):
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src)
            return real_link(src, dst, **kw)
        monkeypatch.setattr(os, "link", link)
    else:
        with open(info.path, "ab") as f:     # only the first `size` bytes are the segment
            f.write(b"tail")
    store = FsObjectStore(str(tmp_path / "store"))
    desc = upload_segment(store, "/default/t", info.path, 0, 499, size)
    obj = os.path.join(store.root, *desc.object_key.split("/"))
    assert not os.path.samefile(obj, info.path)
    with open(info.path, "rb") as f:
        assert Path(obj).read_bytes() == f.read(size)
    assert read_history(store, desc, 0)[0] == (0, _payload(0))


class _Tier:
    def __init__(self, store, catalog):
        import concurrent.futures

        self.name = "/default/t"
        self.catalog = catalog
        self.counts = {"segments_read": 0, "read_bytes": 0}

        class _Tiered:
            objstore = store
            stats = {"read_failures": 0, "history_reads": 0, "history_messages": 0}
            read_errors = {}
            executor = concurrent.futures.ThreadPoolExecutor(1)

            async def run(self, fn, *args):
                return await asyncio.get_running_loop().run_in_executor(self.executor, fn,
                                                                        *args)
        self.tiered = _Tiered()


async def _drain(cursor, start, local_first, woke):
    out, offset = [], start
    while offset < local_first:
        got = cursor.read(offset, 300, local_first)
        if got is None:
            await asyncio.wait_for(woke.wait(), 30)
            woke.clear()
            continue
        out += got
        offset = got[-1][0] + 1
    return out


async def test_history_cursor_streams_and_retries_failures(tmp_path):
    info = await _sealed_segment(tmp_path, 3000)
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, 0, 2999, info.size)
    tier = _Tier(store, Catalog([desc]))
    woke = asyncio.Event()
    cursor = HistoryCursor(tier, woke.set)
    store.fail = 2
    got = await _drain(cursor, 0, 3000, woke)
    assert [o for o, _ in got] == list(range(3000))
    assert tier.tiered.stats["read_failures"] == 2
    cursor.close()


async def test_history_cursor_reports_what_the_durable_tier_lacks(tmp_path):
    info = await _sealed_segment(tmp_path, 100, first=500)
    store = DictStore()
    desc = upload_segment(store, "/default/t", info.path, 500, 599, info.size)
    tier = _Tier(store, Catalog([desc]))
    woke = asyncio.Event()
    cursor = HistoryCursor(tier, woke.set)
    assert cursor.read(10, 100, 700) is None
    await asyncio.wait_for(woke.wait(), 10)
    with pytest.raises(OffsetTruncatedError) as err:
        cursor.read(10, 100, 700)
    assert err.value.first_offset == 500
    cursor.close()


def _load(tmp_path, text):
    from danube.config import load_config

    path = tmp_path / "broker.yml"
    path.write_text(text)
    return load_config(str(path))


def test_storage_modes_from_the_broker_yaml(tmp_path):
    cfg = _load(tmp_path, "storage:\n  mode: shared_fs\n  durable:\n    root: /mnt/x\n"
                          "    upload_interval_seconds: 2.5\n")
    assert cfg.storage_mode == "shared_fs"
    assert cfg.durable.backend == "fs" and cfg.durable.upload_interval_seconds == 2.5
    cfg = _load(tmp_path, "storage:\n  mode: object_store\n  durable:\n    backend: s3\n"
                          "    root: s3://b/p\n")
    assert (cfg.durable.backend, cfg.durable.bucket, cfg.durable.prefix) == ("s3", "b", "p")
    assert cfg.durable.upload_interval_seconds == 300
    cfg = _load(tmp_path, "storage:\n  durable:\n    backend: s3\n    root: s3://b/p\n")
    assert cfg.storage_mode == "local" and cfg.durable is None


@pytest.mark.parametrize("text, names", [
    ("storage:\n  mode: tiered\n", "storage.mode"),
    ("storage:\n  mode: object_store\n", "storage.durable"),
    ("storage:\n  mode: object_store\n  durable:\n    root: /x\n", "storage.durable.backend"),
    ("storage:\n  mode: shared_fs\n  durable:\n    backend: s3\n    root: s3://b\n",
     "storage.durable.backend"),
    ("storage:\n  metadata_prefix: danube\n", "storage.metadata_prefix"),
    ("storage:\n  mode: shared_fs\n  durable:\n    root: /x\n"
     "    upload_interval_seconds: 0\n", "upload_interval_seconds"),
])
def test_bad_storage_sections_name_the_key(tmp_path, text, names):
    from danube.config import ConfigError

    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        _load(tmp_path, text)


async def test_topics_are_exported_on_their_own_phase_of_the_interval(tmp_path):
    """Exports are spread over the upload interval, each topic on a fixed phase of it, so the
    topics' segments are not all sealed in the same millisecond (see the manager's
    docstring); each topic still goes up once per interval."""
    from danube.metadata.memory import MemoryStore
    from danube.storage.durable.config import DurableConfig
    from danube.storage.durable.memory import MemoryObjectStore
    from danube.storage.tiered.manager import TieredStorage, export_phase as _phase

    interval = 0.6
    # Two names whose phases are about half an interval apart.
    names = ["/default/spread-0"]
    i = 1
    while True:
        name = f"/default/spread-{i}"
        gap = (_phase(name, interval) - _phase(names[0], interval)) % interval
        if 0.4 * interval < gap < 0.6 * interval:
            names.append(name)
            break
        i += 1
    metadata = await MemoryStore.open()
    tiered = TieredStorage(DurableConfig(backend="memory", upload_interval_seconds=interval),
                           MemoryObjectStore(), metadata)
    exports = {name: [] for name in names}
    wals = []
    try:
        for name in names:
            tier = await tiered.load_topic(name, wal_missing=True)
            assert 0 < tier.next_export - time.monotonic() <= interval
            wal = await WAL.open(tmp_path / name.rsplit("/", 1)[1], WALConfig())
            wals.append(wal)
            tier.wal = wal
            real = tier.export

            async def export(real=real, name=name, **kw):
                exports[name].append(time.monotonic())
                return await real(**kw)
            tier.export = export
        scheduled = {name: [] for name in names}
        next_slot = tiered._next_slot

        def recording_next_slot(tier, now):
            slot = next_slot(tier, now)
            scheduled[tier.name].append(slot)
            return slot
        tiered._next_slot = recording_next_slot
        tiered.start()
        # Until each topic has gone up 4 times (a deadline, not a duration: slow machines).
        deadline = time.monotonic() + 60
        while min(len(t) for t in exports.values()) < 4 and time.monotonic() < deadline:
            for wal in wals:
                await wal.append_durable([b"m" * 100])
            await asyncio.sleep(0.01)
        # Ordering, not timing (a loaded machine wakes the loop late): each topic is exported
        # at most once per slot of its own grid (phase + k * interval) ...
        for name, times in exports.items():
            assert len(times) >= 4, (name, times)
            slots = [int((t - _phase(name, interval)) // interval) for t in times]
            assert slots == sorted(set(slots)), (name, slots, times)
        # ... and every export was scheduled on the topic's own grid, so the two topics, half
        # an interval apart, are due at different instants (a machine too loaded to wake in
        # time may still run both in one pass: the schedule is what the manager controls).
        for name, due in scheduled.items():
            assert len(due) >= 3, (name, due)
            for t in due:
                k = (t - _phase(name, interval)) / interval
                assert abs(k - round(k)) < 1e-6, (name, t, due)
        for wal in wals:
            assert wal.segments()[0].sealed_at is not None
    finally:
        await tiered.close()
        for wal in wals:
            await wal.close()
        await metadata.close()
