"""danube.storage.topic_log: one log per reliable topic over the WAL and the durable tier.

Driven through its public API against a real WAL and the fs durable store: appends read back
from the hot cache, the WAL's segment files and the durable tier, handed over from one to the
next; earliest/latest; retention that keeps what is not uploaded; recovery on reopen,
including a lost and a stale local WAL."""

import asyncio
import os
import shutil

import pytest

from danube.metadata import keys
from danube.metadata.memory import MemoryStore
from danube.storage.durable.config import DurableConfig
from danube.storage.durable.fs import FsObjectStore
from danube.storage.errors import OffsetTruncatedError
from danube.storage.tiered.catalog import CatalogKeys
from danube.storage.tiered.manager import TieredStorage
from danube.storage.topic_log import TopicLog
from danube.storage.wal import WALConfig

TOPIC = "/default/orders"
# Small segments and cache, so a few hundred messages span all three places.
CONFIG = WALConfig(segment_max_bytes=4096, segment_initial_bytes=4096, cache_capacity=16)


def payload(i):
    return b"message %05d " % i + b"x" * 80


@pytest.fixture
async def tiered(tmp_path):
    metadata = await MemoryStore.open()
    root = tmp_path / "durable"
    tiered = TieredStorage(DurableConfig(backend="fs", path=str(root)),
                           FsObjectStore(str(root)), metadata)
    yield tiered
    await tiered.close()
    await metadata.close()


async def append(log, first, n, batch=10):
    for start in range(first, first + n, batch):
        got = await log.append_durable([payload(i) for i in range(start, start + batch)])
        assert got == (start, start + batch - 1)


async def read_all(log, offset, end):
    """Everything from ``offset`` up to ``end`` through one reader, waiting for history."""
    ready = asyncio.Event()
    reader = log.reader(ready.set)
    out = []
    try:
        while offset < end:
            batch = reader.read(offset, 64)
            if batch is None:
                await asyncio.wait_for(ready.wait(), 10)
                ready.clear()
                continue
            assert batch, f"nothing at {offset}"
            out.extend(batch)
            offset = batch[-1][0] + 1
    finally:
        reader.close()
    return out


async def upload_and_trim(log, tiered):
    """Upload every sealed segment, then let retention delete the uploaded ones locally."""
    await log.tier.export()
    deleted = await log.retention(max_bytes=0, keep_from_offset=0, force=True,
                                  durable_ends=await tiered.durable_ends())
    assert deleted
    return deleted


async def test_reads_hand_over_from_the_tier_to_the_wal_files_to_the_hot_cache(tmp_path,
                                                                               tiered):
    log = await TopicLog.open(TOPIC, str(tmp_path / "wal"), CONFIG, tiered=tiered)
    try:
        await append(log, 0, 200)
        await upload_and_trim(log, tiered)
        await append(log, 200, 200)                  # sealed WAL segments, then the cache
        local_first = log.first_offset
        assert 0 < local_first <= 200 < log.latest - CONFIG.cache_capacity
        with pytest.raises(OffsetTruncatedError) as info:
            log.read(0, 10)                          # the local log alone stops here
        assert info.value.first_offset == local_first

        got = await read_all(log, 0, log.next_offset)
        assert got == [(i, payload(i)) for i in range(400)]
        assert tiered.stats["history_messages"] == local_first
        # Starting in the middle of each place works too.
        for start in (local_first // 2, local_first, log.latest - 3):
            got = await read_all(log, start, log.next_offset)
            assert got == [(i, payload(i)) for i in range(start, 400)]
    finally:
        await log.close()


async def test_earliest_and_latest(tmp_path, tiered):
    log = await TopicLog.open(TOPIC, str(tmp_path / "wal"), CONFIG, tiered=tiered)
    try:
        assert (log.earliest, log.latest, log.next_offset) == (0, -1, 0)
        await append(log, 0, 200)
        assert (log.earliest, log.latest) == (0, 199)
        await upload_and_trim(log, tiered)
        assert log.first_offset > 0
        assert (log.earliest, log.latest) == (0, 199)    # the tier still has the start
    finally:
        await log.close()

    local = await TopicLog.open(TOPIC, str(tmp_path / "local"), CONFIG)
    try:
        assert local.tier is None
        await append(local, 0, 200)
        assert await local.retention(max_bytes=0, keep_from_offset=100)
        assert 0 < local.earliest == local.first_offset <= 100
        assert local.latest == 199
        reader = local.reader(lambda: None)
        with pytest.raises(OffsetTruncatedError) as info:
            reader.read(0, 10)                       # no tier: gone
        assert info.value.first_offset == local.first_offset
        assert reader.read(local.first_offset, 1) == [(local.first_offset,
                                                       payload(local.first_offset))]
    finally:
        await local.close()


async def test_retention_keeps_what_is_not_uploaded(tmp_path, tiered):
    log = await TopicLog.open(TOPIC, str(tmp_path / "wal"), CONFIG, tiered=tiered)
    try:
        await append(log, 0, 200)
        await log.wal.rotate()
        # Not in durable_ends (the metadata could not sync): the WAL stays whole.
        assert await log.retention(max_bytes=0, keep_from_offset=200, force=True,
                                   durable_ends={}) == []
        assert log.first_offset == 0
        await log.tier.export(seal=False)
        ends = await tiered.durable_ends()
        # Only what is uploaded goes, whatever keep_from_offset and force say.
        await log.append_durable([payload(200)])
        deleted = await log.retention(max_bytes=0, keep_from_offset=10**9, force=True,
                                      durable_ends=ends)
        assert deleted and deleted[-1].last_offset <= ends[TOPIC] == 199
    finally:
        await log.close()


async def test_reopen_recovers_the_log_and_its_history(tmp_path, tiered):
    directory = str(tmp_path / "wal")
    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    await append(log, 0, 200)
    await upload_and_trim(log, tiered)
    await append(log, 200, 50)
    await log.close()
    assert TOPIC not in tiered.topics                # no uploads of a closed log

    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    try:
        assert log.next_offset == 250 and log.earliest == 0 and log.first_offset > 0
        await append(log, 250, 10)
        assert await read_all(log, 0, 260) == [(i, payload(i)) for i in range(260)]
    finally:
        await log.close()


async def test_a_lost_wal_continues_after_the_durable_history(tmp_path, tiered):
    directory = str(tmp_path / "wal")
    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    await append(log, 0, 100)
    await log.tier.export()
    uploaded = log.tier.uploaded_end
    await log.close()
    shutil.rmtree(directory)

    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    try:
        assert uploaded == 99 and log.next_offset == 100 and log.earliest == 0
        await append(log, 100, 10)
        assert await read_all(log, 0, 110) == [(i, payload(i)) for i in range(110)]
    finally:
        await log.close()


async def test_a_stale_wal_is_moved_aside(tmp_path, tiered):
    directory = str(tmp_path / "wal")
    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    await append(log, 0, 50)
    await log.close()
    shutil.copytree(directory, tmp_path / "backup")
    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    await append(log, 50, 100)
    await log.tier.export()
    await log.close()
    shutil.rmtree(directory)
    shutil.copytree(tmp_path / "backup", directory)  # a restored backup: offsets 0..49 only

    log = await TopicLog.open(TOPIC, directory, CONFIG, tiered=tiered)
    try:
        assert log.next_offset == 150                # not 50: no offset is given twice
        aside = [n for n in os.listdir(tmp_path) if n.startswith("wal.stale-")]
        assert len(aside) == 1
        await append(log, 150, 10)
        assert await read_all(log, 0, 160) == [(i, payload(i)) for i in range(160)]
    finally:
        await log.close()


def test_catalogue_keys_are_upstreams_layout_as_metadata_lists_it():
    """Storage defines its catalogue's keys itself (it does not import the metadata layer);
    they must stay the ones danube.metadata.keys documents."""
    for prefix in ("/danube", "/p/q"):
        ck = CatalogKeys(prefix)
        assert ck.topic_prefix(TOPIC) == keys.storage_topic_prefix(TOPIC, prefix)
        assert ck.segments_prefix(TOPIC) == keys.storage_segments_prefix(TOPIC, prefix)
        for start in (0, 1000, 2**63):
            assert ck.segment(TOPIC, start) == keys.storage_segment(TOPIC, start, prefix)
        assert ck.segments_cur(TOPIC) == keys.storage_segments_cur(TOPIC, prefix)
    assert CatalogKeys().segment(TOPIC, 7) == keys.storage_segment(TOPIC, 7)
    for bad in ("orders", "/default", "/a/b/c", None):
        with pytest.raises(ValueError):
            CatalogKeys().topic_prefix(bad)
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError):
            CatalogKeys().segment(TOPIC, bad)


