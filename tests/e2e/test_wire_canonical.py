"""What the broker sends on every delivery path is canonical protobuf (tests/support/wire_walker.py):
non-reliable fan-out, reliable delivery from the WAL, redelivery after a nack, frames in the
form earlier versions stored (msg_id twice, fields out of order), and replay from the durable
tier. Messages are captured as raw bytes by grpc.aio with identity deserializers, so nothing
merges them before the walker looks.

The broker runs in-process (tiered_harness) so a test can write legacy frames into its WAL."""

import asyncio

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from tiered_harness import InProcBroker, tiered_tree
import objstore_servers
import wire_walker
from wire_walker import encode_field as field
from waiting import async_wait_for

EXCLUSIVE = pb.ConsumerRequest.Exclusive


class RawClient:
    """Calls as an independent client makes them; deliveries come back as bytes."""

    def __init__(self, url):
        self.channel = grpc.aio.insecure_channel(url.removeprefix("http://"))

    async def close(self):
        await self.channel.close()

    def _unary(self, path, resp):
        return self.channel.unary_unary(path, request_serializer=_ser,
                                        response_deserializer=resp.FromString)

    async def producer(self, topic, name, strategy):
        resp = await self._unary("/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
            pb.ProducerRequest(producer_name=name, topic_name=topic, dispatch_strategy=strategy),
            timeout=10)
        return resp.producer_id

    async def send(self, raw):
        """SendMessage with ``raw`` bytes as the StreamMessage, exactly as given."""
        await self._unary("/danube.ProducerService/SendMessage", pb.MessageResponse)(
            raw, timeout=10)

    async def send_batch(self, producer_id, raws):
        return await self._unary("/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)(
            ext.MessageBatchRaw(producer_id=producer_id, messages=raws), timeout=10)

    async def subscribe(self, topic, sub, consumer="c"):
        resp = await self._unary("/danube.ConsumerService/Subscribe", pb.ConsumerResponse)(
            pb.ConsumerRequest(topic_name=topic, consumer_name=consumer, subscription=sub,
                               subscription_type=EXCLUSIVE), timeout=10)
        return resp.consumer_id

    def receive(self, consumer_id):
        return self.channel.unary_stream(
            "/danube.ConsumerService/ReceiveMessages", request_serializer=_ser,
            response_deserializer=lambda b: b)(pb.ReceiveRequest(consumer_id=consumer_id))

    async def ack(self, msg, sub):
        await self._unary("/danube.ConsumerService/Ack", pb.AckResponse)(
            pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id, subscription_name=sub),
            timeout=10)

    async def nack(self, msg, sub):
        await self._unary("/danube.ConsumerService/Nack", pb.NackResponse)(
            pb.NackRequest(request_id=msg.request_id, msg_id=msg.msg_id, subscription_name=sub,
                           delay_ms=0), timeout=10)


def _ser(m):
    return m if isinstance(m, bytes) else m.SerializeToString()


async def take(stream, n, timeout=20):
    """``n`` deliveries: each checked by the walker, returned as (raw, parsed)."""
    out = []
    async with asyncio.timeout(timeout):
        for _ in range(n):
            raw = await stream.read()
            assert raw is not grpc.aio.EOF
            wire_walker.check(raw)
            out.append((raw, pb.StreamMessage.FromString(raw)))
    return out


def sent(producer_id, topic, i, broker_addr=""):
    """A message as the official clients send it (canonical), with attributes; without a
    msg_id for producer 0 (as our batched client sends them)."""
    return pb.StreamMessage(
        request_id=i + 1, payload=b"m%d" % i, publish_time=1000 + i, producer_name="p",
        attributes={"i": str(i), "kind": "test"},
        msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic, broker_addr=broker_addr)
        if producer_id else None)


def scrambled(producer_id, topic, i):
    """The same message, non-canonical: msg_id twice and fields out of order, which protobuf
    merges (a client may send that)."""
    return (field(3, b"m%d" % i) + field(2, field(2, topic.encode()))
            + field(7, field(1, b"i") + field(2, str(i).encode())) + field(1, i + 1)
            + field(5, b"p") + field(2, field(1, producer_id)) + field(4, 1000 + i)
            + field(7, field(1, b"kind") + field(2, b"test")))


@pytest.fixture
async def broker(tmp_path):
    durable = objstore_servers.durable_config("fs", None, tmp_path, "wire")
    b = await InProcBroker(tmp_path, tiered_tree(durable)).start()
    client = RawClient(b.url)
    b.client = client
    yield b
    await client.close()
    await b.stop()


def check_message(m, topic, producer_id, i, broker_url, offset=0):
    assert (m.payload, m.request_id, m.publish_time, m.producer_name) == \
        (b"m%d" % i, i + 1, 1000 + i, "p")
    assert dict(m.attributes) == {"i": str(i), "kind": "test"}
    assert (m.msg_id.producer_id, m.msg_id.topic_name, m.msg_id.broker_addr,
            m.msg_id.topic_offset) == (producer_id, topic, broker_url, offset)


