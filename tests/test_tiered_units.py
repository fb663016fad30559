"""Tiered storage pieces on their own: the catalogue, uploading a sealed segment (checked,
conditional, adopted on retry), reading history back through the sparse index in chunks of
any size, and a subscription's history cursor riding out store failures."""

import asyncio
import threading

import pytest

from danube.storage.durable.base import (ObjectExists, ObjectInfo, ObjectNotFound,
                                         ObjectStore, ObjectStoreError)
from danube.storage.errors import OffsetTruncatedError
from danube.storage.tiered.catalog import (Catalog, SegmentDescriptor, object_key,
                                           parse_object_key)
from danube.storage.tiered.history import HistoryCursor
from danube.storage.tiered.segments import (SegmentUploadError, read_history,
                                            upload_segment)
from danube.storage.wal import WAL, WALConfig


class DictStore(ObjectStore):
    backend = "dict"

    def __init__(self):
        self.objects = {}
        self.gets = 0
        self.fail = 0              # the next `fail` calls raise
        self.lock = threading.Lock()

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
        self.gets += 1
        if key not in self.objects:
            raise ObjectNotFound(key)
        return self.objects[key][start:end]

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


async def test_a_retried_upload_adopts_the_existing_object(tmp_path):
    info = await _sealed_segment(tmp_path, 100)
    store = DictStore()
    first = upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    again = upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    assert again.object_key == first.object_key and len(store.objects) == 1
    store.objects[first.object_key] = b"different"
    with pytest.raises(SegmentUploadError, match="refusing to overwrite"):
        upload_segment(store, "/default/t", info.path, 0, 99, info.size)


async def test_a_corrupt_segment_is_not_uploaded(tmp_path):
    info = await _sealed_segment(tmp_path, 100)
    with open(info.path, "r+b") as f:
        f.seek(info.size // 2)
        f.write(b"\xff\xff\xff")
    store = DictStore()
    with pytest.raises(SegmentUploadError, match="not clean"):
        upload_segment(store, "/default/t", info.path, 0, 99, info.size)
    assert not store.objects


class _Tier:
    def __init__(self, store, catalog):
        import concurrent.futures

        self.name = "/default/t"
        self.catalog = catalog

        class _Tiered:
            objstore = store
            stats = {"read_failures": 0, "history_reads": 0, "history_messages": 0}
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
