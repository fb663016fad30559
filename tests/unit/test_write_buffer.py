"""The write buffer against real redis-server processes (a primary and a replica): every
acknowledged append is in the stream before the ack, one pipeline and one WAIT per group,
clear errors per on_wait_timeout, a bounded queue, and a new owner's rebuild from the
stream with exact offsets."""

import array
import asyncio
import dataclasses
import os

import pytest

from danube.config_writebuffer import WriteBufferConfig
from danube.metadata.memory import MemoryStore
from danube.storage.durable.config import DurableConfig
from danube.storage.durable.fs import FsObjectStore
from danube.storage.errors import (WriteBufferError, WriteBufferFencedError,
                                   WriteBufferFullError, WriteBufferStartupError)
from danube.storage.tiered.manager import TieredStorage
from danube.storage.topic_log import TopicLog
from danube.storage.wal import WAL, WALConfig
from danube.storage.writebuffer import WriteBuffer
from danube.storage.writebuffer.entries import ENDS, first_of, stream_key, unpack_ends
from danube.storage.writebuffer.recovery import read_tail
from tests.support.ports import free_port
from tests.support.redis_servers import RedisPair, redis_server_binary
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server not installed (bash bin/test installs it)")

TOPIC = "/default/wb"


@pytest.fixture
def redis_pair(tmp_path):
    pair = RedisPair(str(tmp_path / "redis"), replicas=1)
    yield pair
    pair.stop()


def wb_config(url, **kw):
    return WriteBufferConfig(endpoints=(url,), wait_replicas=kw.pop("wait_replicas", 1),
                             wait_timeout_ms=kw.pop("wait_timeout_ms", 2000), **kw)


async def open_log(tmp_path, wb, name="a", durability="always"):
    return await TopicLog.open(TOPIC, str(tmp_path / name), WALConfig(durability=durability),
                               write_buffer=wb)


async def started(cfg):
    wb = WriteBuffer(cfg)
    await wb.start()
    return wb


def stream_offsets(server):
    """Every offset the stream holds, in order (read from the server by the test)."""
    out = []
    with server.client() as c:
        for rid, fields in c.xrange(stream_key(TOPIC), "-", "+"):
            first = first_of(rid)
            out.extend(range(first, first + len(unpack_ends(fields[ENDS]))))
    return out


async def test_acknowledged_appends_are_in_the_primary_and_the_replica(tmp_path, redis_pair):
    wb = await started(wb_config(redis_pair.url))
    log = await open_log(tmp_path, wb)
    try:
        first, last = log.append([b"m%d" % i for i in range(5)])
        await log.sync_to(last)
        first2, last2 = log.append_packed(b"xyzzy", array.array("Q", [2, 5]))
        await log.sync_to(last2)
        assert (first, last, first2, last2) == (0, 4, 5, 6)
        assert log.durable_offset == 6
        # Confirmed means replicated: the replica has every offset too.
        assert stream_offsets(redis_pair.primary) == list(range(7))
        assert stream_offsets(redis_pair.replicas[0]) == list(range(7))
        got = []
        async for batch in read_tail(wb.reader, stream_key(TOPIC), 0):
            got.extend((o, bytes(p)) for o, p in batch)
        assert got == [(i, b"m%d" % i) for i in range(5)] + [(5, b"xy"), (6, b"zzy")]
    finally:
        await log.close()
        await wb.close()


async def test_one_pipeline_and_one_wait_per_group(tmp_path, redis_pair):
    wb = await started(wb_config(redis_pair.url))
    log = await open_log(tmp_path, wb)
    try:
        # 300 publishes arrive before the worker runs: they share passes.
        lasts = [log.append([b"p%d" % i])[1] for i in range(300)]
        await asyncio.gather(*(log.sync_to(last) for last in lasts))
        assert wb.stats["entries"] == 300
        assert wb.stats["passes"] <= 2, wb.stats
        assert stream_offsets(redis_pair.replicas[0]) == list(range(300))
    finally:
        await log.close()
        await wb.close()


