"""danube_ext.BatchConsumer through our client against the real broker process: a batched
drain with out-of-order acks and gaps is exact; a consumer that disconnects with a full
window gets exactly its unacknowledged messages again; a broker killed with SIGKILL
mid-drain keeps every acknowledgement flush_acks() returned for (the cursor and the acks
above it) and redelivers only the rest; against a broker without the extension the client
falls back to ReceiveMessages and Ack."""

import signal

import pytest

from broker_process import BrokerProcess
from drain_helpers import nothing_more, publish
from danube.client import DanubeClient
from danube.client import connection


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("d")).start()
    yield b
    b.stop()


async def receive_offsets(consumer, want, timeout=10):
    """Messages until ``want`` arrived (a list of them, in arrival order)."""
    got = []
    while len(got) < want:
        got += await consumer.receive_many(want - len(got), timeout=timeout)
    return got


async def test_batched_drain_with_gaps_and_out_of_order_acks_is_exact(broker):
    url = f"http://{broker.client_addr}"
    topic, n = "/default/batch_drain", 3000
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        c = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                   max_unacked_messages=500, batch_acks=True)
        await publish(producer, n)
        msgs = []
        while len(msgs) < n:
            got = await c.receive_many(1000, timeout=10)
            msgs += got
            # Acks in reverse order, the first 50 twice, none for the gap 1000..1009.
            for m in reversed(got):
                if not 1000 <= m.msg_id.topic_offset < 1010:
                    await c.ack(m)
            for m in got:
                if m.msg_id.topic_offset < 50:
                    await c.ack(m)
        assert [m.msg_id.topic_offset for m in msgs] == list(range(n))
        assert [m.payload for m in msgs[:3]] == [b"m0", b"m1", b"m2"]
        held = [m for m in msgs if 1000 <= m.msg_id.topic_offset < 1010]
        await c.flush_acks()
        await c.close()
        # The gap, and only the gap, comes back to the next consumer.
        c2 = await client.subscribe(topic, "c", "s", sub_type="exclusive", batch_acks=True)
        again = await receive_offsets(c2, len(held))
        assert sorted(m.msg_id.topic_offset for m in again) == list(range(1000, 1010))
        for m in again:
            await c2.ack(m)
        await c2.flush_acks()
        assert await nothing_more(c2) == []
        await c2.close()


async def test_disconnect_with_a_full_window_redelivers_exactly_the_unacked(broker):
    url = f"http://{broker.client_addr}"
    topic, window = "/default/batch_full_window", 100
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        c = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                   max_unacked_messages=window, batch_acks=True)
        await publish(producer, 300)
        first = await receive_offsets(c, window)
        assert [m.msg_id.topic_offset for m in first] == list(range(window))
        assert await nothing_more(c) == []            # the window is full
        acked = {m.msg_id.topic_offset for m in first if m.msg_id.topic_offset % 3 == 0}
        for m in first:
            if m.msg_id.topic_offset in acked:
                await c.ack(m)
        await c.flush_acks()
        await c.close()                               # leaves with 66 unacknowledged
        c2 = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                    max_unacked_messages=1000, batch_acks=True)
        unacked = sorted(set(range(window)) - acked)
        got = await receive_offsets(c2, len(unacked) + 200, timeout=20)
        offsets = [m.msg_id.topic_offset for m in got]
        assert sorted(offsets) == sorted(unacked + list(range(window, 300)))
        assert len(set(offsets)) == len(offsets)
        await c2.close()


async def test_sigkill_mid_drain_keeps_flushed_acks(tmp_path):
    data = tmp_path / "data"
    b = BrokerProcess(data_dir=data).start()
    topic, n = "/default/batch_sigkill", 5000
    try:
        async with DanubeClient(f"http://{b.client_addr}") as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            c = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                       max_unacked_messages=2000, batch_acks=True)
            await publish(producer, n)
            msgs = await receive_offsets(c, 2000)
            # Acked: 0..799, then every other offset of 800..1999 (out of order above the
            # cursor); the rest of what arrived is not.
            acked = set(range(800)) | set(range(800, 2000, 2))
            for m in msgs:
                if m.msg_id.topic_offset in acked:
                    await c.ack(m)
            await c.flush_acks()
            b.stop(sig=signal.SIGKILL)
    finally:
        b.stop()
    b = BrokerProcess(data_dir=data).start()
    try:
        async with DanubeClient(f"http://{b.client_addr}") as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            c = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                       max_unacked_messages=5000, batch_acks=True)
            want = n - len(acked)
            got = [m.msg_id.topic_offset for m in await receive_offsets(c, want, timeout=20)]
            assert sorted(got) == sorted(set(range(n)) - acked)
            assert len(set(got)) == len(got)
            assert await nothing_more(c) == []
            await c.close()
    finally:
        b.stop()


