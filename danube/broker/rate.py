"""The rate policies' token bucket: ``policies.max_publish_rate`` (per topic) and
``policies.max_subscription_dispatch_rate`` (per reliable subscription), in messages per
second, as upstream's ``RateLimiter``.

Upstream's bucket holds a whole second of tokens and refills once a second, so any 10 s
window can see 11 seconds' worth. This one refills continuously and holds one message
and 10 ms worth more: over a window of T seconds at most ``rate * T + burst`` messages
pass, so the measured rate never exceeds the configured one by more than ``burst / T``
(0.1 % over 10 s, plus one message). The 10 ms are what keeps a dispatcher that wakes a
little late for its next token from losing that time: with a burst of exactly one, 50/s
measured 47.6-48.8/s."""

#: Seconds of tokens the bucket holds (its burst).
BURST_SECONDS = 0.01


class RateLimiter:
    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: int, now: float):
        if isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0:
            raise ValueError(f"rate must be a positive integer (messages per second), "
                             f"not {rate!r}")
        self.rate = float(rate)
        self.burst = 1.0 + rate * BURST_SECONDS
        self.tokens = self.burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def available(self, now: float) -> int:
        """How many messages may go now."""
        self._refill(now)
        return int(self.tokens) if self.tokens >= 1.0 else 0

    def take(self, n: int, now: float) -> None:
        """``n`` messages went (at most what ``available`` allowed)."""
        self._refill(now)
        self.tokens -= n

    def wait(self, now: float) -> float:
        """Seconds until the next message may go."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def reserve(self, n: int, now: float) -> float:
        """Take ``n`` tokens now, in debt if need be; the seconds the caller waits before it
        goes, so that callers that reserve one after another go at the rate, in order."""
        self._refill(now)
        self.tokens -= n
        return 0.0 if self.tokens >= 0.0 else -self.tokens / self.rate
