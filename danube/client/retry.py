"""The retry policy of the official clients (reference b.3): which codes are worth another
try, and how long to wait before it."""

import asyncio
import dataclasses
import random

from danube.rpc import RpcError, StatusCode

RETRYABLE = frozenset({StatusCode.UNAVAILABLE, StatusCode.DEADLINE_EXCEEDED,
                       StatusCode.RESOURCE_EXHAUSTED})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    base_backoff_ms: int = 200
    max_backoff_ms: int = 5000

    @staticmethod
    def retryable(exc):
        # RESOURCE_EXHAUSTED raised on this side is a message over a size limit: every
        # retry would meet the same limit.
        return (isinstance(exc, RpcError) and exc.code in RETRYABLE
                and not (exc.local and exc.code == StatusCode.RESOURCE_EXHAUSTED))

    def backoff(self, attempt):
        """Seconds to wait before retry number `attempt` (0-based): linear, capped, with
        50-100% jitter so many clients retrying together spread out."""
        linear = min(self.base_backoff_ms * (attempt + 1), self.max_backoff_ms)
        return random.uniform(linear / 2, linear) / 1000.0

    async def run(self, call, before_retry=None):
        """`await call()`, retrying retryable RpcErrors; `before_retry()` (a re-lookup) runs
        before each new attempt. The last error is raised unchanged."""
        attempt = 0
        while True:
            try:
                return await call()
            except RpcError as exc:
                if not self.retryable(exc) or attempt >= self.max_retries:
                    raise
            if before_retry is not None:
                await before_retry()
            await asyncio.sleep(self.backoff(attempt))
            attempt += 1
