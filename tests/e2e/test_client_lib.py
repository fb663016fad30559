"""danube.client against the real broker process: round trips, partitions and keys,
pipelined sends, acks, typed errors, health-check recovery and structured shutdown."""

import asyncio
import time

import pytest

from broker_process import BrokerProcess
from ports import free_port
from waiting import async_wait_for
from danube.client import (ClientClosed, DanubeClient, FailedPrecondition, InvalidArgument,
                           NoTopicsFound, NotFound, PermissionDenied, RetryPolicy, Unavailable,
                           fnv1a64)
from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.rpc import StatusCode
from danube.rpc.client import Channel

FAST_RETRY = RetryPolicy(max_retries=1, base_backoff_ms=10, max_backoff_ms=20)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("d")).start()
    yield b
    b.stop()


@pytest.fixture
async def client(broker):
    c = DanubeClient(f"http://{broker.client_addr}")
    yield c
    await c.close()


async def _receive(consumer, n, timeout=10):
    return [await consumer.receive(timeout=timeout) for _ in range(n)]


async def test_round_trip_fields_and_ack(client):
    topic = "/default/lib_round_trip"
    producer = await client.create_producer(topic, "p1")
    consumer = await client.subscribe(topic, "c1", "sub1")
    before = int(time.time() * 1000)
    first = await producer.send(b"hello", {"k": "v"})
    second = await producer.send("text payload")
    # Request ids count per producer from 1; send() returns the id the broker echoed.
    assert (first, second) == (1, 2)
    m1, m2 = await _receive(consumer, 2)
    assert m1.payload == b"hello" and dict(m1.attributes) == {"k": "v"}
    assert m2.payload == b"text payload"
    assert m1.request_id == 1 and m2.request_id == 2
    assert m1.producer_name == "p1"
    assert m1.msg_id.producer_id == producer.producers[0].producer_id
    assert m1.msg_id.topic_name == topic
    assert m1.msg_id.broker_addr.startswith("http://")
    assert m1.msg_id.topic_offset == 0
    assert before <= m1.publish_time <= int(time.time() * 1000)
    assert not m1.HasField("routing_key")
    await consumer.ack(m1)
    await consumer.nack(m2, delay_ms=10, reason="test")


async def test_partitions_round_robin_and_keys(client):
    topic = "/default/lib_parts"
    producer = await client.create_producer(topic, "pp", partitions=3)
    assert await client.partitions(topic) == [f"{topic}-part-{i}" for i in range(3)]
    consumer = await client.subscribe(topic, "c", "sub", sub_type="shared")
    assert sorted(consumer.partitions) == [f"{topic}-part-{i}" for i in range(3)]

    for i in range(30):
        await producer.send(b"rr%d" % i)
    per_partition = {}
    for msg in await _receive(consumer, 30):
        per_partition[msg.msg_id.topic_name] = per_partition.get(msg.msg_id.topic_name, 0) + 1
        # Per-partition producers are named {name}-{i} after their partition.
        assert msg.producer_name == "pp-" + msg.msg_id.topic_name.rsplit("-", 1)[1]
    assert per_partition == {f"{topic}-part-{i}": 10 for i in range(3)}

    keys = ["alpha", "beta", "gamma", "delta"]
    for _ in range(5):
        for key in keys:
            await producer.send(key.encode(), key=key)
    seen = {}
    for msg in await _receive(consumer, 20):
        assert msg.routing_key == msg.payload.decode()
        seen.setdefault(msg.routing_key, set()).add(msg.msg_id.topic_name)
    for key in keys:
        assert seen[key] == {f"{topic}-part-{fnv1a64(key) % 3}"}


def test_fnv1a64_matches_reference_vectors():
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8


async def test_send_many_10000_all_received_and_acked(client):
    topic = "/default/lib_send_many"
    producer = await client.create_producer(topic, "bulk")
    consumer = await client.subscribe(topic, "c", "sub")
    n = 10_000
    done = []
    ids = await producer.send_many([b"m%d" % i for i in range(n)], window=256,
                                   on_result=lambda i, r: done.append(i))
    assert sorted(ids) == list(range(1, n + 1)) and len(done) == n
    got = await _receive(consumer, n)
    assert {m.payload for m in got} == {b"m%d" % i for i in range(n)}
    # Ack concurrently, as an application draining a backlog would.
    await asyncio.gather(*(consumer.ack(m) for m in got[:2000]))


