"""The default metadata store: one SQLite file, so a single broker needs nothing else running.

Why SQLite: it ships with Python, it gives atomic multi-row transactions (``delete_prefix``,
expiry plus write, revision bump), and its primary-key B-tree serves ordered range scans
directly. Keys are stored as TEXT under the BINARY collation, which orders them by UTF-8
bytes, the same order as Python's string comparison, so ``key >= lo AND key < hi`` on the
primary key is both index-backed and exactly the '/'-boundary range.

Why ``journal_mode=WAL`` with ``synchronous=FULL``: a write returns only after its commit
record is fsynced into the WAL, so an acknowledged write survives a crash or power loss.
That costs a sync per commit, which is right for metadata: it is the control plane (topic
creation, cursors, registrations), never the per-message data path. Writes that can be redone
after a power cut (``put_many(durable=False)``: segment descriptors) skip it; the writer
thread commits them under ``synchronous=NORMAL`` (see ``danube.metadata._writer``).

Two connections. Writes go to one writer thread (``danube.metadata._writer``) with a
connection of its own: the commit and its fsync never run on the event loop, and writes
submitted while a commit runs share the next one (group commit: a thousand subscriptions
saving their cursors cost a few fsyncs, not a thousand). Reads run on the event loop thread
over a second, read-only connection: an indexed lookup or range scan of pages that are
nearly always cached, microseconds, and in WAL mode a reader never waits for the writer.
A reader sees every transaction committed before its statement starts, so a caller that
awaited a write reads it back.

What survives a restart: every live key with its version, the store-wide revision (kept in its
own row, so versions never go backwards and a stale CAS can never succeed against a key that
was deleted and recreated), and each TTL key's absolute expiry time (wall clock). Keys whose
expiry passed while the store was closed are purged on open, without events.

One process at a time: an exclusive ``flock`` on ``LOCK`` in the directory refuses a second
broker pointed at the same data directory (``StoreLocked``); the kernel drops the lock when
the holder dies, however it dies.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time

from danube.dirsync import fsync_dir, makedirs_durable
from danube.fslock import try_lock
from danube.metadata._local import LocalStore
from danube.metadata._writer import Writer
from danube.metadata.errors import MetadataUnavailable, StoreLocked

DB_NAME = "meta.sqlite3"
LOCK_NAME = "LOCK"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key        TEXT PRIMARY KEY NOT NULL,
    value      TEXT NOT NULL,
    version    INTEGER NOT NULL,
    expires_at REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_expires_at ON kv (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (name, value) VALUES ('revision', 0);
"""

_LIVE = "(expires_at IS NULL OR expires_at > ?)"


