"""A short-lived cache of the broker's list answers: a page refreshed every 2 s by many
browser tabs, or a namespace of 10,000 topics, costs the broker one call per TTL."""

import asyncio
import time


class TtlCache:
    # Keys are pages (a topic's, a broker's): a client asking for many names cannot grow
    # the cache past this; the oldest entry goes first.
    MAX_ENTRIES = 4096

    def __init__(self, ttl, max_entries=MAX_ENTRIES):
        self.ttl = ttl
        self.max_entries = max_entries
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
            self._entries.pop(key, None)
            if len(self._entries) >= self.max_entries:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = (time.monotonic() + self.ttl, value)
            future.set_result(value)
            return value
        finally:
            del self._pending[key]

    def drop(self, key):
        """After a write that made one answer stale."""
        self._entries.pop(key, None)

    def clear(self):
        """After a write (a topic created, a subscription removed) the lists are stale."""
        self._entries.clear()
