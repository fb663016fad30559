"""The Cython fan-out objects behind non-reliable dispatch."""

import collections

from danube.broker._fanout import (ActiveFanout, KeySharedFanout, Outbox, RoundRobinFanout,
                                   fanout, fnv1a32, ring_hash)
from danube.codec.grpcframe import GrpcDeframer
from danube.broker.subscription import key_matcher


def test_fnv1a32_known_values():
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32("foobar") == 0xBF9CF968
    assert ring_hash("a") != fnv1a32("a")


def test_outbox_frames_messages_and_signals_once_per_batch():
    calls = []
    box = Outbox(1000, lambda: calls.append(1))
    # StreamMessages with payloads b"abc" and b"de" (field 3): the bytes counted are the
    # payloads', as upstream's consumer counts them, not the encoded messages'.
    assert box.offer(b"\x1a\x03abc") and box.offer(b"\x08\x07\x1a\x02de")
    assert calls == [1]
    assert box.count == 2 and box.delivered == 2 and box.delivered_bytes == 5
    assert GrpcDeframer().feed(bytes(box.take())) == [b"\x1a\x03abc", b"\x08\x07\x1a\x02de"]
    assert box.count == 0 and box.buffered == 0
    box.offer(b"x")
    assert calls == [1, 1]


def test_outbox_refuses_past_its_limit_but_always_takes_one_message():
    box = Outbox(20)
    assert box.offer(b"x" * 100)          # an empty outbox takes any single message
    assert not box.offer(b"y")
    box.take()
    assert box.offer(b"y" * 10) and not box.offer(b"z" * 10)
    box.enabled = False
    box.take()
    assert not box.offer(b"a")


def test_round_robin_spreads_and_skips_full_consumers():
    a, b, c = Outbox(10_000), Outbox(10_000), Outbox(10)
    f = RoundRobinFanout()
    f.set_outboxes([a, b, c])
    for _ in range(30):
        assert f.dispatch(b"m" * 8, None)
    # c holds one message and then is full: the rest alternate between a and b.
    assert c.count == 1
    assert a.count + b.count == 29 and abs(a.count - b.count) <= 1


def test_round_robin_drops_when_everyone_is_full():
    a = Outbox(5)
    f = RoundRobinFanout()
    f.set_outboxes([a])
    assert f.dispatch(b"123456", None)
    assert not f.dispatch(b"1", None)
    assert f.dropped == 1 and a.dropped == 1


def test_active_fanout_delivers_to_first_only():
    a, b = Outbox(), Outbox()
    f = ActiveFanout()
    f.set_outboxes([a, b])
    for _ in range(5):
        f.dispatch(b"m", None)
    assert (a.count, b.count) == (5, 0)
    f.set_outboxes([b])
    f.dispatch(b"m", None)
    assert b.count == 1
    f.set_outboxes([])
    assert not f.dispatch(b"m", None) and f.dropped == 1


def _keyshared(names, filters=None):
    boxes = [Outbox() for _ in names]
    f = KeySharedFanout()
    f.set_consumers(boxes, list(names), [key_matcher(p) for p in (filters or [()] * len(names))])
    return f, boxes


def test_key_shared_affinity_and_spread():
    f, boxes = _keyshared(["c1", "c2", "c3"])
    owners = {f"key-{i}": f.owner_of(f"key-{i}") for i in range(3000)}
    counts = collections.Counter(owners.values())
    assert set(counts) == {0, 1, 2} and min(counts.values()) > 600
    for key, owner in list(owners.items())[:50]:
        before = boxes[owner].count
        f.dispatch(b"m", key)
        assert boxes[owner].count == before + 1


def test_key_shared_is_consistent_when_a_consumer_joins():
    f2, _ = _keyshared(["c1", "c2"])
    f3, _ = _keyshared(["c1", "c2", "c3"])
    keys = [f"order-{i}" for i in range(3000)]
    moved = [k for k in keys if f3.owner_of(k) != 2 and f3.owner_of(k) != f2.owner_of(k)]
    # Keys only move to the new consumer; none shuffle between the old ones.
    assert moved == []
    assert sum(1 for k in keys if f3.owner_of(k) == 2) > 500


def test_key_shared_filters():
    f, (a, b) = _keyshared(["a", "b"], [("user-*",), ("order-*", "eu-?")])
    for key in ("user-1", "user-2", "order-9", "eu-1", "us-1"):
        f.dispatch(b"m", key)
    assert a.count == 2 and b.count == 2
    assert f.dropped == 1                     # "us-1" matches nobody


def test_fanout_over_subscriptions():
    a, b = Outbox(), Outbox()
    s1, s2 = ActiveFanout(), RoundRobinFanout()
    s1.set_outboxes([a])
    s2.set_outboxes([b])
    assert fanout([s1, s2], b"hello", None) == 2
    assert a.count == b.count == 1