async def test_falls_back_to_receive_messages_and_ack_without_the_extension(broker,
                                                                          monkeypatch):
    # Paths the broker does not serve answer UNIMPLEMENTED, as an upstream broker does.
    real = connection.BrokerStub.__init__

    def upstream_only(self, channel):
        real(self, channel)
        self.receive_batches = channel.unary_stream(
            "/danube_ext.Missing/ReceiveBatches", lambda m: m.SerializeToString(),
            lambda b: b)
        self.ack_ranges = channel.unary_unary("/danube_ext.Missing/AckRanges",
                                              lambda m: m.SerializeToString(), lambda b: b)
    monkeypatch.setattr(connection.BrokerStub, "__init__", upstream_only)
    topic = "/default/batch_fallback"
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        c = await client.subscribe(topic, "c", "s", sub_type="exclusive", batch_acks=True)
        await publish(producer, 50)
        msgs = []
        while len(msgs) < 50:                   # the broker's default window: 10
            got = await c.receive_many(50, timeout=10)
            msgs += got
            for m in got:
                await c.ack(m)
        assert [m.msg_id.topic_offset for m in msgs] == list(range(50))
        (tc,) = c._consumers.values()
        assert not tc.batched
        await c.flush_acks()
        assert not tc.acks.ranges_supported
        await c.close()
        c2 = await client.subscribe(topic, "c", "s", sub_type="exclusive")
        assert await nothing_more(c2) == []
        await c2.close()


async def test_the_window_asked_for_lasts_as_long_as_the_stream(broker):
    topic = "/default/batch_window"
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        c = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                   max_unacked_messages=50)
        await publish(producer, 100)
        first = await receive_offsets(c, 50)
        assert [m.msg_id.topic_offset for m in first] == list(range(50))
        assert await nothing_more(c) == []
        await c.close()
        # Without a request (max_unacked_messages=None; our client's default asks for
        # 1,000) the broker's default window (10) is back. The unacked 0..49 come first (a
        # consumer joining gets a left one's messages at once, in order).
        c2 = await client.subscribe(topic, "c", "s", sub_type="exclusive",
                                    max_unacked_messages=None)
        again = await receive_offsets(c2, 10)
        assert await nothing_more(c2) == []
        assert [m.msg_id.topic_offset for m in again] == list(range(10))
        await c2.close()


async def test_bad_requests_get_invalid_argument(broker):
    from danube.proto import DanubeExt_pb2 as ext
    from danube.rpc import RpcError, StatusCode
    topic = "/default/batch_bad"
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await client.create_producer(topic, "p", reliable=True)
        c = await client.subscribe(topic, "c", "s", sub_type="exclusive")
        stub = client.pool.stub(f"http://{broker.client_addr}")
        for ranges, words in (([1, 2, 3], "pairs"), ([5, 4], "backwards")):
            with pytest.raises(RpcError) as err:
                await stub.ack_ranges(ext.AckRangesRequest(
                    topic_name=topic, subscription_name="s", ranges=ranges))
            assert err.value.code == StatusCode.INVALID_ARGUMENT
            assert words in err.value.details
        with pytest.raises(RpcError) as err:
            await stub.ack_ranges(ext.AckRangesRequest(
                topic_name=topic, subscription_name="nope", ranges=[0, 0]))
        assert err.value.code == StatusCode.NOT_FOUND
        (tc,) = c._consumers.values()
        call = await stub.receive_batches(ext.ReceiveBatchesRequest(
            consumer_id=tc.consumer_id, max_unacked_messages=10001))
        with pytest.raises(RpcError) as err:
            await call.read_batch()
        assert err.value.code == StatusCode.INVALID_ARGUMENT
        assert "10000" in err.value.details
        await c.close()
