"""End to end with the OFFICIAL Python client (danube-client 0.5.0) against the real broker
process: basic produce/consume on Shared and Exclusive, fan-out, Shared round robin, a consumer
joining mid-stream, producer re-creation by name (upstream danube-broker/tests
subscription_basic, pubsub_fanout_exclusive, queuing_shared_round_robin, consumer_churn,
producer_reconnect, partitioning_validation; reference (h)).

Each scenario runs in a subprocess of the official client's interpreter (tests/support/official_client.py,
scripts in tests/support/official_scripts/) and returns what it received; the assertions are here."""

import base64

import grpc
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeApi_pb2 as pb
from official_client import (broker_url, official_python, run_scenario, start_broker,
                             unique_topic)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    official_python()  # fail fast, before starting a broker, if the client is missing
    b = start_broker(tmp_path_factory.mktemp("e2e-basic") / "data")
    yield b
    b.stop()


def consumer(name, subscription, kind):
    return {"name": name, "subscription": subscription, "kind": kind}


def payloads(messages):
    return [m["payload"] for m in messages]


BINARY = bytes(range(256)) * 8 + b"\x00\x00\xff\xfe" + "é✓".encode()


@pytest.mark.parametrize("kind", ["shared", "exclusive"])
def test_hello_danube_round_trip(broker, kind):
    topic = unique_topic(f"basic-{kind}")
    attrs = {"k": "v", "empty": "", "unicode": "é✓ spaces and = signs"}
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic, "producer": {"name": "basic-producer"},
        "consumers": [consumer("basic-consumer", f"sub-{kind}", kind)],
        "messages": [{"payload": "Hello Danube", "attributes": attrs},
                     {"payload_b64": base64.b64encode(BINARY).decode()},
                     {"payload_b64": ""}],
        "expect": {"basic-consumer": 3}})
    got = result["received"]["basic-consumer"]
    assert len(got) == 3, got
    hello, binary, empty = got
    assert hello["payload"] == "Hello Danube"
    assert hello["attributes"] == attrs
    assert base64.b64decode(binary["payload_b64"]) == BINARY
    assert binary["attributes"] == {}
    assert empty["payload_b64"] == ""
    producer_id = result["producer_ids"][0]
    for m in got:
        assert m["topic"] == topic and "-part-" not in m["topic"]
        assert m["producer_id"] == producer_id
        assert m["producer_name"] == "basic-producer"
        assert m["topic_offset"] == 0          # non-reliable: no offsets
    # Every ack was accepted (non-reliable acks are no-ops that answer OK).
    assert result["ack_errors"] == {"basic-consumer": []}


def test_fanout_three_exclusive_subscriptions_each_get_everything(broker):
    topic = unique_topic("fanout")
    names = ["fan-a", "fan-b", "fan-c"]
    sent = [f"fanout-{i}" for i in range(24)]
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic,
        "consumers": [consumer(n, f"sub-{n}", "exclusive") for n in names],
        "messages": [{"payload": p} for p in sent],
        "expect": {n: 24 for n in names}})
    for n in names:
        assert payloads(result["received"][n]) == sent, n


def test_shared_subscription_splits_messages_exactly_once(broker):
    topic = unique_topic("shared-rr")
    names = ["rr-a", "rr-b", "rr-c"]
    sent = [f"rr-{i}" for i in range(36)]
    result = run_scenario("produce_consume.py", {
        "url": broker_url(broker), "topic": topic,
        "consumers": [consumer(n, "queue", "shared") for n in names],
        "messages": [{"payload": p} for p in sent],
        "expect_total": 36})
    per_consumer = {n: payloads(result["received"][n]) for n in names}
    everything = [p for got in per_consumer.values() for p in got]
    assert sorted(everything) == sorted(sent), per_consumer
    assert len(everything) == len(set(everything)) == 36
    counts = {n: len(got) for n, got in per_consumer.items()}
    assert all(c > 0 for c in counts.values()), counts
    # Round robin: roughly even.
    assert max(counts.values()) - min(counts.values()) <= 6, counts
    # Each consumer sees its share in publish order.
    for got in per_consumer.values():
        assert got == sorted(got, key=sent.index)


def test_consumer_joining_mid_stream_gets_no_duplicates_and_no_loss(broker):
    topic = unique_topic("churn")
    result = run_scenario("join_midstream.py", {
        "url": broker_url(broker), "topic": topic, "subscription": "churn-sub",
        "before": 15, "after": 30})
    assert result["early_got_first"]
    early, late = result["early"], result["late"]
    everything = early + late
    assert len(everything) == len(set(everything)), "duplicates delivered"
    assert sorted(everything) == sorted(f"m-{i}" for i in range(45))
    # The newcomer shares the messages published after it joined, and only those.
    assert late, "the consumer that joined mid-stream received nothing"
    assert all(int(p.split("-")[1]) >= 15 for p in late), late
    assert result["ack_errors"] == []


def test_producer_recreated_by_name_gets_the_same_id(broker):
    topic = unique_topic("reconnect")
    result = run_scenario("same_name.py", {"url": broker_url(broker), "topic": topic})
    assert result["first"] == result["second"] != 0
    assert result["other"] not in (0, result["first"])
    got = result["received"]
    assert payloads(got) == ["via second", "via first"]
    assert {m["producer_id"] for m in got} == {result["first"]}


def test_lookup_advertises_the_bound_port(tmp_path):
    """With `--broker-addr 127.0.0.1:0` the broker binds some free port; TopicLookup must
    advertise that port (reference b.1: broker_url = connect_url = <scheme>://<host>:<client
    port>), since clients dial the connect_url they are given."""
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            lookup = ch.unary_unary("/danube.Discovery/TopicLookup",
                                    request_serializer=pb.TopicLookupRequest.SerializeToString,
                                    response_deserializer=pb.TopicLookupResponse.FromString)
            resp = lookup(pb.TopicLookupRequest(request_id=1, topic="/system/_events_topic"),
                          timeout=5)
        assert resp.response_type == pb.TopicLookupResponse.Connect
        assert resp.connect_url == f"http://{b.client_addr}"
        assert resp.broker_url == f"http://{b.client_addr}"
        assert f"broker_url=http://{b.client_addr}" in b.log()
    finally:
        b.stop()


def test_official_client_on_a_port_zero_broker(tmp_path):
    """The same bug seen from the official client: it looks the topic up first and then
    dials the advertised connect_url."""
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    try:
        topic = unique_topic("port0")
        result = run_scenario("produce_consume.py", {
            "url": broker_url(b), "topic": topic,
            "consumers": [consumer("c", "s", "exclusive")],
            "messages": [{"payload": "Hello Danube"}], "expect": {"c": 1}}, timeout=40)
        assert payloads(result["received"]["c"]) == ["Hello Danube"]
    finally:
        b.stop()
