"""danube.broker.stats: rates from the sampler's window of counters."""

from danube.broker import stats


def test_rates_are_the_slope_over_the_window():
    window = stats.RateWindow()
    assert window.rates(2) == (0.0, 0.0)                 # no sample yet
    window.sample(10.0, 100, 1000)
    assert window.rates(2) == (0.0, 0.0)                 # one sample: no slope
    window.sample(12.0, 140, 1400)
    assert window.rates(2) == (20.0, 200.0)
    for t in range(7):                                   # the window slides
        window.sample(14.0 + 2 * t, 140, 1400)
    assert window.rates(2) == (0.0, 0.0)


def test_a_counter_that_went_back_gives_no_negative_rate():
    window = stats.RateWindow()
    window.sample(0.0, 50)
    window.sample(2.0, 10)
    assert window.rates(1) == (0.0,)


def test_samples_at_one_instant_give_no_rate():
    window = stats.RateWindow()
    window.sample(5.0, 1)
    window.sample(5.0, 9)
    assert window.rates(1) == (0.0,)
