"""A metadata store that lives and dies with its process.

It exists so the layers above (broker core, cluster, schema registry) can be tested against
real metadata semantics, TTLs and watches included, without a directory or a file per test.
All behaviour comes from ``danube.metadata._local``; this module only keeps rows in a dict
with a sorted key list beside it, so range scans stay ordered. Values are held as JSON text,
exactly as the embedded store holds them, so nothing that would fail to persist can pass
here.
"""

from __future__ import annotations

import bisect
import time

from danube.metadata._local import LocalStore, Row


class MemoryStore(LocalStore):
    """``LocalStore`` over a dict. Revisions start at 1 for every new instance."""

    def __init__(self, *, clock=time.time):
        super().__init__(clock=clock)
        self._data: dict[str, Row] = {}
        self._sorted: list[str] = []
        self._expiring: dict[str, float] = {}
        self._undo: list[tuple[str, Row | None]] | None = None

    def _row(self, key, now):
        row = self._data.get(key)
        if row is None or row[2] is not None and row[2] <= now:
            return None
        return row

    def _live_range(self, lo, hi, now):
        i = bisect.bisect_left(self._sorted, lo)
        j = bisect.bisect_left(self._sorted, hi, i)
        for key in self._sorted[i:j]:
            row = self._data[key]
            if row[2] is None or row[2] > now:
                yield key, row

    def _rows(self, lo, hi, now):
        return [(key, row[0]) for key, row in self._live_range(lo, hi, now)]

    def _keys(self, lo, hi, now):
        return [key for key, _ in self._live_range(lo, hi, now)]

    def _due(self, now):
        return sorted(key for key, at in self._expiring.items() if at <= now)

    def _next_expiry(self):
        return min(self._expiring.values(), default=None)

    def _begin(self):
        self._undo = []

    def _set(self, key, text, version, expires_at):
        old = self._data.get(key)
        self._undo.append((key, old))
        self._restore(key, (text, version, expires_at))

    def _unset(self, key):
        self._undo.append((key, self._data[key]))
        self._restore(key, None)

    def _commit(self, revision):
        self._undo = None

    def _rollback(self):
        undo, self._undo = self._undo, None
        for key, row in reversed(undo or ()):
            self._restore(key, row)

    def _close_storage(self):
        self._data.clear()
        self._sorted.clear()
        self._expiring.clear()

    def _restore(self, key: str, row: Row | None) -> None:
        """Make ``key`` hold ``row`` (None: absent), keeping the key list and expiry map in
        step with the data."""
        present = key in self._data
        if row is None:
            if present:
                del self._data[key]
                del self._sorted[bisect.bisect_left(self._sorted, key)]
                self._expiring.pop(key, None)
            return
        if not present:
            bisect.insort(self._sorted, key)
        self._data[key] = row
        if row[2] is None:
            self._expiring.pop(key, None)
        else:
            self._expiring[key] = row[2]
