"""What the data paths record for the Prometheus exporter beyond plain counts: a bounded
``Summary`` of observations (upstream's histograms, which its exporter renders as summaries:
quantiles of the recent values, a count and a sum). The exporter (danube/services/metrics.py)
reads them at scrape time; recording is a store into a ring, nothing more."""

from array import array

#: Recent values a summary keeps for its quantiles (the count and sum cover every value):
#: 2 KiB of doubles per summary, allocated at its first value. A broker keeps three per
#: reliable topic (send latency, message size, WAL flush latency).
WINDOW = 256
#: The quantiles upstream's exporter reports for a histogram without buckets.
QUANTILES = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


class Summary:
    __slots__ = ("count", "total", "_ring", "_kept")

    def __init__(self):
        self.count = 0
        self.total = 0.0
        self._ring = None
        self._kept = 0          # values stored in the ring so far (a batch stores one)

    def observe(self, value: float) -> None:
        ring = self._ring
        if ring is None:
            ring = self._ring = array("d", bytes(8 * WINDOW))
        ring[self._kept % WINDOW] = value
        self._kept += 1
        self.count += 1
        self.total += value

    def observe_many(self, count: int, total: float, sample: float) -> None:
        """``count`` values summing to ``total`` (a batch), of which ``sample`` stands for
        them in the quantiles."""
        self.observe(sample)
        self.count += count - 1
        self.total += total - sample

    def recent(self) -> list[float]:
        """The values the quantiles are taken over (at most WINDOW, the latest)."""
        if self._ring is None:
            return []
        return list(self._ring[:min(self._kept, WINDOW)])

    def quantiles(self) -> list[tuple[float, float]]:
        values = sorted(self.recent())
        if not values:
            return [(q, 0.0) for q in QUANTILES]
        last = len(values) - 1
        return [(q, values[min(last, int(q * last + 0.5))]) for q in QUANTILES]
