"""KeyShared messages whose key no consumer's key filters accept (reference b.5: "a key no
consumer's filter accepts is skipped"; upstream's reliable KeyShared dispatcher moves its
cursor past such a message). On a reliable topic the skip is an implicit ack: it must neither
stall the subscription nor come back after a restart. It is counted in
danube_subscription_unroutable_skipped_total."""

import re
import time
import urllib.request

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from broker_process import BrokerProcess
from grpc_calls import Collector, ack, create_producer, receive, send, subscribe
from official_client import broker_url, official_python, run_scenario, unique_topic

KEY_SHARED = pb.ConsumerRequest.KeyShared


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0",
                      data_dir=tmp_path_factory.mktemp("ks-unroutable") / "data").start()
    yield b
    b.stop()




def wait_disconnected(broker, topic, subscription, timeout=10.0):
    """Until the admin API's statistics show no connected consumer on the subscription."""
    request = ext.TopicStatsRequest(name=topic)
    with grpc.insecure_channel(broker.admin_addr) as ch:
        call = ch.unary_unary("/danube_ext.TopicStatsService/GetTopicStats",
                              request_serializer=ext.TopicStatsRequest.SerializeToString,
                              response_deserializer=ext.TopicStatsResponse.FromString)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            (stats,) = call(request, timeout=5).topics
            if all(s.consumers == 0 for s in stats.subscriptions if s.name == subscription):
                return
            time.sleep(0.02)
    raise AssertionError(f"{subscription} on {topic} still has a connected consumer")


def metric(broker, name, **labels):
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                  timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics:\n{body}")


def unroutable(broker, topic, sub):
    return metric(broker, "danube_subscription_unroutable_skipped_total", topic=topic,
                  subscription=sub)


def test_reliable_key_shared_skips_a_key_no_filter_accepts(broker):
    """Official client, filter user-*: user-1, zzz, user-2. Before the fix the dispatcher
    waited for ever for a consumer of zzz and user-2 never came."""
    official_python()
    topic = unique_topic("ks-skip")
    result = run_scenario("reliable_steps.py", {"url": broker_url(broker), "topic": topic,
                                                "steps": [
        {"op": "subscribe", "as": "u", "name": "users", "subscription": "kss",
         "kind": "key_shared", "key_filters": ["user-*"], "new_client": True},
        {"op": "produce", "payloads": ["one", "skip", "two"], "keys": ["user-1", "zzz", "user-2"]},
        {"op": "wait", "as": "u", "payloads": ["one", "two"], "timeout": 5},
        {"op": "quiet", "as": "u", "seconds": 0.5}]})
    assert result["errors"] == {"u": []}, result
    assert result["waits"] == [True], ("user-2 did not arrive", result["deliveries"])
    got = [(d["payload"], d["routing_key"], d["topic_offset"]) for d in result["deliveries"]["u"]]
    assert got == [("one", "user-1", 0), ("two", "user-2", 2)]
    assert unroutable(broker, topic, "kss") == 1
    # Acked user-1 and user-2 plus the skipped zzz: the cursor is at the end.
    assert metric(broker, "danube_subscription_lag_messages", topic=topic,
                  subscription="kss") == 0


def test_non_reliable_key_shared_counts_the_skip_too(broker):
    topic = unique_topic("ks-skip-nr")
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = create_producer(ch, topic, "p")
        consumer = subscribe(ch, topic, "users", "kss", KEY_SHARED, ["user-*"])
        got = Collector(receive(ch, consumer))
        try:
            for payload, key in ((b"one", "user-1"), (b"skip", "zzz"), (b"two", "user-2")):
                send(ch, topic, producer, payload, key)
            assert [got.get().payload for _ in range(2)] == [b"one", b"two"]
            got.nothing()
        finally:
            got.close()
    assert unroutable(broker, topic, "kss") == 1


def test_reliable_key_shared_message_waits_while_no_consumer_is_connected(broker):
    """Not unroutable: with nobody connected there is nobody whose filters reject it, and the
    next consumer (no filter) gets it."""
    topic = unique_topic("ks-wait")
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = create_producer(ch, topic, "p", pb.Reliable)
        users = Collector(receive(ch, subscribe(ch, topic, "users", "ksw", KEY_SHARED,
                                                ["user-*"])))
        users.close()
        # The cancel travels on grpcio's own thread: publish only once the broker has seen
        # the stream end, or the message meets a connected consumer that rejects its key.
        wait_disconnected(broker, topic, "ksw")
        send(ch, topic, producer, b"later", "zzz")
        anyone = Collector(receive(ch, subscribe(ch, topic, "anyone", "ksw", KEY_SHARED)))
        try:
            msg = anyone.get()
            assert (msg.payload, msg.routing_key) == (b"later", "zzz")
            ack(ch, "ksw", msg)
        finally:
            anyone.close()
    assert unroutable(broker, topic, "ksw") == 0


def test_reliable_key_shared_key_of_a_disconnected_consumer_waits_for_it(broker):
    """zzz-1 is accepted only by a consumer whose stream just ended: it may come back (until
    the broker removes it), so the message waits for it instead of being skipped."""
    topic = unique_topic("ks-back")
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer = create_producer(ch, topic, "p", pb.Reliable)
        users = Collector(receive(ch, subscribe(ch, topic, "users", "ksb", KEY_SHARED,
                                                ["user-*"])))
        zs = Collector(receive(ch, subscribe(ch, topic, "zs", "ksb", KEY_SHARED, ["zzz*"])))
        zs.close()
        try:
            send(ch, topic, producer, b"z", "zzz-1")
            users.nothing(0.5)
            zs = Collector(receive(ch, subscribe(ch, topic, "zs", "ksb", KEY_SHARED, ["zzz*"])))
            msg = zs.get()
            assert (msg.payload, msg.routing_key) == (b"z", "zzz-1")
            ack(ch, "ksb", msg)
        finally:
            users.close()
            zs.close()
    assert unroutable(broker, topic, "ksb") == 0


def test_reliable_skip_is_durable_across_a_restart(tmp_path):
    """The skipped message counts as acked in the persisted cursor: after a restart a
    consumer that takes every key gets only what is new, neither zzz nor user-2 again."""
    data = tmp_path / "data"
    b = BrokerProcess(data_dir=data).start()
    topic = unique_topic("ks-restart")
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            producer = create_producer(ch, topic, "p", pb.Reliable)
            users = Collector(receive(ch, subscribe(ch, topic, "users", "ksr", KEY_SHARED,
                                                    ["user-*"])))
            try:
                for payload, key in ((b"one", "user-1"), (b"skip", "zzz"), (b"two", "user-2")):
                    send(ch, topic, producer, payload, key)
                for want in (b"one", b"two"):
                    msg = users.get()
                    assert msg.payload == want
                    ack(ch, "ksr", msg)
            finally:
                users.close()
        b.stop()
        b = BrokerProcess(data_dir=data).start()
        with grpc.insecure_channel(b.client_addr) as ch:
            producer = create_producer(ch, topic, "p", pb.Reliable)
            anyone = Collector(receive(ch, subscribe(ch, topic, "anyone", "ksr", KEY_SHARED)))
            try:
                send(ch, topic, producer, b"new", "zzz")
                msg = anyone.get()
                assert (msg.payload, msg.msg_id.topic_offset) == (b"new", 3)
                anyone.nothing()
            finally:
                anyone.close()
    finally:
        b.stop()