async def test_typed_errors(broker, client):
    with pytest.raises(NoTopicsFound, match="No topics found"):
        await client.subscribe("/default/lib_never_created", "c", "s")
    await client.create_producer("/default/lib_reliable", "p", reliable=True)
    with pytest.raises(FailedPrecondition) as err:
        await client.create_producer("/default/lib_reliable", "p2")
    assert err.value.code == StatusCode.FAILED_PRECONDITION
    assert "dispatch strategy" in str(err.value)
    with pytest.raises(InvalidArgument):
        await client.create_producer("/default/bad.name", "p")
    with pytest.raises(InvalidArgument):
        DanubeClient("no-port-here")

    topic = "/default/lib_exclusive"
    await client.create_producer(topic, "p")
    await client.subscribe(topic, "first", "ex", sub_type="exclusive")
    with pytest.raises(PermissionDenied):
        await client.subscribe(topic, "second", "ex", sub_type="exclusive")


async def test_retryable_errors_are_retried_then_reported():
    # Nothing listens on port 1: UNAVAILABLE on every attempt.
    async with DanubeClient("http://127.0.0.1:1", retry=FAST_RETRY) as client:
        with pytest.raises(Unavailable) as err:
            await client.create_producer("/default/t", "p")
        assert err.value.code == StatusCode.UNAVAILABLE
        assert "failed to connect" in str(err.value)


async def test_missing_namespace_is_retried_as_unavailable(broker):
    # The broker answers UNAVAILABLE for a missing namespace (b.3), which the policy
    # retries with backoff before giving up.
    async with DanubeClient(broker.client_addr, retry=FAST_RETRY) as client:
        with pytest.raises(Unavailable, match="namespace"):
            await client.create_producer("/no_such_ns/t", "p")


async def _delete_topic(broker, topic):
    async with Channel(broker.admin_addr) as channel:
        call = channel.unary_unary("/danube_admin.TopicAdmin/DeleteTopic",
                                   admin_pb.TopicRequest.SerializeToString,
                                   admin_pb.TopicResponse.FromString)
        await call(admin_pb.TopicRequest(name=topic), timeout=5)


async def test_health_close_recreates_producer_and_consumer_reports_loss(broker):
    topic = "/default/lib_health"
    async with DanubeClient(broker.client_addr, health_check_interval=0.1) as client:
        producer = await client.create_producer(topic, "p")
        consumer = await client.subscribe(topic, "c", "s")
        old_id = producer.producers[0].producer_id
        await _delete_topic(broker, topic)
        # The consumer's stream ends and its resubscribe finds no topic: a typed error.
        with pytest.raises(NotFound):
            await consumer.receive(timeout=10)
        await async_wait_for(lambda: producer.producers[0].closed_by_broker,
                             what="the health check to report the producer closed")
        # The next send creates the producer again (and with it the topic).
        assert await producer.send(b"after") >= 1
        assert producer.producers[0].producer_id != old_id


async def test_consumer_waits_out_a_broker_down_longer_than_its_retries(tmp_path, caplog):
    """A partition whose broker is gone for longer than the retry policy's budget (a restart,
    a topic loading on its new owner) is resubscribed until it is back: nothing published
    meanwhile is lost, and receive() never reports the outage (it once gave up after the
    policy's retries, leaving that partition stopped for good while the others went on)."""
    port = free_port()
    data = tmp_path / "data"
    addr = ("--broker-addr", f"127.0.0.1:{port}")
    b = BrokerProcess(*addr, data_dir=data).start()
    topic = "/default/lib_outage"
    policy = RetryPolicy(max_retries=1, base_backoff_ms=20, max_backoff_ms=40)
    try:
        async with DanubeClient(b.client_addr, retry=policy) as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            consumer = await client.subscribe(topic, "c", "s")
            await producer.send(b"before")
            first = await consumer.receive(timeout=10)
            assert first.payload == b"before"
            await consumer.ack(first)
            await consumer.flush_acks()         # stored: not delivered again
            b.stop()
            await async_wait_for(
                lambda: sum("resubscribing" in r.getMessage() for r in caplog.records) >= 1,
                timeout=30, what="a resubscribe to fail while the broker is down")
            b = BrokerProcess(*addr, data_dir=data).start()
            async with DanubeClient(b.client_addr) as other:
                again = await other.create_producer(topic, "p2", reliable=True)
                await again.send(b"after")
            message = await consumer.receive(timeout=30)
            assert message.payload == b"after"
            await consumer.ack(message)
    finally:
        b.stop()


