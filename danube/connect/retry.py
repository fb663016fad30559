"""Exponential backoff with full jitter, as upstream's RetryStrategy (base
``retry.retry_backoff_ms``, doubling, capped at ``retry.max_backoff_ms``): many connectors
retrying one outage spread out instead of hitting the system back at once."""

import random


class Backoff:
    def __init__(self, base_ms, max_ms, max_retries, *, rng=random.random):
        self.base_ms = base_ms
        self.max_ms = max_ms
        self.max_retries = max_retries
        self._rng = rng

    def delay(self, attempt):
        """Seconds before retry number ``attempt`` (0-based): uniform in [cap/2, cap] with
        cap = min(base * 2**attempt, max); half the cap is kept so a retry is never
        immediate."""
        cap = min(self.base_ms * (2 ** min(attempt, 32)), self.max_ms)
        return (cap / 2 + self._rng() * cap / 2) / 1000.0

    @classmethod
    def from_settings(cls, retry):
        return cls(retry.retry_backoff_ms, retry.max_backoff_ms, retry.max_retries)
