"""Broker policies and lifecycle: per-topic limits with upstream's status codes,
auto_create_topics, bootstrap namespaces, restart, consumer takeover, idle-subscription reaping."""

import threading

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from broker_process import BrokerProcess
from grpc_calls import create_producer, receive, subscribe, unary
from waiting import async_holds_for, async_wait_for


def _send(ch, topic, producer_id, payload):
    return unary(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)(
        pb.StreamMessage(request_id=1, payload=payload, producer_name="p",
                         msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic)),
        timeout=10)


def _health(ch, kind, ident):
    return unary(ch, "/danube.HealthCheck/HealthCheck", pb.HealthCheckResponse)(
        pb.HealthCheckRequest(client=kind, id=ident), timeout=10).status


def _code(fn):
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value.code(), err.value.details()


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "broker.yml"
    cfg.write_text(
        "bootstrap_namespaces: [team-a, team-b]\n"
        "policies:\n"
        "  max_producers_per_topic: 2\n"
        "  max_subscriptions_per_topic: 2\n"
        "  max_consumers_per_topic: 3\n"
        "  max_consumers_per_subscription: 2\n")
    b = BrokerProcess("--config-file", str(cfg),
                      data_dir=tmp_path_factory.mktemp("lim") / "d").start()
    yield b
    b.stop()


