"""danube.metering.Summary: bounded to WINDOW recent values whatever it is fed, with an exact
count and sum, and quantiles over the recent values."""

from danube.metering import QUANTILES, WINDOW, Summary


def test_the_ring_is_bounded_and_count_and_sum_are_exact():
    s = Summary()
    assert s.recent() == [] and s.quantiles() == [(q, 0.0) for q in QUANTILES]
    for i in range(10 * WINDOW + 3):
        s.observe(float(i))
    assert s.count == 10 * WINDOW + 3
    assert s.total == sum(range(10 * WINDOW + 3))
    recent = s.recent()
    assert len(recent) == WINDOW                                   # the bound
    assert sorted(recent) == [float(i) for i in range(9 * WINDOW + 3, 10 * WINDOW + 3)]
    assert len(s._ring) == WINDOW


def test_quantiles_over_the_recent_values():
    s = Summary()
    for v in range(1, 101):
        s.observe(float(v))
    q = dict(s.quantiles())
    assert q[0.0] == 1.0 and q[1.0] == 100.0
    assert 49.0 <= q[0.5] <= 52.0 and 98.0 <= q[0.99] <= 100.0


def test_a_batch_counts_all_its_values():
    s = Summary()
    s.observe_many(10, 1000.0, 100.0)
    assert (s.count, s.total, s.recent()) == (10, 1000.0, [100.0])
    s.observe(5.0)
    assert (s.count, s.total, sorted(s.recent())) == (11, 1005.0, [5.0, 100.0])
