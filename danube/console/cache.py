"""A short-lived cache of the broker's list answers: a page refreshed every 2 s by many
browser tabs, or a namespace of 10,000 topics, costs the broker one call per TTL."""

import asyncio
import time


class TtlCache:
    def __init__(self, ttl):
        self.ttl = ttl
        self._entries = {}          # key -> (expires at, value)
        self._pending = {}          # key -> future of the call in flight

    async def get(self, key, load):
        """The value of ``key``, from ``await load()`` when absent or older than the TTL.
        Concurrent misses of one key share one call."""
        if self.ttl <= 0:
            return await load()
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            value = await load()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()      # retrieved: a miss nobody shared must not warn
            raise
        else:
            self._entries[key] = (time.monotonic() + self.ttl, value)
            future.set_result(value)
            return value
        finally:
            del self._pending[key]

    def clear(self):
        """After a write (a topic created, a subscription removed) the lists are stale."""
        self._entries.clear()