def test_max_producers_per_topic(limited):
    topic = "/default/lim-producers"
    with grpc.insecure_channel(limited.client_addr) as ch:
        create_producer(ch, topic, "a")
        create_producer(ch, topic, "b")
        assert create_producer(ch, topic, "a")            # same name: the existing producer
        code, details = _code(lambda: create_producer(ch, topic, "c"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_producers_per_topic" in details


def test_max_subscriptions_and_consumers(limited):
    topic = "/default/lim-subs"
    with grpc.insecure_channel(limited.client_addr) as ch:
        create_producer(ch, topic, "p")
        subscribe(ch, topic, "c1", "s1")
        subscribe(ch, topic, "c2", "s1")
        code, details = _code(lambda: subscribe(ch, topic, "c3", "s1"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_consumers_per_subscription" in details
        subscribe(ch, topic, "c3", "s2")
        code, details = _code(lambda: subscribe(ch, topic, "c4", "s2"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_consumers_per_topic" in details
        code, details = _code(lambda: subscribe(ch, topic, "c5", "s3"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "max_subscriptions_per_topic" in details


def test_bootstrap_namespaces_exist(limited):
    with grpc.insecure_channel(limited.client_addr) as ch:
        assert create_producer(ch, "/team-a/orders", "p")
        assert create_producer(ch, "/team-b/orders", "p")
        code, details = _code(lambda: create_producer(ch, "/team-c/orders", "p"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "team-c" in details


def test_auto_create_off_gives_not_found(tmp_path):
    cfg = tmp_path / "broker.yml"
    cfg.write_text("auto_create_topics: false\n")
    b = BrokerProcess("--config-file", str(cfg), data_dir=tmp_path / "d").start()
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            code, details = _code(lambda: create_producer(ch, "/default/nope", "p"))
    finally:
        b.stop()
    assert code == grpc.StatusCode.NOT_FOUND
    assert "/default/nope" in details


def test_topics_survive_restart_and_old_ids_get_close(tmp_path):
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    topic = "/default/survivor"
    with grpc.insecure_channel(b.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p")
        consumer_id = subscribe(ch, topic, "c", "s")
    assert b.stop() == 0
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            lookup = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
                pb.TopicLookupRequest(topic=topic), timeout=10)
            assert lookup.response_type == pb.TopicLookupResponse.Connect
            assert lookup.connect_url == f"http://{b.client_addr}"
            assert _health(ch, pb.HealthCheckRequest.Producer, producer_id) == \
                pb.HealthCheckResponse.CLOSE
            assert _health(ch, pb.HealthCheckRequest.Consumer, consumer_id) == \
                pb.HealthCheckResponse.CLOSE
            # The client's recovery: create again and carry on.
            new_id = create_producer(ch, topic, "p")
            consumer_id = subscribe(ch, topic, "c", "s")
            stream = receive(ch, consumer_id)
            _send(ch, topic, new_id, b"after restart")
            assert next(stream).payload == b"after restart"
            stream.cancel()
    finally:
        b.stop()


def test_consumer_reconnecting_by_name_takes_over_its_stream(tmp_path):
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    topic = "/default/takeover"
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            producer_id = create_producer(ch, topic, "p")
            first = subscribe(ch, topic, "c", "s", pb.ConsumerRequest.Exclusive)
            old_stream = receive(ch, first)
            _send(ch, topic, producer_id, b"one")
            assert next(old_stream).payload == b"one"
            assert subscribe(ch, topic, "c", "s", pb.ConsumerRequest.Exclusive) == first
            new_stream = receive(ch, first)
            _send(ch, topic, producer_id, b"two")
            assert next(new_stream).payload == b"two"
            with pytest.raises(grpc.RpcError) as err:
                next(old_stream)
            assert err.value.code() == grpc.StatusCode.ABORTED
            assert "taken over" in err.value.details()
            new_stream.cancel()
    finally:
        b.stop()


def test_exclusive_gives_way_when_the_holder_is_gone(tmp_path):
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    topic = "/default/exclusive-gone"
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            create_producer(ch, topic, "p")
            holder = subscribe(ch, topic, "c1", "s", pb.ConsumerRequest.Exclusive)
            stream = receive(ch, holder)
            code, _ = _code(lambda: subscribe(ch, topic, "c2", "s",
                                               pb.ConsumerRequest.Exclusive))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            stream.cancel()
            deadline = threading.Event()
            for _ in range(50):
                if _health(ch, pb.HealthCheckRequest.Consumer, holder) == \
                        pb.HealthCheckResponse.CLOSE:
                    break
                deadline.wait(0.1)
            assert subscribe(ch, topic, "c2", "s", pb.ConsumerRequest.Exclusive)
    finally:
        b.stop()


class _FakeStream:
    """Stands in for a ReceiveMessages stream whose client then disconnects."""
    finished = False

    def start_response(self):
        pass


async def test_idle_non_reliable_subscriptions_are_reaped(tmp_path):
    from danube.broker.core import BrokerCore
    from danube.broker.registry import ClientRegistry
    from danube.config import BrokerConfig
    from danube.metadata import keys
    from danube.metadata.memory import MemoryStore

    store = await MemoryStore.open()
    core = BrokerCore(BrokerConfig(data_dir=str(tmp_path)), store, ClientRegistry())
    core.idle_subscription_grace = 0.2
    await core.start()
    try:
        await core.create_producer("/default/reap", "p", 0)
        consumer_id = await core.subscribe("/default/reap", "c", "s", 1)
        consumer = core.consumer(consumer_id)
        topic = core.topics["/default/reap"]
        # An active consumer keeps it: watched for more than twice the grace (a bounded
        # window, as any "it does not happen" check).
        await async_holds_for(lambda: "s" in topic.subscriptions, 0.5,
                              what="the subscription of an active consumer kept")
        # The consumer's stream ends and it does not come back: it is removed after the
        # grace, and then the subscription, now without consumers, is too.
        consumer.attach(_FakeStream())
        consumer.stream_ended(consumer.stream)
        assert not core.registry.consumer_active(consumer_id)
        await async_wait_for(lambda: consumer_id not in core.consumers,
                             what="the consumer removed after the grace")
        await async_wait_for(lambda: "s" not in topic.subscriptions,
                             what="the subscription reaped")

        async def forgotten():
            return await store.get_entry(keys.topic_subscription("/default/reap", "s")) is None
        await async_wait_for(forgotten, what="the subscription's metadata deleted")
    finally:
        await core.stop()
        await store.close()


async def test_reliable_window_per_subscription_override(tmp_path):
    from danube.broker.core import BrokerCore
    from danube.broker.registry import ClientRegistry
    from danube.broker.topic import RELIABLE
    from danube.config import BrokerConfig
    from danube.metadata import keys
    from danube.metadata.memory import MemoryStore

    store = await MemoryStore.open()
    core = BrokerCore(BrokerConfig(data_dir=str(tmp_path)).validate(), store, ClientRegistry())
    await core.start()
    try:
        await core.create_producer("/default/win", "p", RELIABLE)
        await store.put(keys.subscription_dispatch_config("/default/win", "big"),
                        {"max_unacked_messages": 500})
        await core.subscribe("/default/win", "c1", "big", 0)
        await core.subscribe("/default/win", "c2", "plain", 0)
        subs = core.topics["/default/win"].subscriptions
        assert subs["big"].dispatcher.window == 500
        assert subs["plain"].dispatcher.window == 10
    finally:
        await core.stop()
        await store.close()
