"""The embedded store's writer thread: every SQLite write, and the fsync of its commit, off the
event loop, with group commit.

Why a thread: with ``synchronous=FULL`` a commit returns only after an fsync, which takes
from a fraction of a millisecond to several on a busy disk. Run on the event loop thread, that
stalls every connection of the broker for as long (a cursor save, a segment descriptor after
an upload). ``sqlite3`` releases the GIL while SQLite works, so in a thread of its own the
commit costs the loop only the hand-over.

Group commit: callers submit *operations* (see ``danube.metadata._local``) and await a
future. The thread takes every operation queued since it last looked (up to
``MAX_BATCH``), runs them one after another inside one ``BEGIN IMMEDIATE`` transaction, and
commits once: many writes, one fsync. Each operation runs inside a ``SAVEPOINT`` of its own,
so one that fails (an ``allocate_id`` on a counter that is not an integer, a SQLite error
confined to it) is rolled back alone and gets its own exception, while the others commit. An
operation sees the effects of those before it in the batch, exactly as if they had run in
separate transactions, and revisions are assigned in the same order, so results (CAS
verdicts, allocated ids, versions) are what serial execution would have given. If the commit
itself fails, every operation of the batch that had succeeded fails with
``MetadataUnavailable`` and nothing of the batch is kept.

Results go back to the loop with ``call_soon_threadsafe``, in batch order and in one callback
per batch: each operation's changes are published to watchers (in revision order) and then
its future is resolved, so a caller resumes only after its watchers were told.

Operations are not cancelled: one submitted is applied even if its caller stops waiting.
``stop()`` lets the thread finish what is queued, close its connection and exit.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import sqlite3
import threading
from typing import Any, Callable

from danube.metadata._local import Operation, _Txn
from danube.metadata.errors import MetadataUnavailable

#: The most operations committed in one transaction.
MAX_BATCH = 1024


class _Item:
    __slots__ = ("op", "loop", "future", "error", "result", "revision", "changes", "ttl_set")

    def __init__(self, op: Operation, loop: asyncio.AbstractEventLoop, future: asyncio.Future):
        self.op = op
        self.loop = loop
        self.future = future
        self.error: BaseException | None = None
        self.result: Any = None
        self.revision = 0
        self.changes: list = []
        self.ttl_set = False


def _unavailable(exc: BaseException) -> MetadataUnavailable:
    err = MetadataUnavailable(f"metadata write failed: {exc}")
    err.__cause__ = exc
    return err


class Writer:
    """Runs operations against ``conn`` (a SQLite connection this thread alone uses from now
    on) through ``rows`` (the row primitives over ``conn``), continuing revisions from
    ``revision``. ``committed(revision, changes, ttl_set)`` is called on the loop for each
    operation that committed, before its future is resolved."""

    def __init__(self, conn: sqlite3.Connection, rows, revision: int, clock,
                 committed: Callable[[int, list, bool], None], *, name: str):
        self._conn = conn
        self._rows = rows
        self._revision = revision
        self._clock = clock
        self._committed = committed
        self._name = name
        self._queue: collections.deque[_Item] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._paused = False                    # pause() (tests)
        #: Finished when the thread has exited (or, if it never started, at stop()).
        self.done: concurrent.futures.Future = concurrent.futures.Future()
        #: Operations run, transactions committed (each one fsync), batches taken.
        self.operations = 0
        self.commits = 0
        self.batches = 0

    @property
    def started(self) -> bool:
        return self._thread is not None

    def submit(self, op: Operation) -> asyncio.Future:
        """Queue ``op``; the returned future (of the running loop) gets its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            if self._stopping:
                raise MetadataUnavailable("metadata store is closed")
            self._queue.append(_Item(op, loop, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def stop(self) -> None:
        """Finish what is queued, then close the connection and exit. Idempotent."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            if self._thread is None:
                self._close_conn()
                self.done.set_result(None)
                return
            self._cond.notify()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    # For tests: hold the thread before its next batch, so that what is submitted meanwhile
    # is committed together.
    def pause(self) -> None:
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._paused or not (self._queue or self._stopping):
                        self._cond.wait()
                    if not self._queue:
                        return
                    batch = []
                    while self._queue and len(batch) < MAX_BATCH:
                        batch.append(self._queue.popleft())
                self._process(batch)
                self._deliver(batch)
        finally:
            self._close_conn()
            self.done.set_result(None)

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def _process(self, batch: list[_Item]) -> None:
        conn = self._conn
        base = revision = self._revision
        self.batches += 1
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            for item in batch:
                item.error = _unavailable(exc)
            return
        # The SQLite error that lost the whole transaction, if one did: every operation of
        # the batch without an error of its own then fails with it.
        aborted: sqlite3.Error | None = None
        for item in batch:
            if aborted is not None:
                break
            self.operations += 1
            txn = _Txn(self._rows, revision, self._clock())
            try:
                conn.execute("SAVEPOINT op")
            except sqlite3.Error as exc:
                aborted = exc
                break
            try:
                txn.purge_expired()
                item.result = item.op(txn)
            except Exception as exc:  # noqa: BLE001 - the operation's own outcome
                item.error = _unavailable(exc) if isinstance(exc, sqlite3.Error) else exc
                try:
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                except sqlite3.Error as exc2:
                    aborted = exc2
                if aborted is None and not conn.in_transaction:
                    # SQLite rolled the whole transaction back (some I/O errors do).
                    aborted = exc if isinstance(exc, sqlite3.Error) else \
                        sqlite3.OperationalError("transaction rolled back")
                continue
            try:
                conn.execute("RELEASE op")
            except sqlite3.Error as exc:
                aborted = exc
                break
            item.revision, item.changes, item.ttl_set = txn.revision, txn.changes, txn.ttl_set
            revision = txn.revision
        if aborted is None and revision != base:
            try:
                conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'", (revision,))
                conn.execute("COMMIT")
                self.commits += 1
            except sqlite3.Error as exc:
                aborted = exc
        if aborted is not None:
            for item in batch:
                if item.error is None:
                    item.error = _unavailable(aborted)
            revision = base
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        self._revision = revision

    def _deliver(self, batch: list[_Item]) -> None:
        i = 0
        while i < len(batch):
            loop = batch[i].loop
            j = i + 1
            while j < len(batch) and batch[j].loop is loop:
                j += 1
            try:
                loop.call_soon_threadsafe(self._complete, batch[i:j])
            except RuntimeError:
                pass            # that loop is closed: nobody is waiting any more
            i = j

    def _complete(self, items: list[_Item]) -> None:
        """On the loop: publish, then wake the callers, in commit order."""
        for item in items:
            if item.error is None:
                self._committed(item.revision, item.changes, item.ttl_set)
                if not item.future.done():
                    item.future.set_result(item.result)
            elif not item.future.done():
                item.future.set_exception(item.error)
