"""Segment descriptors are written without an fsync of their own when their segment is
durable in the local WAL (danube.storage.tiered.manager): a descriptor lost to a power cut is
redone by adopting the object already in the store, never by uploading it again; a segment
that is not durable locally (durability ``none``) gets a durable descriptor; and local
retention deletes uploaded segments only once their descriptors are synced."""

import asyncio

from danube.client import DanubeClient
from danube.metadata import EmbeddedStore, keys
from danube.storage.durable.base import ObjectExists
from danube.storage.tiered.catalog import topic_object_prefix
from tiered_harness import InProcBroker, tiered_tree, upload_in_process
from waiting import async_holds_for
import objstore_servers

TOPIC = "/default/descriptors"
UNSYNCED = "/default/descriptors-unsynced"


def _tree(tmp_path, **kw):
    durable = objstore_servers.durable_config("fs", None, tmp_path, "descriptors")
    tree = tiered_tree(durable, **kw)
    tree["storage"]["wal"] = {"topic_durability": {UNSYNCED: "none"}}
    return tree


def _record_put_many(broker):
    """The ``durable`` argument of every descriptor write, per topic."""
    seen = {}
    metadata = broker.tiered.metadata
    put_many = metadata.put_many

    async def recording(items, ttl=None, *, durable=True):
        items = dict(items)
        for key in items:
            for topic in (TOPIC, UNSYNCED):
                if key.startswith(keys.storage_segments_prefix(topic, broker.tiered.prefix)
                                  + "/"):
                    seen.setdefault(topic, set()).add(durable)
        return await put_many(items, ttl, durable=durable)

    metadata.put_many = recording
    return seen


async def _publish(broker, topic, start, n):
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        await producer.send_many([b"m%06d" % i for i in range(start, start + n)])
    await broker.wait_uploaded(topic, start + n - 1)


async def test_descriptors_are_synced_only_when_their_segment_is_not(tmp_path):
    broker = await InProcBroker(tmp_path, _tree(tmp_path, retention=False)).start()
    try:
        seen = _record_put_many(broker)
        for start in (0, 100):
            await _publish(broker, TOPIC, start, 100)
            await _publish(broker, UNSYNCED, start, 100)
        assert seen == {TOPIC: {False}, UNSYNCED: {True}}
    finally:
        await broker.stop()


class CountingStore:
    """Passes calls to the broker's object store and counts the puts that wrote."""

    def __init__(self, inner):
        self.inner = inner
        self.written = []
        self.refused = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _count(self, put, key, *args, if_absent):
        try:
            info = put(key, *args, if_absent=if_absent)
        except ObjectExists:
            self.refused.append(key)
            raise
        self.written.append(key)
        return info

    def put(self, key, data, *, if_absent=False):
        return self._count(self.inner.put, key, data, if_absent=if_absent)

    def put_file(self, key, path, size, *, if_absent=False):
        return self._count(self.inner.put_file, key, path, size, if_absent=if_absent)

    def put_sealed_file(self, key, path, size, *, if_absent=False):
        return self._count(self.inner.put_sealed_file, key, path, size, if_absent=if_absent)


async def test_a_lost_descriptor_is_adopted_not_uploaded_again(tmp_path):
    """A power cut after an unsynced descriptor commit loses the descriptor but not the
    segment (it was durable locally first): the next export finds the object in the store
    and adopts it. (The upload interval is an hour: the exports are the test's own, never a
    scheduled one that could adopt the object first.)"""
    tree = _tree(tmp_path, interval=3600, retention=False)
    durable = objstore_servers.store_from_config(tree["storage"]["durable"])
    broker = await InProcBroker(tmp_path, tree).start()
    prefix = broker.tiered.prefix
    await _upload_in_segments(broker, 300)
    catalog = list(broker.topic(TOPIC).log.tier.catalog.segments)
    await broker.stop()
    assert len(catalog) == 3
    objects = await asyncio.to_thread(_listing, durable)

    # What a power cut could take: the newest descriptor, and `cur` back to the one before.
    lost, before = catalog[-1], catalog[-2]
    async with await EmbeddedStore.open(broker.data_dir / "metadata") as meta:
        assert await meta.delete(keys.storage_segment(TOPIC, lost.start_offset, prefix))
        await meta.put(keys.storage_segments_cur(TOPIC, prefix),
                       {"start": f"{before.start_offset:020d}",
                        "end_offset": before.end_offset})

    broker = await InProcBroker(tmp_path, tree).start()
    try:
        tier = (await broker.use(TOPIC)).log.tier
        assert tier.uploaded_end == before.end_offset
        counting = CountingStore(broker.tiered.objstore)
        await upload_in_process(broker, counting)
        assert await tier.export(seal=False) == 1
        assert counting.written == [] and counting.refused == [lost.object_key]
        assert tier.uploaded_end == lost.end_offset
        adopted = tier.catalog.segments[-1]
        assert (adopted.object_key, adopted.size, adopted.etag) == \
            (lost.object_key, lost.size, lost.etag)
        assert await asyncio.to_thread(_listing, durable) == objects
        cur = await broker.tiered.metadata.get(keys.storage_segments_cur(TOPIC, prefix))
        assert cur["end_offset"] == lost.end_offset
    finally:
        await broker.stop()
        durable.close()


async def _upload_in_segments(broker, n):
    """``n`` messages in segments of 100, each uploaded by an export of its own."""
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(TOPIC, "p", reliable=True)
        for start in range(0, n, 100):
            await producer.send_many([b"m%06d" % i for i in range(start, start + 100)])
            await broker.topic(TOPIC).log.tier.export()
    assert broker.topic(TOPIC).log.tier.uploaded_end == n - 1


def _listing(store):
    return [(o.key, o.size, o.etag) for o in store.list(topic_object_prefix(TOPIC))]


async def test_retention_waits_for_the_descriptors_to_be_synced(tmp_path):
    """While the metadata cannot sync, uploaded segments stay in the local WAL; once it
    can, retention deletes them."""
    broker = await InProcBroker(tmp_path, _tree(tmp_path)).start()
    try:
        gate = asyncio.Event()
        metadata = broker.tiered.metadata
        sync = metadata.sync
        synced, asked = [], asyncio.Event()

        async def held_sync():
            asked.set()
            await gate.wait()
            await sync()
            synced.append(True)

        metadata.sync = held_sync
        await _upload_in_segments(broker, 300)
        # Retention asks for the sync and waits; meanwhile it deletes nothing, watched over
        # a bounded window of several more passes (one every 0.3 s).
        await asyncio.wait_for(asked.wait(), 15)
        await async_holds_for(lambda: broker.topic(TOPIC).log.first_offset == 0, 1.2,
                              what="the uploaded segments kept in the local WAL")
        gate.set()
        await broker.wait_local_first(TOPIC, 300)
        assert synced
    finally:
        await broker.stop()
