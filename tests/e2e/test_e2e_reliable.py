"""Reliable topics end to end with the OFFICIAL Python client (danube-client 0.5.0) against the
real broker process (upstream danube-broker/tests reliable_dispatch_basic,
reliable_dispatch_failure_handling, reliable_dispatch_reconnection, key_shared_basic (reliable
out-of-order acks) and key_shared_safety; reference b.4-b.6 and (h)).

The failure policy comes from the broker's config file (`dispatch.failure_policy`), so each
group of scenarios has its own broker. Scenarios run in subprocesses of the official client's
interpreter (tests/support/official_scripts/reliable_flow.py and reliable_steps.py; the consumers
follow a per-delivery plan, _lib.PlannedReceiver); the assertions are here.

Every reliable subscription here is created before the messages it must see are published:
a new reliable subscription starts at the live tail."""

import base64
import signal
import subprocess
import time

import pytest
import yaml

from broker_process import BrokerProcess
from official_client import (broker_url, official_python, run_scenario, spawn_scenario,
                             unique_topic)


# -- brokers ---------------------------------------------------------------------------------

FAST_RETRY = {"base_redelivery_delay_ms": 100, "max_redelivery_delay_ms": 100,
              "backoff_strategy": "fixed"}


def start_with_policy(root, name, policy, data_dir=None, **dispatch):
    """A broker whose config file sets dispatch.failure_policy (and other dispatch keys)."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / f"{name}.yml"
    config.write_text(yaml.safe_dump({"dispatch": {"failure_policy": policy, **dispatch}}))
    return BrokerProcess("--config-file", str(config),
                         data_dir=data_dir or root / f"{name}-data").start()


def stop_within(broker, timeout):
    """SIGTERM; True if the broker exited within `timeout`, else SIGKILL it and say False."""
    try:
        broker.stop(signal.SIGTERM, timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False          # BrokerProcess.stop killed it


def teardown(broker):
    stop_within(broker, 3)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """Short fixed redelivery delay, long ack timeout (nothing times out unless a test wants
    it to), Block after 5 failures."""
    official_python()  # fail fast, before starting a broker, if the client is missing
    b = start_with_policy(tmp_path_factory.mktemp("reliable"), "basic",
                          {**FAST_RETRY, "ack_timeout_ms": 30000, "max_redelivery_count": 5})
    yield b
    teardown(b)


def policy_broker(tmp_path_factory, name, **policy):
    official_python()
    return start_with_policy(tmp_path_factory.mktemp(name), name,
                             {**FAST_RETRY, "max_redelivery_count": 2, **policy})


@pytest.fixture(scope="module")
def block_broker(tmp_path_factory):
    b = policy_broker(tmp_path_factory, "block", ack_timeout_ms=500, poison_policy="block")
    yield b
    teardown(b)


@pytest.fixture(scope="module")
def drop_broker(tmp_path_factory):
    b = policy_broker(tmp_path_factory, "drop", ack_timeout_ms=5000, poison_policy="drop")
    yield b
    teardown(b)


DLQ_TEMPLATE = "/{namespace}/{topic}-{subscription}-dlq"


@pytest.fixture(scope="module")
def dlq_broker(tmp_path_factory):
    b = policy_broker(tmp_path_factory, "dlq", ack_timeout_ms=5000, poison_policy="dead_letter",
                      dead_letter_topic=DLQ_TEMPLATE)
    yield b
    teardown(b)


# -- helpers ---------------------------------------------------------------------------------

def flow(broker, topic, consumers, messages, **extra):
    return run_scenario("reliable_flow.py", {
        "url": broker_url(broker), "topic": topic, "consumers": consumers,
        "messages": messages, **extra})


def steps(broker, topic, *step_list, timeout=60):
    return run_scenario("reliable_steps.py", {"url": broker_url(broker), "topic": topic,
                                              "steps": list(step_list)}, timeout=timeout)


def consumer(name, subscription, kind="exclusive", plan=None):
    return {"name": name, "subscription": subscription, "kind": kind, "plan": plan or {}}


def subscribe(label, name, subscription, kind="exclusive", plan=None, new_client=True):
    return {"op": "subscribe", "as": label, "name": name, "subscription": subscription,
            "kind": kind, "plan": plan or {}, "new_client": new_client}


def produce(*payloads, keys=None):
    return {"op": "produce", "payloads": list(payloads), "keys": keys}


def wait(label, *payloads, attempts=1, timeout=10):
    return {"op": "wait", "as": label, "payloads": list(payloads), "attempts": attempts,
            "timeout": timeout}


def close(label):
    return {"op": "close", "as": label}


def quiet(label, seconds=0.3):
    return {"op": "quiet", "as": label, "seconds": seconds}


def sleep(seconds):
    return {"op": "sleep", "seconds": seconds}


def all_deliveries(result):
    return [d for ds in result["deliveries"].values() for d in ds]


def of(deliveries, payload):
    return [d for d in deliveries if d["payload"] == payload]


def no_errors(result):
    assert all(not errs for errs in result["errors"].values()), result["errors"]


def blob(i):
    """1 KiB holding every byte value, rotated by i: distinct and binary."""
    return bytes((b + i) % 256 for b in range(256)) * 4


# -- basic delivery ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["exclusive", "shared"])
def test_binary_payloads_arrive_byte_exact_with_consecutive_offsets(broker, kind):
    topic = unique_topic(f"rel-basic-{kind}")
    n = 20
    result = flow(broker, topic, [consumer("blob-consumer", f"blob-{kind}", kind)],
                  [{"payload_b64": base64.b64encode(blob(i)).decode(),
                    "attributes": {"i": str(i)}} for i in range(n)],
                  acked_count=n)
    no_errors(result)
    assert result["settled_met"], result
    got = result["deliveries"]["blob-consumer"]
    assert [d["topic_offset"] for d in got] == list(range(n))
    assert [base64.b64decode(d["payload_b64"]) for d in got] == [blob(i) for i in range(n)]
    assert [d["attributes"] for d in got] == [{"i": str(i)} for i in range(n)]
    assert all(d["attempt"] == 1 and d["action"] == "ack" for d in got)
    producer_id = result["producer_ids"][0]
    assert all(d["topic"] == topic and d["producer_id"] == producer_id for d in got)


def test_burst_on_shared_is_delivered_once_through_a_window_of_10(broker):
    """100 messages against the default window of 10 unacked messages, two Shared consumers:
    each message arrives exactly once (upstream reliable_dispatch_heartbeat: a burst whose
    notifications coalesce is still dispatched completely)."""
    topic = unique_topic("rel-burst")
    n = 100
    result = flow(broker, topic, [consumer("bu-a", "burst", "shared"),
                                  consumer("bu-b", "burst", "shared")],
                  [{"payload": f"b{i}"} for i in range(n)], acked_count=n)
    no_errors(result)
    assert result["settled_met"], result
    got = all_deliveries(result)
    assert sorted(d["topic_offset"] for d in got) == list(range(n))
    assert all(d["payload"] == f"b{d['topic_offset']}" for d in got)
    assert all(result["deliveries"].values()), "both consumers should get a share"


# -- nack and ack timeout -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["exclusive", "shared"])
def test_nack_redelivers_the_same_offset(broker, kind):
    topic = unique_topic(f"rel-nack-{kind}")
    sub = f"nack-{kind}"
    # The first delivery of n0 is nacked (on Exclusive with delay_ms 600, more than the
    # policy's 100 ms: the larger one wins), the second acked. Shared has two consumers: the
    # redelivery may go to either.
    first = "nack@600:try again" if kind == "exclusive" else "nack"
    plan = {"by_payload": {"n0": [first, "ack"]}}
    consumers = [consumer("nc-a", sub, kind, plan)]
    if kind == "shared":
        consumers.append(consumer("nc-b", sub, kind, plan))
    result = flow(broker, topic, consumers, [{"payload": "n0"}, {"payload": "n1"}],
                  settled=["n0", "n1"])
    no_errors(result)
    assert result["settled_met"], result
    got = all_deliveries(result)
    n0 = sorted(of(got, "n0"), key=lambda d: d["t"])
    assert [d["attempt"] for d in n0] == [1, 2], n0
    assert n0[0]["topic_offset"] == n0[1]["topic_offset"] == 0
    gap = n0[1]["t"] - n0[0]["t"]
    assert gap >= (0.55 if kind == "exclusive" else 0.08), n0
    assert [d["topic_offset"] for d in of(got, "n1")] == [1]


def test_ack_timeout_redelivers_the_same_offset(block_broker):
    topic = unique_topic("rel-ack-timeout")
    plan = {"by_payload": {"t0": ["hold", "ack"]}}      # ack_timeout_ms is 500 here
    result = flow(block_broker, topic, [consumer("to-consumer", "to-sub", "exclusive", plan)],
                  [{"payload": "t0"}, {"payload": "t1"}], settled=["t0", "t1"])
    no_errors(result)
    assert result["settled_met"], result
    got = result["deliveries"]["to-consumer"]
    t0 = of(got, "t0")
    assert [(d["attempt"], d["topic_offset"]) for d in t0] == [(1, 0), (2, 0)], got
    assert t0[1]["t"] - t0[0]["t"] >= 0.45
    assert [d["topic_offset"] for d in of(got, "t1")] == [1]


# -- reconnection --------------------------------------------------------------------------

def test_exclusive_unacked_message_is_redelivered_after_reconnects(broker):
    topic = unique_topic("rel-reconnect")
    sub = "reconnect-sub"
    hold = {"default": "hold"}
    # A consumer process receives r0 and exits without acking it.
    first = steps(broker, topic, subscribe("s0", "rc", sub, plan=hold, new_client=False),
                  produce("r0"), wait("s0", "r0"))
    assert first["waits"] == [True], first
    offset = of(first["deliveries"]["s0"], "r0")[0]["topic_offset"]
    # Later sessions, each a new connection subscribing with the same consumer name: the first
    # two hold r0 and close, the third acks it; a fourth gets nothing old, only what is new.
    result = steps(broker, topic,
                   subscribe("s1", "rc", sub, plan=hold), wait("s1", "r0"), close("s1"),
                   subscribe("s2", "rc", sub, plan=hold), wait("s2", "r0"), close("s2"),
                   subscribe("s3", "rc", sub), wait("s3", "r0"), quiet("s3"), close("s3"),
                   subscribe("s4", "rc", sub), quiet("s4", 0.8), produce("r1"),
                   wait("s4", "r1"), quiet("s4"))
    no_errors(result)
    assert result["waits"] == [True, True, True, True], result
    for label in ("s1", "s2", "s3"):
        got = result["deliveries"][label]
        assert [(d["payload"], d["topic_offset"]) for d in got] == [("r0", offset)], (label, got)
    assert [(d["payload"], d["topic_offset"]) for d in result["deliveries"]["s4"]] == \
        [("r1", offset + 1)]


def test_exclusive_takeover_by_name_redelivers_unacked_message(broker):
    """A consumer process that holds an unacked message freezes (SIGSTOP: its connection
    stays open, so the broker sees no disconnect). A replacement subscribing with the same
    consumer name takes the consumer over (reference b.5: the old stream is cancelled and the
    dispatcher's pending state reset), so the unacked message comes to it at once, not only
    after the ack timeout (30 s here)."""
    topic = unique_topic("rel-takeover")
    old = spawn_scenario("reliable_hold.py", {
        "url": broker_url(broker), "topic": topic, "name": "tk", "subscription": "tk-sub",
        "kind": "exclusive", "payloads": ["x0"]})
    try:
        assert old.wait_line("received x0") == "received x0 0"
        old.proc.send_signal(signal.SIGSTOP)
        result = steps(broker, topic, subscribe("new", "tk", "tk-sub"),
                       wait("new", "x0", timeout=5), quiet("new"))
    finally:
        old.kill()
    no_errors(result)
    assert result["waits"] == [True], ("the unacked message did not reach the consumer that "
                                       "took over by name within 5 s", result["deliveries"])
    assert [(d["payload"], d["topic_offset"]) for d in result["deliveries"]["new"]] == \
        [("x0", 0)]


def test_shared_unacked_message_goes_to_another_consumer_when_its_consumer_leaves(broker):
    topic = unique_topic("rel-shared-leave")
    sub = "leave-sub"
    result = steps(broker, topic,
                   subscribe("a", "sh-a", sub, "shared", {"default": "hold"}),
                   produce("s0"), wait("a", "s0"),
                   subscribe("b", "sh-b", sub, "shared"), sleep(0.2),
                   close("a"), wait("b", "s0"), produce("s1"), wait("b", "s1"), quiet("b"))
    no_errors(result)
    assert result["waits"] == [True, True, True], result
    a, b = result["deliveries"]["a"], result["deliveries"]["b"]
    assert [(d["payload"], d["topic_offset"]) for d in a] == [("s0", 0)]
    assert [(d["payload"], d["topic_offset"]) for d in b] == [("s0", 0), ("s1", 1)]


# -- KeyShared -------------------------------------------------------------------------------

def test_key_shared_out_of_order_acks_deliver_everything_in_key_order(tmp_path):
    """Two KeyShared consumers each ack their messages in reverse order (3 at a time, the
    rest after a pause); everything arrives once, in key order. Afterwards the cursor has
    moved past everything: after a broker crash and restart a reconnecting consumer gets
    nothing old."""
    official_python()
    data = tmp_path / "data"
    b = start_with_policy(tmp_path, "ks", {**FAST_RETRY, "ack_timeout_ms": 30000}, data)
    topic = unique_topic("rel-ks-ooo")
    keys = [f"k{i}" for i in range(6)]
    messages = [{"payload": f"{k}-{i}", "key": k} for i in range(4) for k in keys]
    try:
        plan = {"reverse_batch": 3}
        result = flow(b, topic, [consumer("ks-a", "ks-sub", "key_shared", plan),
                                 consumer("ks-b", "ks-sub", "key_shared", plan)],
                      messages, settled=[m["payload"] for m in messages], quiet=0.5)
        no_errors(result)
        assert result["settled_met"], result
        got = all_deliveries(result)
        assert sorted(d["payload"] for d in got) == sorted(m["payload"] for m in messages)
        assert all(d["attempt"] == 1 for d in got), "nothing should have been redelivered"
        owners = {}
        for name, deliveries in result["deliveries"].items():
            for d in deliveries:
                owners.setdefault(d["routing_key"], set()).add(name)
        assert all(len(o) == 1 for o in owners.values()), owners     # key affinity
        assert all(result["deliveries"].values()), "both consumers should own some keys"
        for name, deliveries in result["deliveries"].items():
            for k in keys:
                seq = [int(d["payload"].split("-")[1]) for d in deliveries
                       if d["routing_key"] == k]
                assert seq == sorted(seq), (name, k, seq)
        # One more while no consumer is connected, then a crash: the persisted cursor must
        # be exactly past the 24 acked messages (a reconnecting consumer gets the late one
        # and nothing older).
        steps(b, topic, produce("k1-late", keys=["k1"]))
        b.stop(signal.SIGKILL)
        b = BrokerProcess("--config-file", str(tmp_path / "ks.yml"), data_dir=data).start()
        again = steps(b, topic, subscribe("again", "ks-a", "ks-sub", "key_shared"),
                      quiet("again", 0.8), produce("k0-new", keys=["k0"]),
                      wait("again", "k0-new"), quiet("again"))
        no_errors(again)
        assert [(d["payload"], d["topic_offset"]) for d in again["deliveries"]["again"]] == \
            [("k1-late", len(messages)), ("k0-new", len(messages) + 1)]
    finally:
        teardown(b)


# -- poison policies -------------------------------------------------------------------------

def test_block_stalls_the_subscription_after_max_redeliveries(block_broker):
    topic = unique_topic("rel-block")
    result = steps(block_broker, topic,
                   subscribe("c", "blk", "block-sub", plan={"by_payload": {"poison": ["nack"]}}),
                   produce("before", "poison"), wait("c", "poison", attempts=3),
                   sleep(0.3), produce("after-1", "after-2"), sleep(1.2), quiet("c"))
    no_errors(result)
    assert result["waits"] == [True], result
    got = result["deliveries"]["c"]
    assert [d["attempt"] for d in of(got, "poison")] == [1, 2, 3]   # max_redelivery_count 2
    assert [d["payload"] for d in of(got, "before")] == ["before"]
    assert not of(got, "after-1") and not of(got, "after-2"), got


def test_drop_skips_the_poison_message_and_later_ones_flow(drop_broker):
    topic = unique_topic("rel-drop")
    result = steps(drop_broker, topic,
                   subscribe("c", "drp", "drop-sub", plan={"by_payload": {"poison": ["nack"]}}),
                   produce("poison", "d1", "d2"), wait("c", "poison", attempts=3),
                   wait("c", "d1", "d2"), sleep(0.3), produce("d3"), wait("c", "d3"),
                   quiet("c", 0.5), close("c"),
                   subscribe("again", "drp", "drop-sub"), quiet("again", 0.6))
    no_errors(result)
    assert result["waits"] == [True, True, True], result
    got = result["deliveries"]["c"]
    assert [(d["attempt"], d["topic_offset"]) for d in of(got, "poison")] == \
        [(1, 0), (2, 0), (3, 0)]
    for offset, payload in enumerate(["d1", "d2", "d3"], 1):
        assert [d["topic_offset"] for d in of(got, payload)] == [offset], got
    assert result["deliveries"]["again"] == []


def test_key_shared_block_stalls_only_the_poisoned_key(block_broker):
    topic = unique_topic("rel-ks-block")
    sub = "ks-block-sub"
    plan = {"by_key": {"bad": ["nack"]}}
    result = steps(block_broker, topic,
                   subscribe("a", "ksb-a", sub, "key_shared", plan),
                   subscribe("b", "ksb-b", sub, "key_shared", plan),
                   produce("bad-0", "good-0", "other-0", keys=["bad", "good", "other"]),
                   wait("*", "bad-0", attempts=3), sleep(0.3),
                   produce("bad-1", "good-1", "other-1", "good-2",
                           keys=["bad", "good", "other", "good"]),
                   sleep(1.0), quiet("a"), quiet("b"))
    no_errors(result)
    assert result["waits"] == [True], result
    got = all_deliveries(result)
    assert sorted(d["attempt"] for d in of(got, "bad-0")) == [1, 2, 3], got
    assert not of(got, "bad-1"), "the blocked key must not make progress"
    for payload in ("good-0", "other-0", "good-1", "other-1", "good-2"):
        assert len(of(got, payload)) == 1, (payload, got)


@pytest.fixture(scope="module")
def dead_letter_run(dlq_broker):
    """One scenario for the DeadLetter tests: two poison messages (one nacked with a reason,
    one without) between good ones; the dead-letter topic (from the template
    /{namespace}/{topic}-{subscription}-dlq) is created and subscribed to first."""
    topic = unique_topic("rel-dlq")
    sub = "dlq-sub"
    dlq_topic = f"{topic}-{sub}-dlq"
    plan = {"by_payload": {"poison-r": ["nack:bad payload"], "poison-n": ["nack"]}}
    messages = [{"payload": "ok-1"}, {"payload": "poison-r", "attributes": {"app": "x"}},
                {"payload": "ok-2"}, {"payload": "poison-n"}, {"payload": "ok-3"}]
    result = flow(dlq_broker, topic, [consumer("dl-c", sub, "exclusive", plan)], messages,
                  dlq={"topic": dlq_topic, "subscription": "dlq-reader"},
                  settled=["ok-1", "ok-2", "ok-3"], dlq_count=2)
    return topic, sub, dlq_topic, result


def test_dead_letter_republishes_the_poison_message_with_origin_attributes(dead_letter_run):
    topic, sub, dlq_topic, result = dead_letter_run
    no_errors(result)
    assert result["settled_met"] and result["dlq_met"], result
    got = result["deliveries"]["dl-c"]
    original = of(got, "poison-r")
    assert [d["attempt"] for d in original] == [1, 2, 3]
    dead = {m["payload"]: m for m in result["dlq"]}
    assert sorted(dead) == ["poison-n", "poison-r"], result["dlq"]
    m = dead["poison-r"]
    assert m["topic"] == dlq_topic
    assert m["producer_id"] == 0
    attrs = m["attributes"]
    assert attrs["app"] == "x"                   # the message's own attributes are kept
    assert attrs["x-original-topic"] == topic
    assert attrs["x-original-subscription"] == sub
    assert attrs["x-original-topic-offset"] == str(original[0]["topic_offset"]) == "1"
    assert attrs["x-original-producer-id"] == str(result["producer_ids"][0])
    assert attrs["x-original-broker-addr"] == original[0]["broker_addr"]
    assert attrs["x-delivery-attempt"] == "3"
    assert attrs["x-failure-reason"] == "bad payload"
    # The main subscription went on past both poison messages.
    assert [d["topic_offset"] for d in got if d["payload"].startswith("ok-")] == [0, 2, 4]


def test_dead_letter_poison_policy_label_is_upstreams(dead_letter_run):
    """Upstream labels the policy in snake case (poison_policy_label: "dead_letter"; its
    reliable_dispatch_failure_handling test asserts exactly that)."""
    _, _, _, result = dead_letter_run
    for m in result["dlq"]:
        assert m["attributes"].get("x-poison-policy") == "dead_letter", m["attributes"]


def test_dead_letter_without_a_nack_reason_has_no_failure_reason(dead_letter_run):
    """x-failure-reason is added only when the nack gave a reason (reference b.6; upstream
    sets it from the last nack's Option<reason>)."""
    _, _, _, result = dead_letter_run
    dead = {m["payload"]: m for m in result["dlq"]}
    assert "poison-n" in dead, result["dlq"]
    assert "x-failure-reason" not in dead["poison-n"]["attributes"], dead["poison-n"]


# -- broker restart --------------------------------------------------------------------------

def test_subscription_resumes_after_a_broker_restart(tmp_path):
    """30 published, 10 consumed and acked, the consumer closes, SIGTERM; after a restart on
    the same data dir (new ports) 10 more are published and the same subscription gets
    offsets 10..39, each exactly once (nothing was delivered without an ack before)."""
    official_python()
    data = tmp_path / "data"
    b = start_with_policy(tmp_path, "restart", {**FAST_RETRY}, data)
    topic = unique_topic("rel-restart")
    first = [f"m{i}" for i in range(10)]
    try:
        before = steps(b, topic, subscribe("c", "rs", "durable"), produce(*first),
                       wait("c", *first), quiet("c", 0.2), close("c"),
                       produce(*(f"m{i}" for i in range(10, 30))))
        no_errors(before)
        assert before["waits"] == [True], before
        assert [d["topic_offset"] for d in before["deliveries"]["c"]] == list(range(10))
        t = time.monotonic()
        clean = stop_within(b, 10)
        stop_seconds = time.monotonic() - t
        b = BrokerProcess("--config-file", str(tmp_path / "restart.yml"), data_dir=data).start()
        rest = [f"m{i}" for i in range(10, 40)]
        after = steps(b, topic, produce(*(f"m{i}" for i in range(30, 40))),
                      subscribe("c", "rs", "durable"), wait("c", *rest, timeout=5),
                      quiet("c", 0.5))
        no_errors(after)
        got = after["deliveries"]["c"]
        assert [(d["payload"], d["topic_offset"]) for d in got] == \
            [(f"m{i}", i) for i in range(10, 40)], \
            ("the subscription did not resume at its persisted cursor + 1 after the restart",
             [(d["payload"], d["topic_offset"]) for d in got])
        assert clean, f"the broker did not exit within 10 s of SIGTERM ({stop_seconds:.1f} s)"
    finally:
        teardown(b)
