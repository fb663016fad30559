"""danube_ext.TopicHistory (GetOffsets, ReadRange): offset-addressed reads of reliable topics
for readers that keep their own position (the Spark connector, issue 19).

A plain grpcio client calls the service with our generated messages; batches come back as
raw bytes, so the wire form (canonical, tests/support/wire_walker.py) is checked before
anything merges it. Topics and offsets are set up with the project's client. The basic
reads and the errors run against the real broker process; history in the durable tier, data
lost to local retention and the untouched subscription run in-process (tiered_harness), so
the tests can force uploads and local deletion and look at the subscription's cursor."""

import asyncio
import struct

import grpc
import pytest

from broker_process import BrokerProcess
from danube.broker import history as history_core
from danube.client import DanubeClient
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from tiered_harness import InProcBroker, tiered_tree
from waiting import async_holds_for, async_wait_for
import objstore_servers
import wire_walker

GET_OFFSETS = "/danube_ext.TopicHistory/GetOffsets"
READ_RANGE = "/danube_ext.TopicHistory/ReadRange"
#: How far ahead of a reader that stopped the broker may have read with grpcio's initial
#: 64 KiB stream window (about 32 messages of 2 KB) and a batch in hand: a few times that.
FLOW_BOUND = 100


def _ser(m):
    return m.SerializeToString()


class HistoryClient:
    def __init__(self, target, options=None):
        self.channel = grpc.aio.insecure_channel(target.removeprefix("http://"),
                                                 options=options)

    async def close(self):
        await self.channel.close()

    async def offsets(self, topic):
        return await self.channel.unary_unary(
            GET_OFFSETS, request_serializer=_ser,
            response_deserializer=ext.OffsetsResponse.FromString)(
            ext.OffsetsRequest(topic=topic), timeout=10)

    def read_call(self, topic, start, end, max_messages=0, columnar=False):
        return self.channel.unary_stream(
            READ_RANGE, request_serializer=_ser,
            response_deserializer=ext.ReadRangeBatch.FromString)(
            ext.ReadRangeRequest(topic=topic, start_offset=start, end_offset=end,
                                 max_messages=max_messages, columnar=columnar), timeout=60)

    async def read_columns(self, topic, start, end, max_messages=0):
        """The columnar batches, each as [(offset, payload, routing key or None)]."""
        out = []
        async for b in self.read_call(topic, start, end, max_messages, columnar=True):
            assert not b.messages
            out.append(_column_rows(b.columns))
        return out

    async def read(self, topic, start, end, max_messages=0):
        """The batches, each a list of raw StreamMessage bytes."""
        return [list(b.messages) async for b in self.read_call(topic, start, end, max_messages)]

    async def read_messages(self, topic, start, end, max_messages=0):
        batches = await self.read(topic, start, end, max_messages)
        raws = [m for b in batches for m in b]
        wire_walker.check_delivered(raws)
        return [pb.StreamMessage.FromString(m) for m in raws]


