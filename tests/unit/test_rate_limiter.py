"""danube.broker.rate.RateLimiter on a simulated clock: the upper bound over any window,
pacing by reserve, and bad rates refused."""

import pytest

from danube.broker.rate import RateLimiter


@pytest.mark.parametrize("rate", [1, 2, 50, 1000, 20000])
def test_never_more_than_the_rate_plus_the_burst(rate):
    limiter = RateLimiter(rate, 0.0)
    now, sent, step = 0.0, 0, 0.0007          # a dispatcher polling every 0.7 ms
    while now <= 10.0:
        n = limiter.available(now)
        limiter.take(n, now)
        sent += n
        now += step
    assert sent <= rate * 10 + limiter.burst
    assert sent >= rate * 10 * 0.99


def test_wait_says_when_the_next_one_may_go():
    limiter = RateLimiter(4, 0.0)
    limiter.take(limiter.available(0.0), 0.0)
    wait = limiter.wait(0.0)
    assert 0 < wait <= 0.25
    assert limiter.available(wait - 0.01) == 0
    assert limiter.available(wait + 1e-9) == 1


def test_reserve_paces_callers_in_order():
    limiter = RateLimiter(10, 0.0)
    delays = [limiter.reserve(1, 0.0) for _ in range(11)]
    assert delays[0] == 0.0
    assert delays == sorted(delays)
    assert delays[-1] == pytest.approx(1.0, abs=0.11)       # ten more at 10/s: one second


@pytest.mark.parametrize("rate", [0, -1, 1.5, True, "5"])
def test_bad_rates_are_refused(rate):
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(rate, 0.0)
