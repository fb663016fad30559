"""The reliable dispatcher's state machine against an in-memory log: window, out-of-order
acks and the cursor, nack and ack-timeout redelivery with backoff, poison policies, consumer
loss, KeyShared per-key blocking. End-to-end behaviour over the real WAL and the official
client is tested in test_e2e_reliable.py."""

import asyncio

import pytest

from danube import failure_policy as fp
from danube.broker.consumer import Consumer
from danube.broker.subscription import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED
from danube.codec.grpcframe import GrpcDeframer
from danube.proto import DanubeApi_pb2 as pb

from reliable_memory import MemoryTopic, drain, make
from waiting import async_holds_for, async_wait_for


async def settle():
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_window_bounds_inflight_and_acks_advance_the_cursor():
    topic, d, (c,), saved, _ = await make(window=3)
    for i in range(5):
        topic.publish(b"m%d" % i)
    await settle()
    assert [m.msg_id.topic_offset for m in drain(c)] == [0, 1, 2]
    d.ack(1)                                    # out of order
    await settle()
    assert d.cursor == -1 and d.acked == {1}
    assert [m.msg_id.topic_offset for m in drain(c)] == [3]
    d.ack(0)
    assert d.cursor == 1
    d.ack(2)
    d.ack(3)
    await settle()
    assert [m.msg_id.topic_offset for m in drain(c)] == [4]
    assert d.cursor == 3
    await d.close()
    assert saved[-1] == 3


async def test_nack_redelivers_the_same_offset_after_the_delay():
    topic, d, (c,), _, _ = await make(base_redelivery_delay_ms=300, backoff_strategy="fixed")
    topic.publish(b"x")
    await settle()
    assert [m.payload for m in drain(c)] == [b"x"]
    d.nack(0)
    await settle()
    assert drain(c) == []                      # not before the delay
    again = await async_wait_for(lambda: drain(c), what="the redelivery")
    assert [(m.payload, m.msg_id.topic_offset) for m in again] == [(b"x", 0)]
    assert d.stats["redelivered"] == 1
    await d.close()


async def test_nack_delay_wins_when_larger_than_backoff():
    topic, d, (c,), _, _ = await make(base_redelivery_delay_ms=1)
    topic.publish(b"x")
    await settle()
    drain(c)
    d.nack(0, delay_ms=200)
    # Not before the nack's own delay (watched over half of it) ...
    await async_holds_for(lambda: drain(c) == [], 0.1, what="no redelivery before 200 ms")
    # ... and then once.
    assert len(await async_wait_for(lambda: drain(c), what="the redelivery")) == 1
    await d.close()


async def test_ack_timeout_redelivers():
    topic, d, (c,), _, _ = await make(ack_timeout_ms=300, base_redelivery_delay_ms=0)
    topic.publish(b"x")
    await settle()
    assert len(drain(c)) == 1
    again = await async_wait_for(lambda: drain(c), what="the redelivery after the ack timeout")
    assert [m.payload for m in again] == [b"x"]
    assert d.stats["ack_timeouts"] >= 1
    await d.close()


async def test_exponential_backoff_values():
    p = fp.FailurePolicy(base_redelivery_delay_ms=100, max_redelivery_delay_ms=500)
    assert [p.redelivery_delay_ms(a) for a in (1, 2, 3, 4, 5)] == [100, 200, 400, 500, 500]
    f = fp.FailurePolicy(base_redelivery_delay_ms=100, backoff_strategy="fixed")
    assert [f.redelivery_delay_ms(a) for a in (1, 5)] == [100, 100]