async def confirmed(log, last):
    """``last`` confirmed: with a short wait_timeout a loaded machine's replica may answer
    WAIT late (WriteBufferError), and the entry is then written again in the background."""
    try:
        await log.sync_to(last)
    except WriteBufferError:
        await async_wait_for(lambda: log.durable_offset >= last, timeout=60,
                             what=f"offset {last} confirmed by the replica")


async def test_wait_timeout_fail_is_a_clear_error_and_retried(tmp_path, redis_pair):
    wb = await started(wb_config(redis_pair.url, wait_timeout_ms=200))
    log = await open_log(tmp_path, wb)
    try:
        await confirmed(log, log.append([b"before"])[1])
        redis_pair.replicas[0].kill()
        _, last = log.append([b"unreplicated"])
        with pytest.raises(WriteBufferError, match=r"WAIT timed out: 0 of 1 replica"):
            await log.sync_to(last)
        # Not confirmed, so not dispatchable: a consumer never sees it before it is safe.
        assert log.durable_offset == 0
        redis_pair.replicas[0].start()
        redis_pair.replicas[0].wait_linked()
        # Retried in the background: it becomes confirmed without another publish.
        await async_wait_for(lambda: log.durable_offset == 1, timeout=60,
                             what="the failed append confirmed after the replica came back")
        await confirmed(log, log.append([b"after"])[1])
        assert stream_offsets(redis_pair.replicas[0]) == [0, 1, 2]
    finally:
        await log.close()
        await wb.close()


async def test_wait_timeout_ack_acknowledges(tmp_path, redis_pair):
    wb = await started(wb_config(redis_pair.url, wait_timeout_ms=100, on_wait_timeout="ack"))
    log = await open_log(tmp_path, wb)
    try:
        redis_pair.replicas[0].kill()
        await log.sync_to(log.append([b"acked anyway"])[1])
        assert wb.stats["wait_timeouts"] >= 1
        assert stream_offsets(redis_pair.primary) == [0]
    finally:
        await log.close()
        await wb.close()


async def test_primary_down_fails_cleanly_then_resumes_without_holes(tmp_path, redis_pair):
    wb = await started(wb_config(redis_pair.url))
    log = await open_log(tmp_path, wb)
    primary = redis_pair.primary
    try:
        await log.sync_to(log.append([b"a"])[1])
        primary.kill()
        _, last = log.append([b"b"])
        with pytest.raises(WriteBufferError):
            await log.sync_to(last)
        primary.start()
        redis_pair.replicas[0].wait_linked()
        await log.sync_to(log.append([b"c"])[1])
        # The failed append was written again: the stream has no hole.
        assert stream_offsets(primary) == [0, 1, 2]
        await async_wait_for(lambda: stream_offsets(redis_pair.replicas[0]) == [0, 1, 2],
                             what="the replica has every offset")
    finally:
        await log.close()
        await wb.close()


async def test_queue_is_bounded_and_a_refused_append_stores_nothing(tmp_path, redis_pair):
    cfg = dataclasses.replace(wb_config(redis_pair.url), max_pending_bytes=1 << 20)
    wb = await started(cfg)
    log = await open_log(tmp_path, wb)
    try:
        redis_pair.primary.kill()
        big = b"x" * (600 << 10)
        log.append([big])                 # one append always fits
        before = log.next_offset
        with pytest.raises(WriteBufferFullError, match="max_pending_bytes"):
            log.append([big])
        assert log.next_offset == before   # nothing of it in the WAL
    finally:
        redis_pair.primary.start()
        await log.close()
        await wb.close()


