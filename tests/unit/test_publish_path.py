"""Topic.publish, the one publish path (a message or a batch, reliable or not, routing keys
and stamping in the topic), and the DeliverySink boundary between the broker and the
transport, driven through the real broker core with a sink that keeps what it is sent: no
gRPC here. The same paths over the network are in test_e2e_*.py and test_batch_publish.py."""

import ast
import asyncio
import pathlib

import pytest

import danube.broker
from danube.broker._stamp import parse_message_batch
from danube.codec.grpcframe import GrpcDeframer
from danube.broker.core import BrokerCore
from danube.broker.errors import (ConsumerTakenOver, MessageTooLarge, PartlyPublished,
                                  PublishFailed, TopicNotFound)
from danube.broker.registry import ClientRegistry
from danube.broker.subscription import EXCLUSIVE, KEY_SHARED
from danube.broker.topic import NON_RELIABLE, RELIABLE
from danube.config import BrokerConfig
from danube.metadata.memory import MemoryStore
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import StatusCode
from danube.services.delivery import StreamSink
from danube.services.errors import to_rpc_error
from waiting import async_holds_for


class FakeSink:
    """A DeliverySink that keeps what it is sent; `accept` False makes sends queue."""

    def __init__(self):
        self.finished = False
        self.blocked = False
        self.started = False
        self.accept = True
        self.sent = []
        self.writable = None
        self.ended = []

    def start_response(self):
        self.started = True

    def send_framed(self, data):
        self.sent.append(bytes(data))
        return self.accept

    def when_writable(self, callback):
        assert self.writable is None, "a second wait while one is pending"
        self.writable = callback

    def cancel_writable(self):
        self.writable = None

    def end(self, reason):
        self.ended.append(reason)
        self.finished = True

    def messages(self):
        return [pb.StreamMessage.FromString(m)
                for m in GrpcDeframer().feed(b"".join(self.sent))]


@pytest.fixture
async def core(tmp_path):
    store = await MemoryStore.open()
    core = BrokerCore(BrokerConfig(data_dir=str(tmp_path)).validate(), store, ClientRegistry())
    await core.start()
    yield core
    await core.stop()
    await store.close()


