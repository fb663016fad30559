"""The C runs of deliveries (danube/broker/_window.pyx) against the per-message rules they
replace: round robin over Shared consumers, stopping at the first refusal (that consumer's
turn spent); KeyShared by each key's owner, handing back to the per-message path a message
whose key is unowned, blocked, held back or a left consumer's; each message taken recorded
in flight with its consumer, deadline, payload and key."""

import random
from types import SimpleNamespace

from danube.broker._fanout import Outbox
from danube.broker._window import (KEYED_DONE, KEYED_REFUSED, KEYED_SLOW, deliver_keyed,
                                   deliver_round_robin, deliver_run)
from danube.proto import DanubeApi_pb2 as pb


def consumers(limits):
    return [SimpleNamespace(name=i, outbox=Outbox(limit)) for i, limit in enumerate(limits)]


def model(batch, limits, rr):
    """The per-message path: consumers[rr % n] in turn, the turn spent even when refused;
    an outbox refuses a message that would take it past its limit (Outbox.offer)."""
    used = [0] * len(limits)
    taken = []
    for offset, payload in batch:
        i = rr % len(limits)
        rr += 1
        size = len(payload) + 5
        if used[i] and used[i] + size > limits[i]:   # an empty outbox takes any message
            return taken, rr
        used[i] += size
        taken.append((offset, i))
    return taken, rr


def test_round_robin_equals_the_per_message_rule():
    rng = random.Random(7)
    for _ in range(300):
        limits = [rng.choice((0, 30, 60, 200, 10_000)) for _ in range(rng.randint(1, 4))]
        first = rng.randint(0, 50)
        batch = [(first + i, bytes(rng.randint(1, 20)))
                 for i in range(rng.randint(0, 30))]
        rr = rng.randint(0, 9)
        group = consumers(limits)
        inflight = {}
        n, next_rr = deliver_round_robin(inflight, batch, group, rr, 5.0, None)
        expected, expected_rr = model(batch, limits, rr)
        assert (n, next_rr) == (len(expected), expected_rr)
        assert [(o, d.consumer.name) for o, d in inflight.items()] == expected
        for offset, payload in batch[:n]:
            d = inflight[offset]
            assert (d.offset, d.deadline, d.payload, d.key) == (offset, 5.0, payload, None)
        assert sum(c.outbox.count for c in group) == n


def test_one_consumer_run_stops_at_the_first_refusal():
    [c] = consumers([3 * 15])                   # three 10 B messages framed (15 B each)
    inflight = {}
    batch = [(o, bytes(10)) for o in range(5)]
    assert deliver_run(inflight, batch, c, 1.0, None) == 3
    assert list(inflight) == [0, 1, 2] and c.outbox.count == 3


class Ring:
    def __init__(self, owners):
        self.owners = owners

    def owner_of(self, key):
        return self.owners.get(key, -1)


def keyed_model(batch, start, keys, limits, owners, acked, blocked, held, orphans):
    used = [0] * len(limits)
    taken = []
    for i in range(start, len(batch)):
        offset, payload = batch[i]
        if offset in acked:
            continue
        key = keys[i]
        owner = owners.get(key, -1)
        if not 0 <= owner < len(limits) or key in orphans or key in blocked or key in held:
            return i, KEYED_SLOW, taken
        if used[owner] and used[owner] + len(payload) + 5 > limits[owner]:
            return i, KEYED_REFUSED, taken
        used[owner] += len(payload) + 5
        taken.append((offset, owner, key))
    return len(batch), KEYED_DONE, taken


def test_keyed_runs_equal_the_per_message_rule():
    rng = random.Random(5)
    names = ["a", "b", "c", "d", "e"]
    for _ in range(400):
        limits = [rng.choice((0, 60, 200, 10_000)) for _ in range(rng.randint(1, 3))]
        # Mostly a consumer's index; sometimes none (-1) or one past the consumers.
        owners = {k: rng.choice([-1, len(limits)] + list(range(len(limits))) * 4)
                  for k in names}
        keys = [rng.choice(names) for _ in range(rng.randint(0, 25))]
        batch = [(100 + i, pb.StreamMessage(producer_name="p", routing_key=k,
                                            payload=rng.randbytes(rng.randint(0, 9)))
                  .SerializeToString()) for i, k in enumerate(keys)]
        acked = {o for o, _ in batch if rng.random() < 0.15}
        blocked = {k: 1 for k in names if rng.random() < 0.05}
        held = {k: [2] for k in names if rng.random() < 0.05}
        orphans = {k for k in names if rng.random() < 0.05}
        start = rng.randint(0, len(batch))
        group = consumers(limits)
        inflight = {}
        got = deliver_keyed(inflight, batch, start, group, Ring(owners), 3.0, None, acked,
                            blocked, held, orphans)
        i, outcome, taken = keyed_model(batch, start, keys, limits, owners, acked, blocked,
                                        held, orphans)
        assert got == (i, outcome)
        assert [(o, d.consumer.name, d.key) for o, d in inflight.items()] == taken
        assert all(d.deadline == 3.0 and d.payload == dict(batch)[o]
                   for o, d in inflight.items())