@pytest.mark.parametrize("policy", ["drop", "block", "dead_letter"])
async def test_poison_policies(policy):
    extra = {"dead_letter_topic": "/default/dlq"} if policy == "dead_letter" else {}
    topic, d, (c,), _, dead = await make(max_redelivery_count=2, base_redelivery_delay_ms=0,
                                         poison_policy=policy, **extra)
    topic.publish(b"poison")
    topic.publish(b"next")
    await settle()
    delivered = [m.payload for m in drain(c)]
    assert delivered == [b"poison", b"next"]
    d.ack(1)
    for _ in range(3):                          # 1 delivery + 2 redeliveries, all nacked
        d.nack(0)
        await settle()
        drain(c)
    await settle()
    assert d.stats["exhausted"] == 1
    if policy == "block":
        assert d.stalled and d.cursor == -1
        topic.publish(b"after")
        await settle()
        assert drain(c) == []                   # the subscription is stalled
    else:
        assert d.cursor == 1                    # the poison message counts as done
        topic.publish(b"after")
        await settle()
        assert [m.payload for m in drain(c)] == [b"after"]
    if policy == "dead_letter":
        assert dead == [(0, 3, None)]
    await d.close()


async def test_key_shared_block_stalls_only_that_key():
    topic, d, (a, b), _, _ = await make(KEY_SHARED, consumers=("a", "b"), window=100,
                                        max_redelivery_count=0, poison_policy="block")
    topic.publish(b"k1-0", key="k1")
    await settle()
    got = drain(a) + drain(b)
    assert [m.payload for m in got] == [b"k1-0"]
    d.nack(0)                                   # max_redelivery_count 0: poisoned at once
    await settle()
    for i in range(1, 4):
        topic.publish(b"k1-%d" % i, key="k1")
        topic.publish(b"k2-%d" % i, key="k2")
    await settle()
    got = [m.payload for m in drain(a) + drain(b)]
    assert sorted(got) == [b"k2-1", b"k2-2", b"k2-3"]
    assert d.blocked_keys == {"k1": 0}
    await d.close()


async def test_consumer_leaving_hands_its_messages_to_another_shared_consumer():
    topic, d, (a, b), _, _ = await make(SHARED, consumers=("a", "b"))
    for i in range(4):
        topic.publish(b"m%d" % i)
    await settle()
    from_a = drain(a)
    drain(b)
    assert from_a
    d.sub.remove(a)
    d.consumer_left(a)
    await settle()
    again = drain(b)
    assert sorted(m.msg_id.topic_offset for m in again) == \
        sorted(m.msg_id.topic_offset for m in from_a)
    assert d.stats["redelivered"] == len(from_a)
    assert all(d.attempts.get(m.msg_id.topic_offset, 0) == 0 for m in again)
    await d.close()


def _stream_lost(d, consumer):
    """What a consumer's connection dying does: inactive, its in-flight messages back."""
    consumer.active = False
    d.consumer_left(consumer, stream_ended=True)
    d.sub.consumer_changed()


async def test_failover_sends_a_dead_consumers_messages_before_anything_newer():
    topic, d, (a, b), _, _ = await make(FAILOVER, consumers=("a", "b"),
                                        base_redelivery_delay_ms=300, backoff_strategy="fixed")
    for i in range(5):
        topic.publish(b"m%d" % i)
    await settle()
    assert [m.msg_id.topic_offset for m in drain(a)] == [0, 1, 2, 3, 4]
    _stream_lost(d, a)
    for i in range(5, 8):
        topic.publish(b"m%d" % i)
    await settle()
    assert drain(b) == []           # the backoff runs: nothing newer meanwhile
    got = []
    await async_wait_for(lambda: got.extend(drain(b)) or len(got) >= 8, what="8 messages")
    assert [m.msg_id.topic_offset for m in got] == list(range(8))
    await d.close()