async def test_new_owner_rebuilds_the_log_from_the_stream(tmp_path, redis_pair):
    wb = await started(wb_config(redis_pair.url))
    log = await open_log(tmp_path, wb, "owner1")
    for i in range(50):
        await log.sync_to(log.append([b"msg-%d" % j for j in range(i * 3, i * 3 + 3)])[1])
    # The owner's disk is gone: another broker opens the topic on an empty directory.
    log.buffer.detach()
    await log.wal.close()
    wb2 = await started(wb_config(redis_pair.url))
    log2 = await open_log(tmp_path, wb2, "owner2")
    try:
        assert log2.next_offset == 150
        got = log2.read(0, 1000)
        assert [(o, bytes(p)) for o, p in got] == [(i, b"msg-%d" % i) for i in range(150)]
        # It continues at the exact next offset, and the stream stays contiguous.
        assert log2.append([b"next"]) == (150, 150)
        await log2.sync_to(150)
        assert stream_offsets(redis_pair.primary) == list(range(151))
    finally:
        await log2.close()
        await wb.close()
        await wb2.close()


async def test_a_later_owner_fences_the_earlier_owners_appends(tmp_path, redis_pair):
    """Ownership epochs: the owner with epoch 1 is still running (paused past its lease, then
    resumed) when the owner with epoch 2 claims the stream and rebuilds from it. Whatever
    the first appends after the claim is refused by the stream's script, its publishes are
    not confirmed, and the stream stays exactly what the new owner rebuilt and appended."""
    wb1 = await started(wb_config(redis_pair.url))
    old = await TopicLog.open(TOPIC, str(tmp_path / "old"), WALConfig(durability="always"),
                              write_buffer=wb1, epoch=1)
    await old.sync_to(old.append([b"a", b"b"])[1])
    wb2 = await started(wb_config(redis_pair.url))
    new = await TopicLog.open(TOPIC, str(tmp_path / "new"), WALConfig(durability="always"),
                              write_buffer=wb2, epoch=2)
    try:
        assert new.next_offset == 2
        _, last = old.append([b"late"])               # offset 2, on the old owner only
        with pytest.raises(WriteBufferFencedError, match="epoch 2"):
            await old.sync_to(last)
        with pytest.raises(WriteBufferFencedError):   # and every later wait at once
            await old.sync_to(old.append([b"later"])[1])
        assert old.durable_offset < 2
        await new.sync_to(new.append([b"c"])[1])       # offset 2, the new owner's
        got = []
        async for batch in read_tail(wb2.reader, stream_key(TOPIC), 0):
            got.extend(bytes(p) for _, p in batch)
        assert got == [b"a", b"b", b"c"]
        # An earlier epoch cannot claim the stream back.
        with pytest.raises(WriteBufferFencedError, match="a later owner"):
            await wb1.claim(TOPIC, 1)
    finally:
        await old.close()
        await new.close()
        await wb1.close()
        await wb2.close()


@pytest.fixture
async def tier_store(tmp_path):
    """What the brokers of a cluster share for the durable tier: the metadata store (the
    catalogue) and the object store's root (the fs store here). Each owner opens its own
    TieredStorage on them (`tier_of`)."""
    metadata = await MemoryStore.open()
    root = str(tmp_path / "durable")
    opened = []

    def tier_of():
        tiered = TieredStorage(DurableConfig(backend="fs", path=root), FsObjectStore(root),
                               metadata)
        opened.append(tiered)
        return tiered

    yield tier_of
    for tiered in opened:
        await tiered.close()
    await metadata.close()