async def test_a_shared_wal_root_refuses_acks_once_a_later_owner_wrote_its_epoch(tmp_path):
    """storage.failover shared_wal_root: the WAL directory names its owner's epoch; an owner
    that lost its lock (an NFS lease run out while it was paused) and goes on appending is
    refused every ack once a later owner has rewritten the epoch file."""
    from danube.storage.errors import OwnershipLostError
    from danube.storage.ownership import guard_shared_wal, read_epoch, write_epoch

    directory = str(tmp_path / "wal")
    log = await TopicLog.open(TOPIC, directory, WALConfig(durability="always"))
    try:
        write_epoch(directory, 4)
        guard_shared_wal(log, directory, 4)
        assert read_epoch(directory) == 4
        await log.sync_to(log.append([b"a"])[1])
        write_epoch(directory, 5)                   # the next owner opened the log
        with pytest.raises(OwnershipLostError, match="epoch 5; this broker's is 4"):
            await log.sync_to(log.append([b"b"])[1])
    finally:
        await log.close()


async def test_an_earlier_owner_cannot_add_to_the_catalogue(tmp_path, tiered):
    """Ownership epochs in the durable tier: an owner whose epoch was superseded (another
    broker began to own the topic while it was paused) uploads nothing the catalogue then
    names: its descriptor write is conditional on the epoch and refused, the export fails
    with OwnershipLostError, and its object carries its epoch, beside any later owner's."""
    from danube.storage.errors import OwnershipLostError
    from danube.storage.tiered.catalog import CatalogKeys, object_epoch

    meta = tiered.metadata
    epoch_key = CatalogKeys.owner_epoch(TOPIC)
    assert await meta.allocate_id(epoch_key) == 1
    log = await TopicLog.open(TOPIC, str(tmp_path / "wal"), CONFIG, tiered=tiered, epoch=1)
    try:
        await append(log, 0, 100)
        assert await log.tier.export() > 0
        recorded = await meta.scan(tiered.keys.segments_prefix(TOPIC))
        assert all(object_epoch(v["object_key"]) == 1 for k, v in recorded
                   if not k.endswith("/cur"))
        end = log.tier.uploaded_end
        assert await meta.allocate_id(epoch_key) == 2      # the next owner
        await append(log, 100, 50)
        with pytest.raises(OwnershipLostError, match="no longer 1"):
            await log.tier.export()
        assert await meta.scan(tiered.keys.segments_prefix(TOPIC)) == recorded
        assert log.tier.uploaded_end == end
    finally:
        await log.close()