@pytest.mark.parametrize("sub_type", [FAILOVER, KEY_SHARED])
async def test_a_dead_consumers_unsent_messages_wait_for_its_sent_ones(sub_type):
    """Its stream lost with some messages on the wire (a failed attempt: they back off) and
    newer ones still in its outbox (never sent: no backoff): the newer ones must not reach
    the next consumer first (seen in the soak: a failover standby got offsets 2248-2253 a
    second before 2240-2247), and a message with more failed attempts (a longer backoff)
    must not be overtaken by a later one with fewer."""
    topic, d, (a, b), _, _ = await make(sub_type, consumers=("a", "b"), window=20,
                                        base_redelivery_delay_ms=200,
                                        backoff_strategy="exponential")
    key = "k" if sub_type == KEY_SHARED else None
    owner = a
    for i in range(2):
        topic.publish(b"m%d" % i, key=key)
    await settle()
    if sub_type == KEY_SHARED and not a.outbox.count:
        owner, b = b, a                 # the key hashed to the other consumer
    assert [m.msg_id.topic_offset for m in drain(owner)] == [0, 1]
    d.nack(0)                           # offset 0: one failed attempt already
    await async_wait_for(lambda: owner.outbox.count, what="offset 0 sent again")
    for i in range(2, 5):
        topic.publish(b"m%d" % i, key=key)
    await settle()
    assert sorted(m.msg_id.topic_offset for m in drain(owner)) == [0, 2, 3, 4]
    for i in range(5, 8):
        topic.publish(b"m%d" % i, key=key)
    await settle()                      # 5-7 wait in the outbox: never sent
    _stream_lost(d, owner)
    got = []
    await async_wait_for(lambda: got.extend(drain(b)) or len(got) >= 8, what="8 messages")
    assert [m.msg_id.topic_offset for m in got] == list(range(8))
    await d.close()


async def test_a_consumer_joining_gets_a_dead_consumers_messages_at_once():
    topic, d, (a,), _, _ = await make(EXCLUSIVE, base_redelivery_delay_ms=60_000)
    d.sub.dispatcher = d            # as the broker wires it: Subscription.add tells it
    for i in range(3):
        topic.publish(b"m%d" % i)
    await settle()
    assert len(drain(a)) == 3
    _stream_lost(d, a)
    d.sub.remove(a)
    topic.publish(b"m3")
    c = Consumer(9, "again", d.sub, loop=asyncio.get_running_loop())
    d.sub.add(c)
    got = []
    await async_wait_for(lambda: got.extend(drain(c)) or len(got) >= 4, what="4 messages")
    assert [m.msg_id.topic_offset for m in got] == [0, 1, 2, 3]
    assert all(d.attempts[o] == 1 for o in (0, 1, 2))      # still counted as attempts
    await d.close()


async def test_key_shared_holds_newer_messages_of_a_dead_consumers_keys():
    topic, d, (a, b), _, _ = await make(KEY_SHARED, consumers=("a", "b"), window=100,
                                        base_redelivery_delay_ms=300, backoff_strategy="fixed")
    keys = [f"key-{i}" for i in range(16)]
    for i, key in enumerate(keys):
        topic.publish(b"first-%d" % i, key=key)
    await settle()
    owned_by_a = {m.routing_key for m in drain(a)}
    drain(b)
    assert owned_by_a
    _stream_lost(d, a)
    for i, key in enumerate(keys):
        topic.publish(b"second-%d" % i, key=key)
    await settle()
    early = drain(b)
    # the first of a's keys among the new messages holds back itself and what follows
    first_held = next(i for i, key in enumerate(keys) if key in owned_by_a)
    assert [m.routing_key for m in early] == keys[:first_held]
    got = list(early)
    await async_wait_for(lambda: got.extend(drain(b)) or len(got) >= len(owned_by_a) + 16,
                         what="every message")
    for key in keys:
        payloads = [m.payload.split(b"-")[0] for m in got if m.routing_key == key]
        assert payloads == ([b"first"] if key in owned_by_a else []) + [b"second"], key
    await d.close()


def test_dead_letter_needs_a_topic():
    with pytest.raises(fp.InvalidFailurePolicy, match="dead_letter_topic"):
        fp.FailurePolicy(poison_policy="dead_letter").validate()
    policy = fp.FailurePolicy.from_config({"poison_policy": "DeadLetter",
                                           "dead_letter_topic": "/{namespace}/{topic}-dlq"})
    assert policy.for_subscription("/default/orders", "s").dead_letter_topic == \
        "/default/orders-dlq"
    with pytest.raises(fp.InvalidFailurePolicy, match="unknown keys"):
        fp.FailurePolicy.from_config({"max_retries": 3})


