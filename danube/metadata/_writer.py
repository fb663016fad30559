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

Durability per batch: an operation submitted with ``durable=False`` (see ``MetadataStore``) may
skip the fsync. A batch holding only such operations commits under ``synchronous=NORMAL``:
SQLite writes the commit into its WAL file without syncing it, so the commit survives the
process being killed (the page cache has it) but not a power cut. A batch holding any durable
operation commits under ``synchronous=FULL``, whose fsync of the WAL file also covers every
unsynced commit before it; when such a batch changes nothing while unsynced commits are
outstanding (``sync()``), it writes a ``barrier`` counter so there is a commit to fsync.
NORMAL is WAL mode's own crash-safe setting: its checkpoints still sync, so the database is
never corrupted, only the newest unsynced commits can be lost. The point is the publish path:
an fsync of this database competes with the message WAL's ``fdatasync`` calls on the same
disk, and segment descriptors, written twice a second with short upload intervals, do not
need one (see ``danube.storage.tiered.manager``).

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
    __slots__ = ("op", "durable", "loop", "future", "error", "result", "revision", "changes",
                 "ttl_set")

    def __init__(self, op: Operation, durable: bool, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future):
        self.op = op
        self.durable = durable
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
        #: Operations run, transactions committed, batches taken, and the commits that were
        #: synced (``synchronous=FULL``: one fsync each).
        self.operations = 0
        self.commits = 0
        self.batches = 0
        self.synced_commits = 0
        self._level = "FULL"            # the connection's `synchronous` setting
        # A commit since the last synced one was not synced. True at first: a process that
        # was killed may have left unsynced commits in the WAL file, in the page cache.
        self._unsynced = True

    @property
    def started(self) -> bool:
        return self._thread is not None

    def submit(self, op: Operation, durable: bool = True) -> asyncio.Future:
        """Queue ``op``; the returned future (of the running loop) gets its result, once the
        commit is synced unless ``durable`` is False."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._cond:
            if self._stopping:
                raise MetadataUnavailable("metadata store is closed")
            self._queue.append(_Item(op, durable, loop, future))
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
                if self._unsynced:
                    # Closing checkpoints (and syncs) anyway; this says it outright, so a
                    # clean stop leaves nothing that a power cut could take.
                    self._set_level(conn, "FULL")
                    conn.execute("BEGIN IMMEDIATE")
                    self._write_barrier(conn)
                    conn.execute("COMMIT")
                    self._unsynced = False
            except sqlite3.Error:
                pass
            try:
                conn.close()
            except sqlite3.Error:
                pass

    def _set_level(self, conn: sqlite3.Connection, level: str) -> None:
        if level != self._level:
            conn.execute(f"PRAGMA synchronous={level}")
            self._level = level

    @staticmethod
    def _write_barrier(conn: sqlite3.Connection) -> None:
        # A row that really changes: an UPDATE writing the same value leaves the page clean,
        # and a commit without pages is not synced.
        conn.execute("INSERT INTO meta (name, value) VALUES ('barriers', 1) "
                     "ON CONFLICT (name) DO UPDATE SET value = value + 1")

    def _process(self, batch: list[_Item]) -> None:
        conn = self._conn
        base = revision = self._revision
        durable = any(item.durable for item in batch)
        self.batches += 1
        try:
            # Set outside the transaction: SQLite reads it when the transaction starts.
            self._set_level(conn, "FULL" if durable else "NORMAL")
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
        if aborted is None and (revision != base or (durable and self._unsynced)):
            try:
                if revision != base:
                    conn.execute("UPDATE meta SET value = ? WHERE name = 'revision'",
                                 (revision,))
                else:
                    self._write_barrier(conn)
                conn.execute("COMMIT")
                self.commits += 1
                if durable:
                    self.synced_commits += 1
                self._unsynced = not durable
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
