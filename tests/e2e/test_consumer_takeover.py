"""Consumer takeover by name (reference b.5, appendix 3): a second Subscribe with the same
consumer name on the same subscription returns the same consumer id and ends the consumer's
ReceiveMessages stream at once (upstream cancels the old streaming task in subscribe), so what
is published from then on goes to the stream the subscribing client opens next, never to the
old one. The client that was taken over opens ReceiveMessages again (the official clients
do when their stream ends); that stream waits while the new owner has the consumer."""

import queue

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import Collector, ack, create_producer, receive, send, subscribe
from official_client import (broker_url, official_python, spawn_scenario, start_broker,
                             unique_topic)
from waiting import holds_for

TYPES = {"exclusive": pb.ConsumerRequest.Exclusive, "shared": pb.ConsumerRequest.Shared,
         "failover": pb.ConsumerRequest.Failover, "key_shared": pb.ConsumerRequest.KeyShared}
DELIVERY = {"reliable": pb.Reliable, "non_reliable": pb.NonReliable}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("takeover") / "data")
    yield b
    b.stop()


def connection(broker):
    """A channel with a connection of its own: grpcio otherwise shares one connection
    between channels to the same address, and the broker tells clients apart by it."""
    return grpc.insecure_channel(broker.client_addr,
                                 options=[("grpc.use_local_subchannel_pool", 1)])



    def close(self):
        self.stream.cancel()
        self.thread.join(5)


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("delivery", list(DELIVERY))
def test_subscribe_by_name_ends_the_old_stream_and_the_new_one_gets_what_follows(
        broker, delivery, kind):
    topic = unique_topic(f"takeover-{delivery}-{kind}")
    reliable = delivery == "reliable"
    with connection(broker) as old_ch, connection(broker) as new_ch:
        producer = create_producer(old_ch, topic, "p", DELIVERY[delivery])

        def publish(payload):
            send(old_ch, topic, producer, payload, "k")

        consumer_id = subscribe(old_ch, topic, "c", "s", TYPES[kind])
        old = Collector(receive(old_ch, consumer_id))
        new = again = None
        try:
            publish(b"before")
            msg = old.get()
            assert msg.payload == b"before"
            if reliable:
                ack(old_ch, "s", msg)

            assert subscribe(new_ch, topic, "c", "s", TYPES[kind]) == consumer_id
            assert old.ended.wait(2), "the old stream is still open after the takeover"
            assert old.code == grpc.StatusCode.ABORTED and "taken over" in old.details

            publish(b"gap")              # after the takeover, before the new stream opens
            new = Collector(receive(new_ch, consumer_id))
            msg = new.get()
            assert msg.payload == b"gap"
            if reliable:
                ack(new_ch, "s", msg)
            assert old.payloads == [b"before"]

            # The old client opens its stream again: it waits while the new one has it...
            again = Collector(receive(old_ch, consumer_id))
            publish(b"after")
            msg = new.get()
            assert msg.payload == b"after"
            if reliable:
                ack(new_ch, "s", msg)
            again.nothing(0.3)
            assert not again.ended.is_set()

            # ...and gets the consumer once the new owner's stream is gone.
            new.close()
            for _ in range(25):
                publish(b"late")
                try:
                    msg = again.get(0.2)
                    break
                except queue.Empty:
                    continue
            else:
                raise AssertionError("the waiting stream never got the consumer back")
            assert msg.payload == b"late"
            assert new.payloads == [b"gap", b"after"]
        finally:
            for c in (old, new, again):
                if c is not None:
                    c.close()


@pytest.mark.parametrize("delivery", list(DELIVERY))
def test_official_client_second_instance_with_the_same_name_gets_the_messages(
        broker, delivery):
    """Two client processes, one consumer name: once the second has subscribed, everything
    goes to it, while the first one (still running, reopening its stream) gets nothing."""
    official_python()
    topic = unique_topic(f"takeover-official-{delivery}")
    args = {"url": broker_url(broker), "topic": topic, "name": "same", "subscription": "tk",
            "kind": "exclusive"}
    first = second = None
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = create_producer(ch, topic, "p", DELIVERY[delivery])
        try:
            first = spawn_scenario("consumer_listen.py", args)
            first.wait_line("subscribed")
            send(ch, topic, producer, b"m0")
            first.wait_line("received m0")
            second = spawn_scenario("consumer_listen.py", args)
            second.wait_line("subscribed")
            for i in range(1, 6):
                send(ch, topic, producer, f"m{i}".encode())
            for i in range(1, 6):
                second.wait_line(f"received m{i}")
            # The first client must print nothing more: watched over a bounded window for
            # anything it was (wrongly) sent.
            def first_got():
                return [line for line in first.lines if line and line.startswith("received")]
            holds_for(lambda: first_got() == ["received m0"], 1.0,
                      what="the first client receiving nothing after the takeover")
        finally:
            for s in (first, second):
                if s is not None:
                    s.kill()