async def until(predicate, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def setup(core, topic, delivery, sub_type=EXCLUSIVE, consumers=(("c", ()),)):
    """A producer "p" on ``topic`` and consumers on subscription "s", each with a FakeSink
    attached as its delivery stream."""
    producer = core.producer(await core.create_producer(topic, "p", delivery))
    sinks = []
    for name, key_filters in consumers:
        consumer = core.consumer(await core.subscribe(topic, name, "s", sub_type, key_filters))
        sink = FakeSink()
        consumer.attach(sink)
        assert sink.started
        sinks.append(sink)
    return producer, core.topics[topic], sinks


def message(producer, payload, **fields):
    return pb.StreamMessage(request_id=1, payload=payload, producer_name=producer.name,
                            msg_id=pb.MsgID(producer_id=producer.producer_id,
                                            topic_name=producer.topic.name), **fields)


def batch(producer, *messages):
    return parse_message_batch(ext.MessageBatch(
        request_id=3, producer_id=producer.producer_id, messages=messages).SerializeToString())


# -- one message -----------------------------------------------------------------------------

async def test_non_reliable_message_passes_through_as_sent(core):
    producer, topic, (sink,) = await setup(core, "/default/nr-one", NON_RELIABLE)
    msg = message(producer, b"hello")
    assert await topic.publish(msg, producer, msg.SerializeToString()) is None
    await until(lambda: sink.sent)
    assert sink.messages() == [msg]
    assert (producer.sent, topic.messages_in, topic.bytes_in) == (1, 1, 5)


async def test_routing_key_is_the_topics_business(core):
    """KeyShared with filters: the key is routing_key when set, else producer_name."""
    producer, topic, (to_a, to_b) = await setup(
        core, "/default/nr-keys", NON_RELIABLE, KEY_SHARED,
        consumers=(("a", ["apple*"]), ("b", ["p"])))
    keyed = message(producer, b"1", routing_key="apple-9")
    await topic.publish(keyed, producer, keyed.SerializeToString())
    unkeyed = message(producer, b"2")                  # key: producer_name "p"
    await topic.publish(unkeyed)
    await until(lambda: to_a.sent and to_b.sent)
    assert [m.payload for m in to_a.messages()] == [b"1"]
    assert [m.payload for m in to_b.messages()] == [b"2"]


async def test_reliable_message_is_stamped_with_its_offset(core):
    producer, topic, (sink,) = await setup(core, "/default/r-one", RELIABLE)
    assert await topic.publish(message(producer, b"a"), producer) == range(0, 1)
    assert await topic.publish(message(producer, b"b"), producer) == range(1, 2)
    await until(lambda: len(sink.messages()) == 2)
    got = sink.messages()
    assert [(m.payload, m.msg_id.topic_offset) for m in got] == [(b"a", 0), (b"b", 1)]
    assert {m.msg_id.topic_name for m in got} == {topic.name}
    assert {m.msg_id.broker_addr for m in got} == {core.cfg.advertised_broker_url}
    assert producer.sent == 2


async def test_closed_topic_refuses_both_kinds(core):
    for name, delivery in [("/default/closed-nr", NON_RELIABLE), ("/default/closed-r", RELIABLE)]:
        producer, topic, _ = await setup(core, name, delivery)
        topic.closed = True
        with pytest.raises(PublishFailed):
            await topic.publish(message(producer, b"x"), producer)
        with pytest.raises((PublishFailed, PartlyPublished)):
            await topic.publish(batch(producer, pb.StreamMessage(payload=b"x")), producer)
        assert producer.sent == 0


async def test_no_ack_once_the_brokers_lease_has_run_out(core):
    """A cluster broker paused past its lease (its placement's Lease, moved by each renewal)
    must not acknowledge what it stores when it resumes: the publish answers TopicUnloaded
    (UNAVAILABLE: look the topic up, send again), a message and a batch alike."""
    import time

    from danube.broker.errors import TopicUnloaded
    from danube.broker.placement import Lease

    producer, topic, _ = await setup(core, "/default/r-lease", RELIABLE)
    topic.lease = Lease(time.monotonic() - 0.001)
    with pytest.raises(TopicUnloaded, match="lease ran out"):
        await topic.publish(message(producer, b"late"), producer)
    with pytest.raises(TopicUnloaded, match="lease ran out"):
        await topic.publish(batch(producer, pb.StreamMessage(payload=b"late too")), producer)
    assert producer.sent == 0
    topic.lease = Lease(time.monotonic() + 60)          # renewed
    assert await topic.publish(message(producer, b"on time"), producer) == range(2, 3)


# -- a batch ---------------------------------------------------------------------------------

async def test_non_reliable_batch_is_stamped_in_the_topic(core):
    producer, topic, (sink,) = await setup(core, "/default/nr-batch", NON_RELIABLE)
    view = batch(producer, pb.StreamMessage(payload=b"m0"),
                 pb.StreamMessage(payload=b"m1", routing_key="k"))
    assert await topic.publish(view, producer) is None
    await until(lambda: len(sink.messages()) == 2)
    got = sink.messages()
    assert [m.payload for m in got] == [b"m0", b"m1"]
    assert {m.msg_id.producer_id for m in got} == {producer.producer_id}
    assert {m.msg_id.topic_name for m in got} == {topic.name}
    assert {m.msg_id.broker_addr for m in got} == {core.cfg.advertised_broker_url}
    assert {m.producer_name for m in got} == {"p"}
    assert producer.sent == 2


async def test_non_reliable_batch_stops_at_the_failing_message(core):
    producer, topic, (sink,) = await setup(core, "/default/nr-partial", NON_RELIABLE)
    topic.policies.max_message_size = 5
    view = batch(producer, pb.StreamMessage(payload=b"ok"),
                 pb.StreamMessage(payload=b"far too long"), pb.StreamMessage(payload=b"c"))
    with pytest.raises(PartlyPublished) as err:
        await topic.publish(view, producer)
    assert (err.value.published, err.value.total) == (1, 3)
    assert isinstance(err.value.cause, MessageTooLarge)
    rpc = to_rpc_error(err.value)
    assert rpc.code == StatusCode.INVALID_ARGUMENT
    assert rpc.details.endswith("(1 of 3 messages in the batch were published)")
    await until(lambda: sink.sent)
    assert [m.payload for m in sink.messages()] == [b"ok"]
    assert producer.sent == 1


async def test_reliable_batch_is_handed_down_whole(core, monkeypatch):
    producer, topic, (sink,) = await setup(core, "/default/r-batch", RELIABLE)
    stores = []
    real_store = topic._store

    async def store(raws, nbytes, ends=None):
        stores.append(ends)
        return await real_store(raws, nbytes, ends)
    monkeypatch.setattr(topic, "_store", store)
    await topic.publish(message(producer, b"first"), producer)
    view = batch(producer, *[pb.StreamMessage(payload=b"m%d" % i) for i in range(3)])
    assert await topic.publish(view, producer) == range(1, 4)
    # One packed buffer for the whole batch (its message ends given), after the single one.
    assert stores[0] is None and len(stores[1]) == 3 and len(stores) == 2
    await until(lambda: len(sink.messages()) == 4)
    got = sink.messages()[1:]
    assert [(m.payload, m.msg_id.topic_offset) for m in got] == [(b"m0", 1), (b"m1", 2),
                                                               (b"m2", 3)]
    assert {(m.msg_id.producer_id, m.msg_id.topic_name, m.producer_name) for m in got} == {
        (producer.producer_id, topic.name, "p")}
    assert producer.sent == 4


async def test_reliable_batch_over_the_limit_stores_nothing(core):
    producer, topic, _ = await setup(core, "/default/r-too-big", RELIABLE)
    topic.policies.max_message_size = 5
    with pytest.raises(MessageTooLarge):
        await topic.publish(batch(producer, pb.StreamMessage(payload=b"ok"),
                                  pb.StreamMessage(payload=b"far too long")), producer)
    assert producer.sent == 0
    assert await topic.publish(message(producer, b"next"), producer) == range(0, 1)


async def test_dead_letter_goes_through_the_publish_path(core):
    """A poisoned message is republished with Topic.publish, to a reliable or non-reliable
    dead-letter topic alike."""
    producer, topic, _ = await setup(core, "/default/dl-src", RELIABLE)
    await topic.publish(message(producer, b"poison"), producer)
    sub = topic.subscriptions["s"]
    delivery = type("D", (), {"payload": topic.read(0, 1)[0][1]})()
    for target, delivery_kind in [("/default/dl-r", RELIABLE), ("/default/dl-nr", NON_RELIABLE)]:
        await core.create_topic(target, delivery_kind)
        dlq = core.topics[target]
        policy = sub.dispatcher.policy
        policy.dead_letter_topic = target
        await core.dead_letter(topic, sub, policy, delivery, 6, "why")
        assert dlq.messages_in == 1


# -- the delivery boundary -------------------------------------------------------------------

async def test_a_blocked_sink_is_resumed_when_writable(core):
    producer, topic, (sink,) = await setup(core, "/default/sink-blocked", NON_RELIABLE)
    sink.accept = False
    await topic.publish(message(producer, b"1"))
    await until(lambda: sink.writable is not None)
    assert len(sink.sent) == 1
    sink.accept = True
    await topic.publish(message(producer, b"2"))
    await topic.publish(message(producer, b"3"))
    # Waiting for the window: nothing more sent (watched over a bounded window).
    await async_holds_for(lambda: len(sink.sent) == 1, 0.05, what="nothing more sent")
    callback, sink.writable = sink.writable, None
    callback(True)
    assert len(sink.sent) == 2                 # the rest in one send
    assert [m.payload for m in sink.messages()] == [b"1", b"2", b"3"]


async def test_a_sink_whose_connection_went_away_is_not_written(core):
    producer, topic, (sink,) = await setup(core, "/default/sink-gone", NON_RELIABLE)
    sink.accept = False
    await topic.publish(message(producer, b"1"))
    await until(lambda: sink.writable is not None)
    await topic.publish(message(producer, b"2"))
    callback, sink.writable = sink.writable, None
    callback(False)
    assert len(sink.sent) == 1


async def test_sinks_are_ended_with_a_reason(core):
    producer, topic, (first,) = await setup(core, "/default/sink-end", NON_RELIABLE)
    consumer = next(iter(topic.subscriptions["s"].consumers.values()))
    first.accept = False
    await topic.publish(message(producer, b"1"))
    await until(lambda: first.writable is not None)
    second = FakeSink()
    consumer.attach(second)                   # a newer stream takes the consumer over
    assert len(first.ended) == 1 and isinstance(first.ended[0], ConsumerTakenOver)
    assert first.writable is None             # its pending wait was cancelled
    await core.delete_topic(topic.name)
    assert len(second.ended) == 1 and isinstance(second.ended[0], TopicNotFound)


async def test_stream_end_cancels_the_pending_wait(core):
    producer, topic, (sink,) = await setup(core, "/default/sink-stream-end", NON_RELIABLE)
    consumer = next(iter(topic.subscriptions["s"].consumers.values()))
    sink.accept = False
    await topic.publish(message(producer, b"1"))
    await until(lambda: sink.writable is not None)
    consumer.stream_ended(sink)
    assert sink.writable is None and consumer.stream is None and not consumer.active


def test_the_broker_imports_nothing_from_rpc():
    root = pathlib.Path(danube.broker.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            offenders += [f"{path.name}: {n}" for n in names
                          if n == "danube.rpc" or n.startswith("danube.rpc.")]
    assert not offenders


# -- the services' sink over a server stream -------------------------------------------------

class FakeStream:
    """What StreamSink uses of a ServerStream."""

    def __init__(self):
        self.finished = False
        self.blocked = True
        self.window = asyncio.Event()
        self.fail = False

    def start_response(self):
        pass

    def send_framed(self, data):
        return False

    async def drain(self):
        await self.window.wait()
        if self.fail:
            raise ConnectionError("connection closed")


async def test_stream_sink_calls_back_once_drained():
    stream = FakeStream()
    sink = StreamSink(stream)
    calls = []
    sink.when_writable(calls.append)
    await asyncio.sleep(0)
    assert not calls
    stream.window.set()
    await until(lambda: calls)
    assert calls == [True]
    stream.fail = True
    sink.when_writable(calls.append)
    await until(lambda: len(calls) == 2)
    assert calls == [True, False]
    await sink.close()


async def test_stream_sink_close_stops_and_awaits_its_wait():
    stream = FakeStream()
    sink = StreamSink(stream)
    calls = []
    sink.when_writable(calls.append)
    await asyncio.sleep(0)
    sink.cancel_writable()
    sink.when_writable(calls.append)
    await asyncio.sleep(0)
    waits = asyncio.all_tasks() - {asyncio.current_task()}
    assert waits
    await sink.close()
    assert all(task.done() for task in waits)
    stream.window.set()
    await async_holds_for(lambda: calls == [], 0.01, what="no write after close")
    sink.end(None)
    assert await sink.ended() is None