async def test_messages_deleted_by_retention_are_skipped_with_a_count():
    from danube.storage.errors import OffsetTruncatedError

    topic, d, (c,), _, _ = await make(window=100)
    for i in range(10):
        topic.publish(b"m%d" % i)
    original_read = topic.read

    def read(offset, n):                       # retention deleted offsets 0..5
        if offset < 6:
            raise OffsetTruncatedError(offset, 6)
        return original_read(offset, n)
    d.next_read = 0
    topic.read = read
    await settle()
    assert [m.msg_id.topic_offset for m in drain(c)] == [6, 7, 8, 9]
    assert d.cursor == 5 and d.stats["dropped"] == 6
    await d.close()


async def test_shared_round_robin_runs_across_passes():
    topic, d, (a, b, c), _, _ = await make(SHARED, consumers=("a", "b", "c"), window=100)
    for i in range(7):
        topic.publish(b"m%d" % i)
    await settle()
    for i in range(7, 9):
        topic.publish(b"m%d" % i)
    await settle()
    got = {x.name: [m.msg_id.topic_offset for m in drain(x)] for x in (a, b, c)}
    # The second pass goes on with the consumer whose turn it is.
    assert got == {"a": [0, 3, 6], "b": [1, 4, 7], "c": [2, 5, 8]}
    assert sorted(d.inflight) == list(range(9))
    assert all(d.inflight[o].consumer is x for x, offs in zip((a, b, c), got.values())
               for o in offs)
    await d.close()


async def test_shared_run_stops_at_a_full_outbox_and_resumes_without_loss():
    topic, d, (a, b), _, _ = await make(SHARED, consumers=("a", "b"), window=100)
    a.outbox.limit = 1                          # room for one message, then refusals
    for i in range(6):
        topic.publish(b"m%d" % i)
    await settle()
    from_a, from_b = ([m.msg_id.topic_offset for m in drain(x)] for x in (a, b))
    # a's second turn was refused: the run stopped there (the next pass starts with b's
    # turn, so b may have taken one more), and nothing was recorded for a refusal.
    assert from_a == [0] and from_b[0] == 1 and len(from_b) <= 2
    assert sorted(d.inflight) == from_a + from_b
    a.outbox.limit = 1 << 20
    d.notify()
    await settle()
    rest = [m.msg_id.topic_offset for x in (a, b) for m in drain(x)]
    assert sorted(from_a + from_b + rest) == list(range(6))
    assert sorted(d.inflight) == list(range(6))
    await d.close()


async def test_shared_run_skips_offsets_acked_before_a_restart():
    topic = MemoryTopic()
    for i in range(6):
        topic.publish(b"m%d" % i)
    topic, d, (a, b), _, _ = await make(SHARED, consumers=("a", "b"), topic=topic,
                                        cursor=0, acked=[[2, 3]])
    await settle()
    got = sorted(m.msg_id.topic_offset for x in (a, b) for m in drain(x))
    assert got == [1, 4, 5]
    await d.close()


async def test_shared_waits_for_a_left_consumers_messages_before_newer_ones():
    topic, d, (a, b), _, _ = await make(SHARED, consumers=("a", "b"), window=100,
                                        base_redelivery_delay_ms=300, backoff_strategy="fixed")
    for i in range(4):
        topic.publish(b"m%d" % i)
    await settle()
    lost = [m.msg_id.topic_offset for m in drain(a)]
    drain(b)
    _stream_lost(d, a)
    d.sub.remove(a)
    topic.publish(b"m4")
    await settle()
    assert drain(b) == []                       # the backoff runs: nothing newer meanwhile
    got = []
    await async_wait_for(lambda: got.extend(drain(b)) or len(got) >= len(lost) + 1,
                         what="the left consumer's messages, then the new one")
    assert [m.msg_id.topic_offset for m in got] == lost + [4]
    await d.close()


