"""What the data paths record for the Prometheus exporter beyond plain counts: a bounded
``Summary`` of observations (upstream's histograms, which its exporter renders as summaries:
quantiles of the recent values, a count and a sum). The exporter (danube/services/metrics.py)
reads them at scrape time; recording is an append to a ring, nothing more."""

import collections

#: Recent values a summary keeps for its quantiles (the count and sum cover every value).
WINDOW = 1024
#: The quantiles upstream's exporter reports for a histogram without buckets.
QUANTILES = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


class Summary:
    __slots__ = ("count", "total", "recent")

    def __init__(self):
        self.count = 0
        self.total = 0.0
        self.recent = collections.deque(maxlen=WINDOW)

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.recent.append(value)

    def observe_many(self, count: int, total: float, sample: float) -> None:
        """``count`` values summing to ``total`` (a batch), of which ``sample`` stands for
        them in the quantiles."""
        self.count += count
        self.total += total
        self.recent.append(sample)

    def quantiles(self) -> list[tuple[float, float]]:
        values = sorted(self.recent)
        if not values:
            return [(q, 0.0) for q in QUANTILES]
        last = len(values) - 1
        return [(q, values[min(last, int(q * last + 0.5))]) for q in QUANTILES]