def _column_rows(c):
    n = c.count
    offsets = struct.unpack(f"<{n}q", c.topic_offsets)
    bounds = struct.unpack(f"<{n + 1}i", c.payload_offsets)
    keys = struct.unpack(f"<{n + 1}i", c.routing_key_offsets)
    valid = [not c.routing_key_validity or c.routing_key_validity[i // 8] >> (i % 8) & 1
             for i in range(n)]
    return [(offsets[i], c.payloads[bounds[i]:bounds[i + 1]],
             c.routing_keys[keys[i]:keys[i + 1]].decode() if valid[i] else None)
            for i in range(n)]


async def _status(coro):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    return info.value.code(), info.value.details()


def _offsets(messages):
    return [m.msg_id.topic_offset for m in messages]


# -- the real broker process ------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    proc = BrokerProcess(data_dir=tmp_path_factory.mktemp("history") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
async def clients(broker):
    url = f"http://{broker.client_addr}"
    history = HistoryClient(broker.client_addr)
    async with DanubeClient(url) as client:
        yield client, history
    await history.close()


async def test_offsets_and_messages_of_a_plain_topic(clients):
    client, history = clients
    topic = "/default/history-plain"
    producer = await client.create_producer(topic, "p", reliable=True)
    for i in range(25):
        await producer.send(b"payload-%d" % i, {"n": str(i), "kind": "test"}, f"key-{i % 3}")

    resp = await history.offsets(topic)
    assert not resp.partitioned
    assert [(p.topic, p.partition, p.earliest, p.latest) for p in resp.partitions] == \
        [(topic, 0, 0, 25)]

    batches = await history.read(topic, 0, 25, max_messages=10)
    assert [len(b) for b in batches] == [10, 10, 5]
    got = await history.read_messages(topic, 0, 25, max_messages=10)
    assert _offsets(got) == list(range(25))
    assert [m.payload for m in got] == [b"payload-%d" % i for i in range(25)]
    assert [dict(m.attributes) for m in got] == [{"n": str(i), "kind": "test"}
                                                 for i in range(25)]
    assert [m.routing_key for m in got] == [f"key-{i % 3}" for i in range(25)]
    assert all(m.HasField("routing_key") for m in got)
    # Filled as deliveries are: the topic and the broker, stamped by the broker.
    assert {m.msg_id.topic_name for m in got} == {topic}
    assert {m.msg_id.broker_addr for m in got} != {""}
    assert {m.producer_name for m in got} == {"p"}

    # The default batch (1000) holds them all; a range past the end is capped at latest;
    # an empty range and one past the end are empty streams.
    assert [len(b) for b in await history.read(topic, 0, 25)] == [25]
    assert _offsets(await history.read_messages(topic, 20, 10_000)) == [20, 21, 22, 23, 24]
    assert await history.read(topic, 7, 7) == []
    assert await history.read(topic, 30, 40) == []

    # Columnar: the same messages, batched the same way.
    columns = await history.read_columns(topic, 0, 25, max_messages=10)
    assert [len(b) for b in columns] == [10, 10, 5]
    assert [r for b in columns for r in b] == [(m.msg_id.topic_offset, m.payload, m.routing_key)
                                               for m in got]
    assert await history.read_columns(topic, 30, 40) == []

    # More published later: the same range reads the same, and latest moved on.
    await producer.send(b"payload-25")
    assert (await history.offsets(topic)).partitions[0].latest == 26
    assert [m.payload for m in await history.read_messages(topic, 24, 100)] == \
        [b"payload-24", b"payload-25"]


async def test_offsets_and_messages_of_a_partitioned_topic(clients):
    client, history = clients
    topic = "/default/history-parts"
    producer = await client.create_producer(topic, "p", partitions=3, reliable=True)
    for i in range(31):              # round-robin: 11, 10 and 10 messages
        await producer.send(b"m%d" % i)

    resp = await history.offsets(topic)
    assert resp.partitioned
    assert [(p.topic, p.partition, p.earliest, p.latest) for p in resp.partitions] == [
        (f"{topic}-part-0", 0, 0, 11), (f"{topic}-part-1", 1, 0, 10),
        (f"{topic}-part-2", 2, 0, 10)]

    got = await history.read_messages(f"{topic}-part-1", 0, 10, max_messages=4)
    assert _offsets(got) == list(range(10))
    assert [m.payload for m in got] == [b"m%d" % i for i in range(1, 31, 3)]
    assert {m.msg_id.topic_name for m in got} == {f"{topic}-part-1"}

    # One partition by its own name is one partition, not a partitioned topic.
    one = await history.offsets(f"{topic}-part-2")
    assert not one.partitioned
    assert [(p.partition, p.latest) for p in one.partitions] == [(2, 10)]

    code, details = await _status(history.read(topic, 0, 10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "partitioned" in details and f"{topic}-part-0" in details


async def test_errors(clients):
    client, history = clients
    missing = "/default/history-no-such-topic"
    for call in (history.offsets(missing), history.read(missing, 0, 1)):
        code, details = await _status(call)
        assert code == grpc.StatusCode.NOT_FOUND
        assert missing in details

    plain = "/default/history-non-reliable"
    producer = await client.create_producer(plain, "p")
    await producer.send(b"x")
    for call in (history.offsets(plain), history.read(plain, 0, 1)):
        code, details = await _status(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "non-reliable" in details and "reliable topic" in details and plain in details

    reliable = "/default/history-args"
    producer = await client.create_producer(reliable, "p", reliable=True)
    await producer.send(b"x")
    code, details = await _status(history.read(reliable, 5, 4))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "end_offset 4" in details and "start_offset 5" in details
    code, details = await _status(history.read(reliable, 2**64 - 1, 2**64 - 1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "start_offset" in details
    code, details = await _status(history.read(reliable, 0, 1, max_messages=10**7))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_messages" in details
    for call in (history.offsets("no-slashes"), history.read("/default/bad name", 0, 1)):
        code, details = await _status(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("topic")
    # The broker still serves the topic.
    assert _offsets(await history.read_messages(reliable, 0, 1)) == [0]


async def test_a_cancelled_read_harms_nothing(clients):
    """A reader that cancels mid-range ends the call; later reads are served as before."""
    client, history = clients
    topic = "/default/history-slow"
    producer = await client.create_producer(topic, "p", reliable=True)
    await producer.send_many([bytes(1000) + b"%d" % i for i in range(3000)])
    call = history.read_call(topic, 0, 3000, max_messages=1)
    first = await call.read()
    assert _offsets([pb.StreamMessage.FromString(m) for m in first.messages]) == [0]
    call.cancel()
    got = await history.read_messages(topic, 2990, 3000)
    assert _offsets(got) == list(range(2990, 3000))


# -- in-process: tiered history, retention, subscriptions -------------------------------------

async def _publish(client, topic, n, start=0):
    producer = await client.create_producer(topic, f"p{start}", reliable=True)
    await producer.send_many([b"h%06d" % i for i in range(start, start + n)])
    return producer


async def test_history_only_the_durable_tier_holds_reads_seamlessly(tmp_path):
    durable = objstore_servers.durable_config("fs", None, tmp_path, "history")
    broker = await InProcBroker(tmp_path, tiered_tree(durable)).start()
    topic = "/default/history-tiered"
    history = HistoryClient(broker.url)
    try:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            for r in range(3):
                await producer.send_many([b"h%06d" % i for i in range(r * 200, r * 200 + 200)])
                await broker.wait_uploaded(topic, r * 200 + 199)
            # Local retention deletes what is uploaded: 0..599 are in the durable tier only.
            await broker.wait_local_first(topic, 600)
            await producer.send_many([b"h%06d" % i for i in range(600, 700)])

        resp = await history.offsets(topic)
        assert [(p.earliest, p.latest) for p in resp.partitions] == [(0, 700)]
        got = await history.read_messages(topic, 0, 700, max_messages=256)
        assert _offsets(got) == list(range(700))
        assert [m.payload for m in got] == [b"h%06d" % i for i in range(700)]
        assert {m.msg_id.topic_name for m in got} == {topic}
        assert broker.tiered.stats["history_messages"] >= 600
        # A range across the tier -> WAL boundary, starting mid-segment.
        got = await history.read_messages(topic, 555, 650, max_messages=7)
        assert _offsets(got) == list(range(555, 650))
        rows = [r for b in await history.read_columns(topic, 0, 700) for r in b]
        assert rows == [(i, b"h%06d" % i, None) for i in range(700)]
    finally:
        await history.close()
        await broker.stop()


async def test_history_lost_to_retention_is_out_of_range(tmp_path):
    tree = {"storage": {"wal": {"rotation": {"max_bytes": 4096}},
                        "local_retention": {"time_minutes": 0,
                                            "check_interval_minutes": 0.005}}}
    broker = await InProcBroker(tmp_path, tree).start()
    topic = "/default/history-lost"
    history = HistoryClient(broker.url)
    try:
        async with DanubeClient(broker.url) as client:
            await _publish(client, topic, 2000)
        await broker.wait_local_first(topic, 1)
        earliest = broker.topic(topic).log.first_offset
        resp = await history.offsets(topic)
        assert [(p.earliest, p.latest) for p in resp.partitions] == [(earliest, 2000)]

        code, details = await _status(history.read(topic, 0, 2000))
        assert code == grpc.StatusCode.OUT_OF_RANGE
        assert f"offsets 0..{earliest - 1}" in details
        assert f"earliest offset kept is {earliest}" in details
        got = await history.read_messages(topic, earliest, 2000)
        assert _offsets(got) == list(range(earliest, 2000))
    finally:
        await history.close()
        await broker.stop()


async def test_a_read_leaves_subscriptions_alone(tmp_path):
    broker = await InProcBroker(tmp_path, {}).start()
    topic = "/default/history-sub"
    history = HistoryClient(broker.url)
    try:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            consumer = await client.subscribe(topic, "c", "s", sub_type="exclusive")
            await broker.wait_streaming(topic, "s")
            await producer.send_many([b"h%06d" % i for i in range(20)])
            for i in range(5):
                msg = await consumer.receive(timeout=10)
                assert msg.msg_id.topic_offset == i
                await consumer.ack(msg)
            await consumer.flush_acks()         # batched acks (the default) all in
            dispatcher = broker.topic(topic).subscriptions["s"].dispatcher
            before = (dispatcher.cursor, dispatcher.next_read, sorted(dispatcher.inflight))
            assert before[0] == 4

            got = await history.read_messages(topic, 0, 20, max_messages=3)
            assert _offsets(got) == list(range(20))
            assert (dispatcher.cursor, dispatcher.next_read,
                    sorted(dispatcher.inflight)) == before
            assert sorted(broker.topic(topic).subscriptions) == ["s"]

            rest = []
            for _ in range(15):
                rest.append(await consumer.receive(timeout=10))
                await consumer.ack(rest[-1])
            assert _offsets(rest) == list(range(5, 20))
            with pytest.raises((TimeoutError, asyncio.TimeoutError)):
                await consumer.receive(timeout=0.5)
    finally:
        await history.close()
        await broker.stop()


async def test_a_slow_reader_holds_the_stream_and_cancelling_closes_the_reader(
        tmp_path, monkeypatch):
    """Flow control: the broker reads a batch ahead only as the client takes them, so a
    reader that stops reading is not sent (nor buffered) the whole range; cancelling the call
    closes the broker's log reader."""
    readers = []
    closed = []
    real_init, real_close = history_core.RangeReader.__init__, history_core.RangeReader.close

    def init(self, *args):
        real_init(self, *args)
        readers.append(self)

    def close(self):
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(history_core.RangeReader, "__init__", init)
    monkeypatch.setattr(history_core.RangeReader, "close", close)
    broker = await InProcBroker(tmp_path, {}).start()
    topic = "/default/history-flow"
    history = HistoryClient(broker.url)
    # The slow reader's windows stay what it announced: grpcio grows its flow-control
    # windows with its estimate of the link's bandwidth-delay product (BDP probing), and
    # on a loaded machine (its pings answered late) that estimate came to the whole 40 MB
    # range, which the broker then rightly sent. Without probing the stream window stays
    # at grpcio's initial 64 KiB: about 32 of these messages.
    slow = HistoryClient(broker.url, options=[("grpc.http2.bdp_probe", 0)])
    n = 20_000
    try:
        async with DanubeClient(broker.url) as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            await producer.send_many([bytes(2000) + b"%d" % i for i in range(n)])
        call = slow.read_call(topic, 0, n, max_messages=1)
        first = await call.read()
        assert len(first.messages) == 1
        (reader,) = readers
        # The client takes nothing more: the broker fills its window and waits, having
        # read from the log what the window holds and a batch ahead, never the range (a
        # broker that ignored the window would be past the bound in well under a second).
        await async_holds_for(lambda: reader.next <= FLOW_BOUND, 3,
                              what=f"the broker read at most {FLOW_BOUND} messages ahead")
        call.cancel()
        await async_wait_for(lambda: closed == readers, what="the reader closed")
        got = await history.read_messages(topic, n - 3, n)
        assert _offsets(got) == [n - 3, n - 2, n - 1]
        assert len(closed) == 2
        # 2000 messages of 2 KB in one batch would be over grpcio's 4 MiB receive limit, so
        # a batch also stops at BATCH_BYTES.
        batches = await history.read(topic, n - 2000, n, max_messages=2000)
        assert [len(b) < 2000 for b in batches] == [True, True]
        assert sum(map(len, batches)) == 2000
        # Columnar batches stop there too (their columns counted with the bytes).
        columns = await history.read_columns(topic, n - 2000, n, max_messages=2000)
        assert len(columns) >= 2 and all(len(b) < 2000 for b in columns)
        assert [r[0] for b in columns for r in b] == list(range(n - 2000, n))
    finally:
        await slow.close()
        await history.close()
        await broker.stop()
