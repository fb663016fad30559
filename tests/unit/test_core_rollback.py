"""A request that fails half-way takes back what it did (issue 17): the metadata store fails
one write, and afterwards nothing of the failed request is left, in memory, in metadata or on
disk, so the same request succeeds once the store works again."""

import os

import pytest

from danube.broker.core import BrokerCore
from danube.broker.registry import ClientRegistry
from danube.broker.subscription import EXCLUSIVE
from danube.broker.topic import RELIABLE
from danube.config import BrokerConfig
from danube.metadata import keys
from danube.metadata.memory import MemoryStore


class StoreDown(Exception):
    pass


@pytest.fixture
async def core(tmp_path):
    store = await MemoryStore.open()
    core = BrokerCore(BrokerConfig(data_dir=str(tmp_path)), store, ClientRegistry())
    await core.start()
    yield core
    await core.stop()
    await store.close()


def fail_puts(core, monkeypatch, predicate):
    """Writes of a key ``predicate`` picks fail, alone or among others (put_many)."""
    real, real_many = core.store.put, core.store.put_many

    async def put(key, *args, **kwargs):
        if predicate(key):
            raise StoreDown(key)
        return await real(key, *args, **kwargs)

    async def put_many(items, *args, **kwargs):
        items = dict(items)
        if any(predicate(key) for key in items):
            raise StoreDown(items)
        return await real_many(items, *args, **kwargs)
    monkeypatch.setattr(core.store, "put", put)
    monkeypatch.setattr(core.store, "put_many", put_many)

    def restore():
        monkeypatch.setattr(core.store, "put", real)
        monkeypatch.setattr(core.store, "put_many", real_many)
    return restore


async def test_failed_subscribe_leaves_no_consumer_or_subscription(core, monkeypatch):
    topic = "/default/sub-rollback"
    await core.create_topic(topic, RELIABLE)
    restore = fail_puts(core, monkeypatch,
                        lambda k: k == keys.topic_subscription(topic, "s"))
    with pytest.raises(StoreDown):
        await core.subscribe(topic, "first", "s", EXCLUSIVE)
    assert not core.consumers and not core.topics[topic].subscriptions
    assert not await core.store.keys(keys.topic_subscription(topic, "s"))
    restore()
    # Exclusive: a consumer left behind would refuse this one.
    assert await core.subscribe(topic, "second", "s", EXCLUSIVE)


async def test_failed_producer_removes_the_topic_it_created(core, monkeypatch):
    topic = "/default/producer-rollback"
    restore = fail_puts(core, monkeypatch, lambda k: "/producers/" in k)
    with pytest.raises(StoreDown):
        await core.create_producer(topic, "p", RELIABLE)
    assert topic not in core.topics and not core.producers
    assert topic not in await core.namespace_topics("default")
    assert not os.path.exists(os.path.join(core.wal_root, "default", "producer-rollback"))
    restore()
    assert await core.create_producer(topic, "p", RELIABLE)
    assert topic in await core.namespace_topics("default")


async def test_failed_topic_creation_records_nothing(core, monkeypatch):
    topic = "/default/create-rollback"
    restore = fail_puts(core, monkeypatch, lambda k: k == keys.topic_delivery(topic))
    with pytest.raises(StoreDown):
        await core.create_topic(topic, RELIABLE)
    assert topic not in core.topics
    assert topic not in await core.namespace_topics("default")
    restore()
    await core.create_topic(topic, RELIABLE)


async def test_failed_partition_removes_the_ones_before_it(core, monkeypatch):
    base = "/default/part-rollback"
    restore = fail_puts(core, monkeypatch,
                        lambda k: k == keys.namespace_topic(f"{base}-part-2"))
    with pytest.raises(StoreDown):
        await core.create_partitioned_topic(base, 4)
    assert await core.partitions(base) == []
    restore()
    assert len(await core.create_partitioned_topic(base, 4)) == 4