async def test_a_stale_local_wal_is_set_aside_for_the_stream(tmp_path, redis_pair, tier_store):
    """With a durable tier, a former owner getting the topic back after a failover: its local
    WAL ends where the acknowledged log does, but the message it holds there was never
    acknowledged (refused by the stream: a later owner had claimed it) and the later owner
    gave that offset to another message. The WAL is set aside and the log rebuilt from the
    stream: no offset is given twice."""
    wal_cfg = WALConfig(durability="always")
    wb1 = await started(wb_config(redis_pair.url))
    first = await TopicLog.open(TOPIC, str(tmp_path / "first"), wal_cfg, write_buffer=wb1,
                                tiered=tier_store(), epoch=1)
    await first.sync_to(first.append([b"a0", b"a1"])[1])
    wb2 = await started(wb_config(redis_pair.url))
    second = await TopicLog.open(TOPIC, str(tmp_path / "second"), wal_cfg, write_buffer=wb2,
                                 tiered=tier_store(), epoch=2)
    wb3 = None
    back = None
    try:
        # The first owner, paused past its lease, resumes: its append reaches its own disk,
        # never the stream.
        _, late = first.append([b"never-acknowledged"])
        with pytest.raises(WriteBufferFencedError):
            await first.sync_to(late)
        await first.wal.sync_to(late)
        await second.sync_to(second.append([b"b2"])[1])       # offset 2, acknowledged
        assert late == 2
        await second.close()
        await first.close()
        # The topic goes back to the first owner, on its own disk.
        wb3 = await started(wb_config(redis_pair.url))
        back = await TopicLog.open(TOPIC, str(tmp_path / "first"), wal_cfg, write_buffer=wb3,
                                   tiered=tier_store(), epoch=3)
        assert [(o, bytes(p)) for o, p in back.read(0, 10)] == [
            (0, b"a0"), (1, b"a1"), (2, b"b2")]
        assert back.append([b"c3"]) == (3, 3)
        await back.sync_to(3)
        assert stream_offsets(redis_pair.primary) == [0, 1, 2, 3]
        aside = [n for n in os.listdir(tmp_path) if n.startswith("first.stale-")]
        assert len(aside) == 1, os.listdir(tmp_path)
    finally:
        if back is not None:
            await back.close()
        await second.close()
        await first.close()
        for wb in (wb1, wb2, wb3):
            if wb is not None:
                await wb.close()


async def test_without_a_tier_a_short_local_wal_is_extended_from_the_stream(tmp_path,
                                                                           redis_pair):
    """Without a durable tier the local WAL is the history: one that stops short of the
    stream (a copy from before the last appends) is kept and extended from the stream."""
    wb = await started(wb_config(redis_pair.url))
    log = await open_log(tmp_path, wb, "owner")
    await log.sync_to(log.append([b"one", b"two", b"three"])[1])
    log.buffer.detach()
    await log.wal.close()
    # A local WAL that holds the first message only.
    short = await WAL.open(str(tmp_path / "short"), WALConfig(durability="always"))
    short.append([b"one"])
    await short.sync_to()
    await short.close()
    wb2 = await started(wb_config(redis_pair.url))
    log2 = await open_log(tmp_path, wb2, "short")
    try:
        assert [(o, bytes(p)) for o, p in log2.read(0, 10)] == [
            (0, b"one"), (1, b"two"), (2, b"three")]
        assert log2.append([b"four"]) == (3, 3)
        await log2.sync_to(3)
        assert stream_offsets(redis_pair.primary) == [0, 1, 2, 3]
    finally:
        await log2.close()
        await wb.close()
        await wb2.close()


async def test_unreachable_buffer_is_a_startup_error():
    wb = WriteBuffer(wb_config(f"redis://127.0.0.1:{free_port()}"))
    with pytest.raises(WriteBufferStartupError, match="cannot reach redis://127.0.0.1"):
        await wb.start()


async def test_a_replica_url_is_a_startup_error(redis_pair):
    wb = WriteBuffer(wb_config(redis_pair.replicas[0].url))
    with pytest.raises(WriteBufferStartupError, match="not a primary"):
        await wb.start()


