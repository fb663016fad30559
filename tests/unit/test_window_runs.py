"""The C runs of deliveries (danube/broker/_window.pyx) against the per-message rule they
replace: round robin over Shared consumers, stopping at the first refusal (that consumer's
turn spent), each message taken recorded in flight with its consumer, deadline and payload."""

import random
from types import SimpleNamespace

from danube.broker._fanout import Outbox
from danube.broker._window import deliver_round_robin, deliver_run


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