class _Rows:
    """The row primitives over one connection (the reader's or the writer's)."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def _row(self, key, now):
        return self.db.execute(
            f"SELECT value, version, expires_at FROM kv WHERE key = ? AND {_LIVE}",
            (key, now)).fetchone()

    def _rows(self, lo, hi, now):
        return self.db.execute(
            f"SELECT key, value FROM kv WHERE key >= ? AND key < ? AND {_LIVE} ORDER BY key",
            (lo, hi, now)).fetchall()

    def _keys(self, lo, hi, now):
        return [key for (key,) in self.db.execute(
            f"SELECT key FROM kv WHERE key >= ? AND key < ? AND {_LIVE} ORDER BY key",
            (lo, hi, now))]

    def _due(self, now):
        # Sorted here, not by ORDER BY: that would make SQLite walk the whole table in key
        # order instead of searching the expiry index, on every write.
        return sorted(key for (key,) in self.db.execute(
            "SELECT key FROM kv WHERE expires_at <= ?", (now,)))

    def _next_expiry(self):
        return self.db.execute(
            "SELECT min(expires_at) FROM kv WHERE expires_at IS NOT NULL").fetchone()[0]

    def _set(self, key, text, version, expires_at):
        self.db.execute(
            "INSERT OR REPLACE INTO kv (key, value, version, expires_at) VALUES (?, ?, ?, ?)",
            (key, text, version, expires_at))

    def _unset(self, key):
        self.db.execute("DELETE FROM kv WHERE key = ?", (key,))


class EmbeddedStore(LocalStore):
    """``LocalStore`` over ``<directory>/meta.sqlite3``; the broker passes
    ``<data_dir>/metadata``. Construction opens (creating if needed) and locks the database;
    ``start()`` (or ``EmbeddedStore.open(directory)``) starts TTL expiry."""

    _backend_errors = (sqlite3.Error,)

    def __init__(self, directory: str | os.PathLike, *, clock=time.time):
        super().__init__(clock=clock)
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, DB_NAME)
        self._lock_fd: int | None = None
        self._db: sqlite3.Connection | None = None          # reads, on the loop thread
        self._reader: _Rows | None = None
        self._writer: Writer | None = None
        wdb = None
        try:
            makedirs_durable(self.directory)
            self._lock_fd = _lock_directory(self.directory)
            created = not os.path.exists(self.path)
            # The writer's connection is opened here, so that a store that cannot be
            # opened fails at once; from now on only the writer thread uses it.
            wdb = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            wdb.execute("PRAGMA journal_mode=WAL")
            wdb.execute("PRAGMA synchronous=FULL")
            version = wdb.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise MetadataUnavailable(
                    f"{self.path}: metadata schema version {version} is not the one this "
                    f"broker understands ({SCHEMA_VERSION})")
            wdb.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
            self._revision = wdb.execute(
                "SELECT value FROM meta WHERE name = 'revision'").fetchone()[0]
            if created:
                # The new database file's entry: a power cut right after the first
                # acknowledged write must not lose the whole file.
                fsync_dir(self.directory)
            self._db = sqlite3.connect(self.path, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA query_only=ON")
            self._reader = _Rows(self._db)
            self._writer = Writer(wdb, _Rows(wdb), self._revision, clock, self._committed,
                                  name=f"danube-metadata {self.directory}")
        except BaseException as exc:
            if self._writer is None and wdb is not None:
                wdb.close()
            self._close_storage()
            self._closed = True
            if isinstance(exc, (sqlite3.Error, OSError)):
                raise MetadataUnavailable(f"cannot open metadata store {self.path}: {exc}") \
                    from exc
            raise

    # -- reads, on the loop thread ------------------------------------------------------------

    def _row(self, key, now):
        return self._reader._row(key, now)

    def _rows(self, lo, hi, now):
        return self._reader._rows(lo, hi, now)

    def _keys(self, lo, hi, now):
        return self._reader._keys(lo, hi, now)

    def _next_expiry(self):
        return self._reader._next_expiry()

    # -- writes, in the writer thread ---------------------------------------------------------

    async def _execute(self, op, durable=True):
        self._check_open()
        return await self._writer.submit(op, durable)

    @property
    def write_stats(self) -> dict[str, int]:
        """Operations run, transactions committed, commits synced (one fsync each) and
        batches taken by the writer thread since the store was opened."""
        w = self._writer
        if w is None:
            return {"operations": 0, "commits": 0, "synced_commits": 0, "batches": 0}
        return {"operations": w.operations, "commits": w.commits,
                "synced_commits": w.synced_commits, "batches": w.batches}

    async def _finish_writes(self):
        writer = self._writer
        if writer is None:
            return
        # The reader goes first, so that the writer's connection is the last one closed:
        # closing it checkpoints the SQLite WAL into the database, with fsyncs, which
        # belong in the writer thread.
        self._close_reader()
        writer.stop()
        await asyncio.shield(asyncio.wrap_future(writer.done))

    def _close_reader(self):
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def _close_storage(self):
        try:
            self._close_reader()
        finally:
            try:
                if self._writer is not None:
                    # Normally done by _finish_writes; after a cancelled close the thread
                    # may still be committing its last batch: the lock is kept until then.
                    self._writer.stop()
                    self._writer.join()
            finally:
                fd, self._lock_fd = self._lock_fd, None
                if fd is not None:
                    os.close(fd)


def _lock_directory(directory: str) -> int:
    fd = try_lock(os.path.join(directory, LOCK_NAME))
    if fd is None:
        raise StoreLocked(f"metadata store {directory} is in use by another process")
    return fd


