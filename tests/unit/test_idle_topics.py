"""The topic table's bounds (issue 53): which idle topics are unloaded (the oldest idle
first beyond the bound, every one past the timeout, none in use), one topic however many
ask for it at once, and a stop that closes its topics within its deadline even when one
topic's log never finishes closing."""

import asyncio
import time

import pytest

from danube.broker.core import BrokerCore
from danube.broker.core.idle import SETTLE_SECONDS, IdleTopics
from danube.broker.errors import BrokerShuttingDown
from danube.broker.registry import ClientRegistry
from danube.broker.topic import NON_RELIABLE, RELIABLE
from danube.config import BrokerConfig
from danube.metadata.memory import MemoryStore


@pytest.fixture
async def core(tmp_path):
    store = await MemoryStore.open()
    # Nothing unloaded behind the tests' back: they call IdleTopics.due themselves.
    core = BrokerCore(BrokerConfig(data_dir=str(tmp_path), topic_idle_unload_seconds=0,
                                   topic_max_idle_loaded=10_000), store, ClientRegistry())
    await core.start()
    yield core
    await core.stop()
    await store.close()


class Conn:
    closed = False


async def test_the_oldest_idle_topics_go_first_beyond_the_bound(core):
    topics = [await core.create_topic(f"/default/lru-{i}", RELIABLE) for i in range(5)]
    busy = await core.create_topic("/default/lru-busy", RELIABLE)
    conn = Conn()
    await core.producer_table.create_producer(busy.name, "p", RELIABLE, client=conn)
    idle = IdleTopics(timeout=0, max_idle=2)
    start = 1000.0
    for i, topic in enumerate(topics):          # lru-0 idle first, lru-4 last
        assert idle.due([topic, busy], start + i) == []
    now = start + len(topics) + SETTLE_SECONDS
    assert [t.name for t in idle.due([*topics, busy], now)] == \
        ["/default/lru-0", "/default/lru-1", "/default/lru-2"]
    conn.closed = True                          # its producer's connection went away
    assert idle.due([busy], now) == []          # idle from now on, not settled yet
    assert idle.due([busy], now + SETTLE_SECONDS) == []     # within the bound


async def test_every_topic_idle_past_the_timeout_goes(core):
    topics = [await core.create_topic(f"/default/aged-{i}", NON_RELIABLE) for i in range(3)]
    idle = IdleTopics(timeout=30, max_idle=100)
    assert idle.due(topics, 0.0) == []
    assert idle.due(topics, 29.0) == []
    topics[1].messages_in += 1                  # published to (a dead letter, say)
    assert [t.name for t in idle.due(topics, 30.0)] == ["/default/aged-0", "/default/aged-2"]


async def test_concurrent_uses_of_a_resting_topic_load_it_once(core):
    name = "/default/rest-once"
    await core.create_topic(name, RELIABLE)
    table = core.topic_table
    table.topics[name].idle_since = time.monotonic()
    await table._rest(name)      # noqa: SLF001 - what the idle sweep does
    assert name in table.resting and name not in table.topics
    loaded = await asyncio.gather(*(table.use(name) for _ in range(10)),
                                  *(table.get_or_create(name, RELIABLE) for _ in range(5)))
    assert len({id(t if not isinstance(t, tuple) else t[0]) for t in loaded}) == 1
    assert table.topics[name] is loaded[0] and name not in table.resting


async def test_a_stop_closes_topics_within_its_deadline(core):
    topics = [await core.create_topic(f"/default/stop-{i}", RELIABLE) for i in range(3)]
    stuck = topics[1].log
    real_close = stuck.close
    never = asyncio.Event()

    async def hang():           # a log whose last sync never returns (a dead disk)
        await never.wait()
    stuck.close = hang
    started = time.monotonic()
    await core.topic_table.close_all(BrokerShuttingDown("stopping"), timeout=0.5)
    assert time.monotonic() - started < 5.0
    assert topics[0].log.closed and topics[2].log.closed and not stuck.closed
    stuck.close = real_close
    await real_close()