async def test_key_shared_delivers_a_stored_message_whose_key_cannot_be_read():
    # Batches were not checked for UTF-8 before: such a message may sit in a WAL. It is
    # routed by the empty key, and the messages after it still flow.
    topic, d, (a,), _, _ = await make(KEY_SHARED, window=100)
    topic.publish(b"m0", key="k")
    topic.messages.append(pb.StreamMessage(payload=b"bad").SerializeToString() +
                          b"\x52\x02\xff\xfe")
    topic.publish(b"m2", key="k")
    d.notify()
    got = []
    await async_wait_for(lambda: got.extend(drain_raw(a)) or len(got) >= 3,
                         what="all three messages")
    assert len(got) == 3
    await d.close()


def drain_raw(consumer):
    """The delivered messages as bytes (drain() parses them, and one here does not)."""
    return list(GrpcDeframer().feed(bytes(consumer.outbox.take())))


async def test_a_failing_pass_is_logged_and_tried_again(monkeypatch, caplog):
    import danube.broker.reliable as reliable
    monkeypatch.setattr(reliable, "DISPATCH_RETRY", 0.05)
    topic = MemoryTopic()
    read, failures = topic.read, []

    def flaky(offset, n):
        if len(failures) < 3:
            failures.append(offset)
            raise RuntimeError("the log is unreadable for a moment")
        return read(offset, n)
    topic.read = flaky
    topic.publish(b"m0")
    topic, d, (c,), _, _ = await make(topic=topic)
    got = await async_wait_for(lambda: drain(c), what="the message once reads work again")
    assert [m.payload for m in got] == [b"m0"] and len(failures) == 3
    logged = [r for r in caplog.records if "dispatch failed" in r.getMessage()]
    assert len(logged) == 1                     # once per kind of failure, not per pass
    await d.close()


def _count_passes(d):
    passes = [0]
    dispatch = d._dispatch

    def counted():
        passes[0] += 1
        return dispatch()
    d._dispatch = counted
    return passes


@pytest.mark.parametrize("blocked_by", ["no consumer", "a full outbox"])
async def test_redeliveries_due_that_cannot_go_out_do_not_spin_the_loop(blocked_by):
    """Messages due for redelivery that nobody can take now (their consumer left and none
    is there, or the one there has a full outbox) wait for a consumer, an ack or the
    heartbeat. A pass that returned "due now" for them ran the loop without a pause: a
    broker whose sink connector was killed, or stopped acking during an outage, kept a
    core busy until it came back."""
    topic, d, (a, b), _, _ = await make(SHARED, consumers=("a", "b"), window=10)
    for i in range(4):
        topic.publish(b"m%d" % i)
    await settle()
    assert len(drain(a)) + len(drain(b)) == 4
    if blocked_by == "no consumer":
        d.sub.remove(b)
        d.consumer_left(b)
    else:
        b.outbox.limit = 1
        b.outbox.offer(b"x" * 64, topic.delivery_stamp)      # full: refuses the next
    d.sub.remove(a)
    d.consumer_left(a)                  # its messages are due at once
    assert d.retry and d.retry[0][0] <= asyncio.get_running_loop().time()
    passes = _count_passes(d)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.sleep(1.0)            # a window to count passes in, not a wait for an event
    elapsed = loop.time() - start
    # the heartbeat's passes (every 0.5 s) and a few wake-ups; a spinning loop makes
    # thousands
    assert passes[0] <= 4 + elapsed / 0.5, passes[0]
    if blocked_by == "a full outbox":
        drain(b)
        b.outbox.limit = 1 << 20        # room again: the heartbeat's next pass sends them
        await async_wait_for(lambda: b.outbox.count >= 2, what="the redeliveries")
    await d.close()