async def test_a_reader_behind_the_wal_reads_the_stream(tmp_path, redis_pair):
    """Warm reads: offsets local retention deleted are read back from the stream (no
    durable tier here: the stream is then never trimmed)."""
    wb = await started(wb_config(redis_pair.url))
    log = await open_log(tmp_path, wb)
    try:
        await log.sync_to(log.append([b"old-%d" % i for i in range(10)])[1])
        await log.wal.rotate()
        await log.sync_to(log.append([b"new-%d" % i for i in range(5)])[1])
        deleted = await log.wal.retention(max_bytes=0, force=True)
        assert deleted and log.first_offset == 10
        ready = asyncio.Event()
        reader = log.reader(ready.set)
        assert reader.read(0, 100) is None          # fetching from the stream
        await asyncio.wait_for(ready.wait(), 30)
        got = reader.read(0, 100)
        assert [(o, bytes(p)) for o, p in got] == [(i, b"old-%d" % i) for i in range(10)]
        assert [bytes(p) for _, p in reader.read(10, 100)] == [b"new-%d" % i for i in range(5)]
        assert log.buffer.warm_reads == 10
        reader.close()
    finally:
        await log.close()
        await wb.close()


@pytest.fixture
def redis_cluster(tmp_path):
    from tests.support.redis_servers import RedisClusterServers

    cluster = RedisClusterServers(str(tmp_path / "rcluster"))
    yield cluster
    cluster.stop()


async def test_redis_cluster_topics_on_several_primaries(tmp_path, redis_cluster):
    """Several endpoints are a Redis Cluster (as upstream): each topic's stream on the
    primary of its slot, each primary written with its own WAIT; a new owner rebuilds
    from it."""
    from danube.storage.writebuffer.entries import stream_key as key_of

    cfg = WriteBufferConfig(endpoints=tuple(redis_cluster.urls), wait_replicas=1,
                            wait_timeout_ms=2000)
    wb = await started(cfg)
    names = [f"/default/rc-{i}" for i in range(8)]
    logs = [await TopicLog.open(n, str(tmp_path / f"t{i}"), WALConfig(), write_buffer=wb)
            for i, n in enumerate(names)]
    try:
        lasts = [log.append([b"%s-%d" % (log.name.encode(), j) for j in range(20)])[1]
                 for log in logs]
        await asyncio.gather(*(log.sync_to(last) for log, last in zip(logs, lasts)))
        homes = set()
        for log in logs:
            node = wb.reader.get_node_from_key(key_of(log.name))
            homes.add(node.port)
            server = next(s for s in redis_cluster.servers if s.port == node.port)
            with server.client() as c:
                assert c.xlen(key_of(log.name)) == 1
        assert len(homes) > 1                  # the topics are spread over primaries
        for log in logs:
            log.buffer.detach()
            await log.wal.close()
        wb2 = await started(cfg)
        log2 = await TopicLog.open(names[3], str(tmp_path / "other"), WALConfig(),
                                   write_buffer=wb2)
        assert [bytes(p) for _, p in log2.read(0, 100)] == \
            [b"/default/rc-3-%d" % j for j in range(20)]
        await log2.close()
        await wb2.close()
    finally:
        await wb.close()


async def test_without_a_durable_tier_the_stream_keeps_the_last_segments(tmp_path, redis_pair):
    """Upstream's rule when nothing is uploaded: the active segment and the last
    max_cached_closed_segments closed ones stay in the stream, applied by retention."""
    wb = await started(dataclasses.replace(wb_config(redis_pair.url),
                                           max_cached_closed_segments=1))
    log = await open_log(tmp_path, wb)
    try:
        for k in range(4):               # four closed segments of 10, then an active one
            await log.sync_to(log.append([b"s%d-%d" % (k, i) for i in range(10)])[1])
            await log.wal.rotate()
        await log.sync_to(log.append([b"active"])[1])
        await log.retention()
        await async_wait_for(lambda: stream_offsets(redis_pair.primary) == list(range(30, 41)),
                             what="the stream trimmed to the last closed segment and the "
                                  "active one")
    finally:
        await log.close()
        await wb.close()


async def test_the_clients_are_made_without_a_library_warning(redis_pair):
    """redis-py warned at every start with a write buffer ("A synchronous
    redis.retry.Retry was passed to an asyncio client"): the clients take redis.asyncio's
    own Retry."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wb = WriteBuffer(wb_config(redis_pair.url))
        await wb.start()
        await wb.close()
