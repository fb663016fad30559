"""The write buffer with a durable tier, in one process (a broker on the test's loop, the
durable tier on the fs backend, the buffer on a real redis-server primary and replica):
entries are trimmed once their segment is uploaded, keeping the last
``max_cached_closed_segments`` uploaded segments as a warm copy; a reader behind the local
WAL gets the warm offsets from the stream and the older ones from the durable tier."""

import asyncio

import pytest

import objstore_servers
from danube.client import DanubeClient
from danube.storage.writebuffer.entries import ENDS, first_of, stream_key, unpack_ends
from redis_servers import RedisPair, redis_server_binary
from tiered_harness import InProcBroker, tiered_tree
from waiting import async_wait_for

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server not installed (bash bin/test installs it)")

TOPIC = "/default/wb-tiered"


@pytest.fixture
def redis_pair(tmp_path):
    pair = RedisPair(str(tmp_path / "redis"), replicas=1)
    yield pair
    pair.stop()


def stream_first(server):
    with server.client() as c:
        rows = c.xrange(stream_key(TOPIC), "-", "+", count=1)
        last = c.xrevrange(stream_key(TOPIC), "+", "-", count=1)
    if not rows:
        return None, None
    rid, fields = last[0]
    return first_of(rows[0][0]), first_of(rid) + len(unpack_ends(fields[ENDS])) - 1


async def publish(broker, start, n):
    async with DanubeClient(broker.url) as client:
        producer = await client.create_producer(TOPIC, "p", reliable=True)
        await producer.send_many([b"m%06d" % i for i in range(start, start + n)])


async def test_trimmed_after_upload_and_read_warm_then_durable(tmp_path, redis_pair):
    durable = objstore_servers.durable_config("fs", None, tmp_path, "wbtier")
    tree = tiered_tree(durable, interval=0.3)
    tree["storage"]["write_buffer"] = {"endpoints": [redis_pair.url], "wait_replicas": 1,
                                       "wait_timeout_ms": 2000,
                                       "max_cached_closed_segments": 2}
    broker = await InProcBroker(tmp_path, tree).start()
    try:
        # Five uploads of 100 messages each: five uploaded segments.
        for k in range(5):
            await publish(broker, k * 100, 100)
            await broker.wait_uploaded(TOPIC, k * 100 + 99)
        catalog = broker.topic(TOPIC).log.tier.catalog
        keep_from = catalog.segments[-2].start_offset
        # The stream keeps the last two uploaded segments only.
        await async_wait_for(lambda: stream_first(redis_pair.primary)[0] == keep_from,
                             timeout=30, what=f"the stream trimmed to {keep_from}")
        assert stream_first(redis_pair.primary)[1] == 499
        await broker.wait_local_first(TOPIC, 500)      # local retention deleted them all
        log = broker.topic(TOPIC).log
        ready = asyncio.Event()
        reader = log.reader(ready.set)
        got = []
        offset = 0
        while offset < 500:
            batch = reader.read(offset, 1000)
            if batch is None:
                await asyncio.wait_for(ready.wait(), 30)
                ready.clear()
                continue
            got.extend((o, bytes(p)) for o, p in batch)
            offset = got[-1][0] + 1
        reader.close()
        assert [o for o, _ in got] == list(range(500))
        # The warm part came from the stream, the rest from the durable tier.
        assert log.buffer.warm_reads == 500 - keep_from
        assert broker.tiered.stats["history_messages"] >= keep_from
    finally:
        await broker.stop()
