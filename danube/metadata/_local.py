"""The semantics of an in-process store, written once over a handful of storage primitives.

The embedded (SQLite) and memory stores must behave identically, or tests run on the memory
store would prove nothing about the broker on the embedded one. So everything that defines
behaviour lives here: key rules, TTL visibility and reaping, revisions, CAS, id allocation and
the ordering of watch events. A backend only stores rows and makes a batch of writes atomic.

Every write is an *operation*: a function of one ``_Txn`` that reads and changes rows through
it and returns the call's result. How operations run is the backend's business
(``_execute``): the memory store runs each one on the event loop thread, start to finish
without awaiting, which makes it atomic with respect to the others; the embedded store hands
them to its writer thread, which runs them one after another as well (see
``danube.metadata._writer``). Either way CAS and ``allocate_id`` need nothing more than
"one operation at a time", and each operation's changes are published to watchers, on the
loop, in revision order, before its caller resumes.

Each write transaction first deletes every key whose TTL has run out, under its own revision,
so an expiry is always committed and announced before any change that follows it (a broker
that re-registers after its registration expired is seen to leave, then to return). The
reaper task does the same on a timer set to the earliest expiry, so expiries are announced
promptly even when nothing else is written.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from danube.metadata._watch import Change, Watch, WatchHub
from danube.metadata.errors import MetadataError, MetadataUnavailable
from danube.metadata.store import (DEFAULT_MAX_PENDING, DELETE, PUT, Entry, MetadataStore,
                                   decode_value, encode_value, prefix_bounds, put_many_args,
                                   validate_key, validate_prefix, validate_ttl,
                                   validate_version)

log = logging.getLogger("danube.metadata")

#: A stored row as the primitives return it: (JSON text, version, expires_at or None).
Row = tuple[str, int, "float | None"]

#: How long the reaper waits before retrying after its storage failed.
REAPER_RETRY_SECONDS = 1.0


class _Txn:
    """One operation's view of the store while it runs: reads and writes go through
    ``rows`` (an object with the row primitives ``_row``, ``_keys``, ``_due``, ``_set`` and
    ``_unset``), revisions continue from ``revision``, and the changes are kept to be
    published once they are committed."""

    __slots__ = ("rows", "now", "revision", "changes", "ttl_set")

    def __init__(self, rows, revision: int, now: float):
        self.rows = rows
        self.now = now
        self.revision = revision
        self.changes: list[Change] = []
        self.ttl_set = False            # a key with a TTL was written: wake the reaper

    def row(self, key: str) -> Row | None:
        return self.rows._row(key, self.now)

    def keys(self, lo: str, hi: str) -> list[str]:
        return self.rows._keys(lo, hi, self.now)

    def purge_expired(self) -> None:
        """Delete what has expired, under a revision of its own (before the operation)."""
        due = self.rows._due(self.now)
        if due:
            self.delete(due)

    def put(self, key: str, text: str, ttl: float | None) -> int:
        self.revision += 1
        self._set(key, text, ttl)
        return self.revision

    def put_many(self, entries: list[tuple[str, str]], ttl: float | None) -> int:
        """Several keys under one revision (they are committed together)."""
        self.revision += 1
        for key, text in entries:
            self._set(key, text, ttl)
        return self.revision

    def _set(self, key: str, text: str, ttl: float | None) -> None:
        expires_at = None if ttl is None else self.now + ttl
        self.rows._set(key, text, self.revision, expires_at)
        self.changes.append((PUT, key, text, self.revision))
        if expires_at is not None:
            self.ttl_set = True

    def delete(self, keys: list[str]) -> None:
        self.revision += 1
        for key in keys:
            self.rows._unset(key)
            self.changes.append((DELETE, key, None, self.revision))


#: An operation: runs against a transaction, returns the caller's result.
Operation = Callable[[_Txn], Any]


def _noop(txn: _Txn) -> None:
    """Writes nothing: a transaction that only purges what expired (and, being durable,
    syncs the writes before it)."""


class LocalStore(MetadataStore):
    """A ``MetadataStore`` living in this process. Subclasses provide the read primitives
    (``_row``, ``_rows``, ``_keys``, ``_next_expiry``; reads filter out rows whose
    ``expires_at <= now``), ``_close_storage``, and either the write primitives used by
    ``_execute_inline`` (``_begin``, ``_due``, ``_set``, ``_unset``, ``_commit``,
    ``_rollback``) or an ``_execute`` of their own. Use it from one event loop."""

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
    def _next_expiry(self) -> float | None:
        """The earliest ``expires_at`` of any row."""

    @abc.abstractmethod
    def _close_storage(self) -> None:
        """Release the backend. Called once."""

    # Write primitives of ``_execute_inline`` (within a transaction): ``_due(now)`` (keys
    # whose ``expires_at <= now``, sorted), ``_set(key, text, version, expires_at)``
    # (create or replace a row), ``_unset(key)``, and ``_begin()``, ``_commit(revision)``
    # (make the writes and the new store revision durable, atomically), ``_rollback()``
    # (a no-op outside a transaction).

    # -- running operations -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataUnavailable("metadata store is closed")

    def _read_now(self) -> float:
        self._check_open()
        return self._clock()

    def _read_failed(self, exc: BaseException) -> MetadataUnavailable:
        return MetadataUnavailable(f"metadata read failed: {exc}")

    async def _execute(self, op: Operation, durable: bool = True) -> Any:
        """Run a write operation and return its result once it is committed (durably unless
        ``durable`` is False, see ``MetadataStore``) and its changes published. Raises
        ``MetadataUnavailable`` if the store is closed or its storage fails, and whatever the
        operation itself raises (nothing of it is then applied). Inline writes are as durable
        as the backend is, whatever ``durable`` says."""
        return self._execute_inline(op)

    def _execute_inline(self, op: Operation) -> Any:
        """``_execute`` on the calling thread, over the write primitives."""
        self._check_open()
        txn = _Txn(self, self._revision, self._clock())
        try:
            self._begin()
            try:
                txn.purge_expired()
                result = op(txn)
                if txn.revision != self._revision:
                    self._commit(txn.revision)
                else:
                    self._rollback()
            except BaseException:
                self._rollback()
                raise
        except self._backend_errors as exc:
            raise MetadataUnavailable(f"metadata write failed: {exc}") from exc
        self._committed(txn.revision, txn.changes, txn.ttl_set)
        return result

    def _committed(self, revision: int, changes: list[Change], ttl_set: bool) -> None:
        """On the loop, once an operation's changes are durable: publish them."""
        if revision > self._revision:
            self._revision = revision
        self._hub.publish(changes)
        if ttl_set:
            self._reaper_wakeup.set()

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
        now = self._read_now()
        try:
            row = self._row(key, now)
        except self._backend_errors as exc:
            raise self._read_failed(exc) from exc
        if row is None:
            return None
        text, version, expires_at = row
        return Entry(key, decode_value(text), version, expires_at)

    async def put(self, key: str, value: Any, ttl: float | None = None) -> int:
        validate_key(key)
        ttl = validate_ttl(ttl)
        text = encode_value(value)
        return await self._execute(lambda txn: txn.put(key, text, ttl))

    async def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]],
                       ttl: float | None = None, *, durable: bool = True) -> int:
        texts, ttl = put_many_args(items, ttl)
        if not texts:
            self._check_open()
            return self._revision
        return await self._execute(lambda txn: txn.put_many(texts, ttl), durable)

    async def put_many_if(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]],
                          guard_key: str, guard_value: Any, *, durable: bool = True) -> bool:
        texts, _ = put_many_args(items, None)
        validate_key(guard_key)
        guard = encode_value(guard_value)

        def op(txn):
            row = txn.row(guard_key)
            if row is None or row[0] != guard:
                return False
            if texts:
                txn.put_many(texts, None)
            return True
        return await self._execute(op, durable)

    async def sync(self) -> None:
        # Any durable operation is a barrier: its commit syncs every earlier one.
        await self._execute(_noop)

    async def delete(self, key: str) -> bool:
        validate_key(key)

        def op(txn):
            if txn.row(key) is None:
                return False
            txn.delete([key])
            return True
        return await self._execute(op)

    async def delete_many(self, keys: Iterable[str]) -> int:
        keys = list(dict.fromkeys(validate_key(key) for key in keys))

        def op(txn):
            present = [key for key in keys if txn.row(key) is not None]
            if present:
                txn.delete(present)
            return len(present)
        return await self._execute(op)

    async def delete_prefix(self, prefix: str) -> int:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))

        def op(txn):
            keys = txn.keys(lo, hi)
            if exact is not None and txn.row(exact) is not None:
                keys.insert(0, exact)
            if keys:
                txn.delete(keys)
            return len(keys)
        return await self._execute(op)

    async def scan(self, prefix: str) -> list[tuple[str, Any]]:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        now = self._read_now()
        try:
            rows = self._rows(lo, hi, now)
            if exact is not None:
                row = self._row(exact, now)
                if row is not None:
                    rows.insert(0, (exact, row[0]))
        except self._backend_errors as exc:
            raise self._read_failed(exc) from exc
        return [(key, decode_value(text)) for key, text in rows]

    async def keys(self, prefix: str) -> list[str]:
        exact, lo, hi = prefix_bounds(validate_prefix(prefix))
        now = self._read_now()
        try:
            keys = self._keys(lo, hi, now)
            if exact is not None and self._row(exact, now) is not None:
                keys.insert(0, exact)
        except self._backend_errors as exc:
            raise self._read_failed(exc) from exc
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

        def op(txn):
            row = txn.row(key)
            if (None if row is None else row[1]) != expected_version:
                return False
            txn.put(key, text, ttl)
            return True
        return await self._execute(op)

    async def allocate_id(self, counter_key: str) -> int:
        validate_key(counter_key)

        def op(txn):
            row = txn.row(counter_key)
            current = 0 if row is None else decode_value(row[0])
            if type(current) is not int or current < 0:
                raise MetadataError(
                    f"counter {counter_key!r} holds {current!r}, not a non-negative integer")
            txn.put(counter_key, encode_value(current + 1), None)
            return current + 1
        return await self._execute(op)

    async def start(self) -> None:
        self._check_open()
        if self._reaper is not None:
            return
        # Purge what expired while the store was closed before anyone can watch, so a restart
        # does not replay those expiries as fresh delete events.
        await self._execute(_noop)
        self._reaper = asyncio.get_running_loop().create_task(
            self._reap_forever(), name=f"{type(self).__name__}-ttl-reaper")

    async def close(self) -> None:
        """Refuse new calls at once; writes already submitted still complete (and are
        published) before watches end and the storage is released."""
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
            try:
                await self._finish_writes()
            finally:
                self._hub.close(MetadataUnavailable("metadata store closed"))
                self._close_storage()

    async def _finish_writes(self) -> None:
        """Wait for every submitted write to complete (nothing to wait for when writes run
        inline)."""

    async def _reap_forever(self) -> None:
        while True:
            self._reaper_wakeup.clear()
            try:
                next_expiry = self._next_expiry()
                if next_expiry is not None and next_expiry <= self._clock():
                    await self._execute(_noop)
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
