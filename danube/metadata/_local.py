"""The semantics of an in-process store, written once over a handful of storage primitives.

The embedded (SQLite) and memory stores must behave identically, or tests run on the memory
store would prove nothing about the broker on the embedded one. So everything that defines
behaviour lives here: key rules, TTL visibility and reaping, revisions, CAS, id allocation and
the ordering of watch events. A backend only stores rows and makes a batch of writes atomic.

Every operation runs start to finish on the event loop thread without awaiting, which makes
each one atomic with respect to the others (CAS and ``allocate_id`` need nothing more) and
guarantees that no transaction is ever held open across an await. That is acceptable because
each storage call is short: an indexed lookup or range read, or one small write transaction.

Each write transaction first deletes every key whose TTL has run out, under its own revision,
so an expiry is always committed and announced before any change that follows it (a broker
that re-registers after its registration expired is seen to leave, then to return). The
reaper task does the same on a timer set to the earliest expiry, so expiries are announced
promptly even when nothing else is written.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from danube.metadata._watch import Change, Watch, WatchHub
from danube.metadata.errors import MetadataError, MetadataUnavailable
from danube.metadata.store import (DEFAULT_MAX_PENDING, DELETE, PUT, Entry, MetadataStore,
                                   decode_value, encode_value, prefix_bounds, validate_key,
                                   validate_prefix, validate_ttl, validate_version)

log = logging.getLogger("danube.metadata")

#: A stored row as the primitives return it: (JSON text, version, expires_at or None).
Row = tuple[str, int, "float | None"]

#: How long the reaper waits before retrying after its storage failed.
REAPER_RETRY_SECONDS = 1.0


class _Txn:
    """The changes of one write transaction, published to watchers once it commits."""

    __slots__ = ("store", "now", "revision", "changes")

    def __init__(self, store: LocalStore, now: float):
        self.store = store
        self.now = now
        self.revision = store._revision
        self.changes: list[Change] = []

    def put(self, key: str, text: str, ttl: float | None) -> int:
        self.revision += 1
        expires_at = None if ttl is None else self.now + ttl
        self.store._set(key, text, self.revision, expires_at)
        self.changes.append((PUT, key, text, self.revision))
        if expires_at is not None:
            self.store._reaper_wakeup.set()
        return self.revision

    def delete(self, keys: list[str]) -> None:
        self.revision += 1
        for key in keys:
            self.store._unset(key)
            self.changes.append((DELETE, key, None, self.revision))


class LocalStore(MetadataStore):
    """A ``MetadataStore`` living in this process. Subclasses provide the storage primitives
    (the ``_``-prefixed abstract methods); reads filter out rows whose ``expires_at <= now``.
    Not thread-safe: use it from the event loop thread only."""

    #: Exceptions of the backend that mean "storage failed"; they surface as
    #: ``MetadataUnavailable``.
    _backend_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, *, clock=time.time):
        self._clock = clock
        self._hub = WatchHub()
        self._revision = 0
        self._reaper: asyncio.Task | None = None
        self._reaper_wakeup = asyncio.Event()
        self._closed = False

    @classmethod
    async def open(cls, *args, **kwargs):
        """Construct and start the store."""
        store = cls(*args, **kwargs)
        try:
            await store.start()
        except BaseException:
            await store.close()
            raise
        return store

    # -- storage primitives -----------------------------------------------------------------

    @abc.abstractmethod
    def _row(self, key: str, now: float) -> Row | None:
        """The live row of ``key``."""

    @abc.abstractmethod
    def _rows(self, lo: str, hi: str, now: float) -> list[tuple[str, str]]:
        """Live ``(key, JSON text)`` with ``lo <= key < hi``, sorted by key."""

    @abc.abstractmethod
    def _keys(self, lo: str, hi: str, now: float) -> list[str]:
        """Live keys with ``lo <= key < hi``, sorted."""

    @abc.abstractmethod
    def _due(self, now: float) -> list[str]:
        """Keys whose ``expires_at <= now``, sorted."""

    @abc.abstractmethod
    def _next_expiry(self) -> float | None:
        """The earliest ``expires_at`` of any row."""

    @abc.abstractmethod
    def _begin(self) -> None:
        """Start a write transaction."""

    @abc.abstractmethod
    def _set(self, key: str, text: str, version: int, expires_at: float | None) -> None:
        """Within a transaction: create or replace a row."""

    @abc.abstractmethod
    def _unset(self, key: str) -> None:
        """Within a transaction: remove a row."""

    @abc.abstractmethod
    def _commit(self, revision: int) -> None:
        """Make the transaction's writes and the new store revision durable, atomically."""

    @abc.abstractmethod
    def _rollback(self) -> None:
        """Undo the transaction's writes (a no-op outside a transaction)."""

    @abc.abstractmethod
    def _close_storage(self) -> None:
        """Release the backend. Called once."""

    # -- transactions -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataUnavailable("metadata store is closed")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[float]:
        self._check_open()
        try:
            yield self._clock()
        except self._backend_errors as exc:
            raise MetadataUnavailable(f"metadata read failed: {exc}") from exc

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_Txn]:
        self._check_open()
        txn = _Txn(self, self._clock())
        try:
            self._begin()
            try:
                due = self._due(txn.now)
                if due:
                    txn.delete(due)
                yield txn
                if txn.revision != self._revision:
                    self._commit(txn.revision)
                else:
                    self._rollback()
            except BaseException:
                self._rollback()
                raise
        except self._backend_errors as exc:
            raise MetadataUnavailable(f"metadata write failed: {exc}") from exc
        self._revision = txn.revision
        self._hub.publish(txn.changes)

    # -- the MetadataStore API --------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The revision of the last committed change (0 for a new store)."""
        return self._revision

    @property
    def watch_count(self) -> int:
        """How many watches are open."""
        return len(self._hub)

    async def get_entry(self, key: str) -> Entry | None:
        validate_key(key)
        with self._reading() as now:
            row = self._row(key, now)
        if row is None:
            return None
        text, version, expires_at = row
        return Entry(key, decode_value(text), version, expires_at)

    async def put(self, key: str, value: Any, ttl: float | None = None) -> int:
        validate_key(key)
        ttl = validate_ttl(ttl)
        text = encode_value(value)
        with self._writing() as txn:
            return txn.put(key, text, ttl)

    async def delete(self, key: str) -> bool:
        validate_key(key)
        with self._writing() as txn:
            if self._row(key, txn.now) is None:
                return False
            txn.delete([key])
            return True

    async def delete_prefix(self, prefix: str) -> int:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        with self._writing() as txn:
            keys = self._keys(lo, hi, txn.now)
            if exact is not None and self._row(exact, txn.now) is not None:
                keys.insert(0, exact)
            if keys:
                txn.delete(keys)
            return len(keys)

    async def scan(self, prefix: str) -> list[tuple[str, Any]]:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        with self._reading() as now:
            rows = self._rows(lo, hi, now)
            if exact is not None:
                row = self._row(exact, now)
                if row is not None:
                    rows.insert(0, (exact, row[0]))
        return [(key, decode_value(text)) for key, text in rows]

    async def keys(self, prefix: str) -> list[str]:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        with self._reading() as now:
            keys = self._keys(lo, hi, now)
            if exact is not None and self._row(exact, now) is not None:
                keys.insert(0, exact)
        return keys

    async def watch(self, prefix: str, *, max_pending: int = DEFAULT_MAX_PENDING) -> Watch:
        validate_prefix(prefix)
        self._check_open()
        return self._hub.open(prefix, max_pending)

    async def compare_and_swap(self, key: str, expected_version: int | None, new_value: Any,
                               ttl: float | None = None) -> bool:
        validate_key(key)
        validate_version(expected_version)
        ttl = validate_ttl(ttl)
        text = encode_value(new_value)
        with self._writing() as txn:
            row = self._row(key, txn.now)
            if (None if row is None else row[1]) != expected_version:
                return False
            txn.put(key, text, ttl)
            return True

    async def allocate_id(self, counter_key: str) -> int:
        validate_key(counter_key)
        with self._writing() as txn:
            row = self._row(counter_key, txn.now)
            current = 0 if row is None else decode_value(row[0])
            if type(current) is not int or current < 0:
                raise MetadataError(
                    f"counter {counter_key!r} holds {current!r}, not a non-negative integer")
            txn.put(counter_key, encode_value(current + 1), None)
            return current + 1

    async def start(self) -> None:
        self._check_open()
        if self._reaper is not None:
            return
        # Purge what expired while the store was closed before anyone can watch, so a restart
        # does not replay those expiries as fresh delete events.
        with self._writing():
            pass
        self._reaper = asyncio.get_running_loop().create_task(
            self._reap_forever(), name=f"{type(self).__name__}-ttl-reaper")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._reaper is not None:
                self._reaper.cancel()
                try:
                    await self._reaper
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
        finally:
            self._hub.close(MetadataUnavailable("metadata store closed"))
            self._close_storage()

    async def _reap_forever(self) -> None:
        while True:
            self._reaper_wakeup.clear()
            try:
                next_expiry = self._next_expiry()
                if next_expiry is not None and next_expiry <= self._clock():
                    with self._writing():
                        pass
                    continue
            except Exception:
                log.exception("metadata TTL reaper failed; retrying in %.1fs",
                              REAPER_RETRY_SECONDS)
                next_expiry = self._clock() + REAPER_RETRY_SECONDS
            timeout = None if next_expiry is None else max(0.0, next_expiry - self._clock())
            try:
                async with asyncio.timeout(timeout):
                    await self._reaper_wakeup.wait()
            except TimeoutError:
                pass