async def test_close_cancels_every_task(broker):
    client = DanubeClient(broker.client_addr, health_check_interval=0.1)
    topic = "/default/lib_close"
    producer = await client.create_producer(topic, "p", partitions=None)
    consumer = await client.subscribe(topic, "c", "s")
    tasks = set(client._tasks)
    assert len(tasks) >= 3          # two health checks and one receive loop
    reader = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0.05)
    await client.close()
    assert all(t.done() for t in tasks) and not client._tasks
    with pytest.raises(ClientClosed):
        await reader
    with pytest.raises(ClientClosed):
        await producer.send(b"x")
    with pytest.raises(ClientClosed):
        await client.create_producer(topic, "p2")
    assert [m async for m in consumer.messages()] == []


async def test_send_many_uses_batches_and_keeps_order(client):
    topic = "/default/lib_send_many_batched"
    producer = await client.create_producer(topic, "bp")
    consumer = await client.subscribe(topic, "bc", "bs", sub_type="exclusive")
    ids = await producer.send_many([f"m{i}" for i in range(2500)], batch_size=1000)
    assert client.batch_publish is True
    assert ids == list(range(1, 2501))
    got = await _receive(consumer, 2500)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(2500)]


async def test_send_many_with_a_key_per_message(client):
    """keys=: one batched call carries each message's routing key; on a partitioned topic
    each key goes to its partition, in order per key."""
    topic = "/default/lib_send_many_keys"
    producer = await client.create_producer(topic, "kp")
    consumer = await client.subscribe(topic, "kc", "ks", sub_type="exclusive")
    keys = [f"k{i % 7}" if i % 5 else None for i in range(300)]
    await producer.send_many([f"m{i}" for i in range(300)], keys=keys)
    got = await _receive(consumer, 300)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(300)]
    assert [m.routing_key or None for m in got] == keys
    with pytest.raises(ValueError, match="one per payload"):
        await producer.send_many([b"a", b"b"], keys=["x"])
    with pytest.raises(ValueError, match="no key beside them"):
        await producer.send_many([b"a"], key="y", keys=["x"])

    topic = "/default/lib_send_many_keys_parts"
    producer = await client.create_producer(topic, "kpp", partitions=3)
    consumer = await client.subscribe(topic, "kpc", "kps", sub_type="shared")
    keys = [f"key{i % 11}" for i in range(330)]
    await producer.send_many([f"{keys[i]}:{i}" for i in range(330)], keys=keys,
                             batch_size=40)
    per_key = {}
    for msg in await _receive(consumer, 330):
        key, index = msg.payload.decode().split(":")
        assert msg.routing_key == key
        assert msg.msg_id.topic_name == f"{topic}-part-{fnv1a64(key) % 3}"
        per_key.setdefault(key, []).append(int(index))
    assert all(v == sorted(v) and len(v) == 30 for v in per_key.values())


async def test_send_many_falls_back_without_the_batch_extension(tmp_path):
    """A broker without danube_ext (as upstream): the real broker core served without the
    extension answers UNIMPLEMENTED, and send_many falls back to pipelined SendMessage."""
    from danube.broker.core import BrokerCore
    from danube.broker.registry import ClientRegistry
    from danube.services import client_api, health
    from danube.config import BrokerConfig
    from danube.metadata.memory import MemoryStore
    from danube.rpc.server import Server

    server = Server()
    port = await server.start("127.0.0.1", 0)
    cfg = BrokerConfig(data_dir=str(tmp_path), client_port=port)
    store = await MemoryStore.open()
    registry = ClientRegistry()
    core = BrokerCore(cfg, store, registry)
    await core.start()
    client_api.register(server, core)
    health.register(server, registry)
    client = DanubeClient(f"http://127.0.0.1:{port}")
    try:
        producer = await client.create_producer("/default/no-ext", "p")
        consumer = await client.subscribe("/default/no-ext", "c", "s")
        ids = await producer.send_many([b"a", b"b", b"c"], keys=["x", "y", "x"])
        assert client.batch_publish is False
        assert sorted(ids) == [1, 2, 3]
        got = sorted([(m.payload, m.routing_key) for m in
                      [await consumer.receive(timeout=10) for _ in range(3)]])
        assert got == [(b"a", "x"), (b"b", "y"), (b"c", "x")]
    finally:
        await client.close()
        await core.stop()
        await server.stop(1)
        await store.close()
