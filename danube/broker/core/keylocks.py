"""Locks by key: what one lock for the whole topic table serialised (creating, loading,
unloading, deleting) only needs serialising per topic family (a topic and the partitions
of its base name). One lock for every topic made creation as slow as one metadata commit
and one log opening at a time, whereas topics created side by side share group commits."""

import asyncio
import contextlib


class KeyedLocks:
    def __init__(self):
        self._held = {}             # key -> [Lock, holders and waiters]

    @contextlib.asynccontextmanager
    async def hold(self, key):
        entry = self._held.get(key)
        if entry is None:
            entry = self._held[key] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                # No one holds or waits: the entry goes, so the table is as small as the
                # number of topics being changed right now.
                del self._held[key]

    def __len__(self):
        return len(self._held)
