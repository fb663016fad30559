"""A consumer that subscribes but never opens its ReceiveMessages stream (a client that died in
between) must not hold its subscription: after dispatch.consumer_stream_grace_ms, or at once
when the connection that subscribed it closes, it is inactive, an Exclusive subscription
takes another consumer, and reliable messages handed to it go to the next consumer well
before the ack timeout."""

import threading
import time

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from broker_process import BrokerProcess
from grpc_calls import create_producer, receive, subscribe, unary
from waiting import holds_for, wait_for

GRACE_MS = 400


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "broker.yml"
    cfg.write_text(f"dispatch:\n  consumer_stream_grace_ms: {GRACE_MS}\n")
    b = BrokerProcess("--config-file", str(cfg),
                      data_dir=tmp_path_factory.mktemp("lifecycle") / "d").start()
    yield b
    b.stop()


def _exclusive(ch, topic, name):
    return subscribe(ch, topic, name, "s", pb.ConsumerRequest.Exclusive)


def _exclusive_once_free(ch, topic, name, **wait):
    """Subscribe ``name`` as soon as the consumer holding the Exclusive subscription gives it
    up (refused with PERMISSION_DENIED until then)."""
    def subscribed():
        try:
            return _exclusive(ch, topic, name)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
            return None
    return wait_for(subscribed, interval=0.05,
                    what="the ghost consumer to give the subscription up", **wait)


def test_consumer_without_a_stream_gives_way_after_the_grace(broker):
    topic = "/default/lifecycle-no-stream"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p", pb.Reliable)
        _exclusive(ch, topic, "ghost")          # never opens its stream
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        send(ext.MessageBatch(producer_id=producer_id,
                              messages=[pb.StreamMessage(payload=b"m%d" % i) for i in range(3)]),
             timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            _exclusive(ch, topic, "second")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "ghost" in err.value.details()
        consumer_id = _exclusive_once_free(ch, topic, "second")
        stream = receive(ch, consumer_id)
        # In flight to the ghost, redelivered at once rather than after the 30 s ack timeout.
        start = time.monotonic()
        got = [next(stream) for _ in range(3)]
        assert time.monotonic() - start < 15            # half the ack timeout
        assert [(m.payload, m.msg_id.topic_offset) for m in got] == \
            [(b"m0", 0), (b"m1", 1), (b"m2", 2)]
        stream.cancel()


def test_a_stream_opened_within_the_grace_keeps_the_consumer(broker):
    topic = "/default/lifecycle-late-stream"
    with grpc.insecure_channel(broker.client_addr) as ch:
        create_producer(ch, topic, "p")
        consumer_id = _exclusive(ch, topic, "slow-starter")
        # Time passing is the condition: the stream opens half-way through the grace.
        time.sleep(GRACE_MS / 2000)
        stream = receive(ch, consumer_id)

        def intruder_refused():
            with pytest.raises(grpc.RpcError) as err:
                _exclusive(ch, topic, "intruder")
            return err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The consumer is kept, watched past twice the grace (a bounded window).
        holds_for(intruder_refused, GRACE_MS * 2 / 1000, interval=0.05,
                  what="the consumer with a stream keeps the subscription")
        stream.cancel()


def test_a_stream_opened_after_the_grace_still_receives(broker):
    topic = "/default/lifecycle-very-late"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p")
        consumer_id = subscribe(ch, topic, "late", "s", pb.ConsumerRequest.Shared)
        # Time passing is the condition: the stream opens long after the grace.
        time.sleep(GRACE_MS * 2 / 1000)
        stream = receive(ch, consumer_id)
        send = unary(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)
        received = threading.Event()

        def keep_sending():
            # Non-reliable: what is published before the stream is attached is not kept.
            while not received.wait(0.05):
                send(pb.StreamMessage(request_id=1, payload=b"hi", msg_id=pb.MsgID(
                    producer_id=producer_id, topic_name=topic)), timeout=10)

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        try:
            assert next(stream).payload == b"hi"     # within the stream's 30 s deadline
        finally:
            received.set()
            sender.join()
        stream.cancel()


def own_connection(broker):
    """A channel on a connection of its own: grpc shares one between channels to the same
    address by default, and closing the channel would then close nothing."""
    return grpc.insecure_channel(broker.client_addr,
                                 options=[("grpc.use_local_subchannel_pool", 1)])


@pytest.fixture(scope="module")
def long_grace_broker(tmp_path_factory):
    """A grace far longer than any wait below: what happens in these tests happens because
    the subscribing connection closed, not because the grace ran out."""
    cfg = tmp_path_factory.mktemp("cfg-long") / "broker.yml"
    cfg.write_text("dispatch:\n  consumer_stream_grace_ms: 3600000\n")
    b = BrokerProcess("--config-file", str(cfg),
                      data_dir=tmp_path_factory.mktemp("lifecycle-long") / "d").start()
    yield b
    b.stop()


def test_a_consumer_whose_connection_closed_before_its_stream_gives_way_at_once(
        long_grace_broker):
    broker, topic = long_grace_broker, "/default/lifecycle-conn-closed"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p", pb.Reliable)
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        with own_connection(broker) as ghost:
            _exclusive(ghost, topic, "ghost")   # never opens its stream; its channel closes
            send(ext.MessageBatch(producer_id=producer_id, messages=[
                pb.StreamMessage(payload=b"m%d" % i) for i in range(3)]), timeout=10)

        consumer_id = _exclusive_once_free(ch, topic, "second", timeout=60)
        stream = receive(ch, consumer_id)
        # What was in flight to the ghost comes first, in order (within the stream's 30 s
        # deadline; the grace is an hour and the ack timeout 30 s).
        got = [next(stream) for _ in range(3)]
        assert [(m.payload, m.msg_id.topic_offset) for m in got] == \
            [(b"m0", 0), (b"m1", 1), (b"m2", 2)]
        stream.cancel()
    wait_for(lambda: "its connection closed before it opened a ReceiveMessages stream"
             in broker.log(), timeout=30, what="the ghost consumer's log line")


def test_a_client_back_on_a_new_connection_reopens_its_consumers_stream(long_grace_broker):
    """The official clients reopen ReceiveMessages on the same consumer id after a
    reconnect: the consumer that went inactive with its connection receives again."""
    broker, topic = long_grace_broker, "/default/lifecycle-comeback"
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p", pb.Reliable)
        with own_connection(broker) as first:
            consumer_id = _exclusive(first, topic, "comeback")
        send = unary(ch, "/danube_ext.BatchProducer/SendMessages", ext.BatchResponse)
        send(ext.MessageBatch(producer_id=producer_id, messages=[
            pb.StreamMessage(payload=b"again")]), timeout=10)
        stream = receive(ch, consumer_id)
        assert next(stream).payload == b"again"
        stream.cancel()


@pytest.mark.parametrize("value", [0, -5, "soon"])
def test_bad_grace_is_a_config_error(tmp_path, value):
    from danube.config import ConfigError, load_config
    cfg = tmp_path / "b.yml"
    cfg.write_text(f"dispatch:\n  consumer_stream_grace_ms: {value}\n")
    with pytest.raises(ConfigError, match="consumer_stream_grace_ms"):
        load_config(str(cfg)).validate()