async def test_non_reliable_delivery_is_canonical(broker):
    c, topic = broker.client, "/default/wire-nonreliable"
    producer_id = await c.producer(topic, "p", pb.NonReliable)
    stream = c.receive(await c.subscribe(topic, "s"))
    await broker.wait_streaming(topic, "s")
    await c.send(sent(producer_id, topic, 0, broker.url).SerializeToString())
    await c.send(scrambled(producer_id, topic, 1))
    await c.send_batch(producer_id, [sent(0, "", 2).SerializeToString()])
    got = await take(stream, 3)
    stream.cancel()
    check_message(got[0][1], topic, producer_id, 0, broker.url)
    check_message(got[1][1], topic, producer_id, 1, "")    # the client sent no broker_addr
    check_message(got[2][1], topic, producer_id, 2, broker.url)


async def test_reliable_delivery_and_redelivery_are_canonical(broker):
    c, topic = broker.client, "/default/wire-reliable"
    producer_id = await c.producer(topic, "p", pb.Reliable)
    stream = c.receive(await c.subscribe(topic, "s"))
    await broker.wait_streaming(topic, "s")
    await c.send(sent(producer_id, topic, 0, broker.url).SerializeToString())
    await c.send(scrambled(producer_id, topic, 1))
    resp = await c.send_batch(producer_id, [sent(0, "", 2).SerializeToString(),
                                            scrambled(0, "/other/topic", 3)])
    assert resp.accepted == 2
    got = await take(stream, 4)
    for i, (_, m) in enumerate(got):
        check_message(m, topic, producer_id, i, broker.url, offset=i)
    for _, m in got[1:]:
        await c.ack(m, "s")
    await c.nack(got[0][1], "s")              # back for redelivery, at once
    [(raw, again)] = await take(stream, 1)
    assert raw == got[0][0]
    await c.ack(again, "s")
    sub = broker.topic(topic).subscriptions["s"]
    await async_wait_for(lambda: sub.dispatcher.cursor == 3, what="the cursor to reach 3")
    stream.cancel()


def legacy_frames(producer_id, topic, first):
    """Frames as earlier versions stored them: the batch stamp appended producer_name and a
    second msg_id (with the topic's name over a msg_id the client sent); SendMessage's
    frames left topic_name and broker_addr out. Delivery put msg_id { topic_name,
    broker_addr } in front of them and relied on protobuf merging the two."""
    appended = [sent(0, "", i).SerializeToString() + field(5, b"p")
                + field(2, field(1, producer_id) + field(5, first + i)) for i in range(2)]
    own = (scrambled(0, "/x/y", 2) + field(5, b"p")
           + field(2, field(1, producer_id) + field(2, topic.encode()) + field(5, first + 2)))
    plain = sent(producer_id, "", 3)
    plain.msg_id.topic_offset = first + 3
    return appended + [own, plain.SerializeToString()]


async def test_legacy_wal_frames_are_delivered_canonical(broker):
    c, topic = broker.client, "/default/wire-legacy"
    producer_id = await c.producer(topic, "p", pb.Reliable)
    stream = c.receive(await c.subscribe(topic, "s"))
    await broker.wait_streaming(topic, "s")
    t = broker.topic(topic)
    frames = legacy_frames(producer_id, topic, t.log.next_offset)
    t.log.append(frames)
    t.subscriptions["s"].dispatcher.notify()
    got = await take(stream, 4)
    head = pb.StreamMessage(msg_id=pb.MsgID(topic_name=topic, broker_addr=broker.url))
    for i, (_, m) in enumerate(got):
        # The same values as protobuf's merge of the old head and the frame.
        assert m == pb.StreamMessage.FromString(head.SerializeToString() + frames[i])
        check_message(m, topic, producer_id, i, broker.url, offset=i)
    stream.cancel()


async def test_replay_from_the_durable_tier_is_canonical(broker):
    c, topic = broker.client, "/default/wire-tier"
    producer_id = await c.producer(topic, "p", pb.Reliable)
    stream = c.receive(await c.subscribe(topic, "s"))
    await broker.wait_streaming(topic, "s")
    stream.cancel()                           # the subscription stays, at offset -1
    await broker.wait_idle(topic, "s")
    t = broker.topic(topic)
    t.log.append(legacy_frames(producer_id, topic, 0))
    await c.send_batch(producer_id, [sent(0, "", i).SerializeToString() for i in range(4, 6)]
                       + [scrambled(0, "", 6)])
    await c.send(sent(producer_id, topic, 7, broker.url).SerializeToString())
    # Sealed, uploaded, and deleted locally: offsets 0..7 now come from the durable tier.
    await broker.wait_uploaded(topic, 7)
    await broker.wait_local_first(topic, 8)
    history = broker.tiered.stats["history_messages"]
    stream = c.receive(await c.subscribe(topic, "s"))
    got = await take(stream, 8)
    assert broker.tiered.stats["history_messages"] >= history + 8
    for i, (_, m) in enumerate(got):
        check_message(m, topic, producer_id, i, broker.url, offset=i)
        await c.ack(m, "s")
    stream.cancel()
