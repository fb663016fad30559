"""The ``WAL`` class: one topic's write-ahead log (see the package docstring for what it
promises). Opening (recovery), its state and closing are here; each other job is a mixin
in a module of its own: appends and rotation (append.py), reads (read.py), the sync worker
(group_commit.py) and retention (retention.py). One object, because the jobs share one
state (segments, offsets, pending writes) and the append path must not pay for a call
between objects.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import time
from typing import Callable

from danube.metering import Summary
from danube.storage._tailcache import TailCache
from danube.storage.checkpoint import build_checkpoint
from danube.storage.errors import WALClosedError, WALFailedError
from danube.storage.recovery import RecoveryReport, recover, release
from danube.storage.segment import Segment, SegmentInfo
from danube.storage.segment_writes import PendingWrite
from danube.storage.wal.append import _Appending
from danube.storage.wal.config import ALWAYS, WALConfig
from danube.storage.wal.group_commit import _close_active, _GroupCommit
from danube.storage.wal.read import _Reading
from danube.storage.wal.retention import _Retention
from danube.storage.wal.state import CLOSED as _CLOSED, CLOSING as _CLOSING, OPEN as _OPEN

log = logging.getLogger("danube.storage.wal")


class WAL(_Appending, _Reading, _GroupCommit, _Retention):
    """A topic's write-ahead log. Create it with ``await WAL.open(directory, config)``."""

    def __init__(self, directory: str, config: WALConfig, recovered, executor, own_executor,
                 clock):
        self._dir = directory
        self._config = config
        self._mode = config.durability
        self._executor = executor
        self._own_executor = own_executor
        self._clock = clock
        self._lock_fd = recovered.lock_fd
        self._segments: list[Segment] = recovered.segments
        self._bases = [s.base for s in self._segments]
        self._active = self._segments[-1]
        self._next_offset = self._active.end_offset
        self._first_offset = self._segments[0].base
        self._durable = self._next_offset - 1
        self._cache = TailCache(config.cache_capacity, self._next_offset)
        self._mapped: collections.OrderedDict[Segment, None] = collections.OrderedDict()
        for seg in self._segments[:-1]:
            if seg.mm is not None:
                self._touch(seg)
        self.recovery: RecoveryReport = recovered.report
        # sync worker state
        self._kick = asyncio.Event()
        self._kick_on_append = self._mode == ALWAYS
        # In mode always appends are written by the sync job, just before its fdatasync
        # (see "Writes" in the package docstring); these are the ones not written yet.
        self._defer = self._mode == ALWAYS
        self._pending: collections.deque[PendingWrite] = collections.deque()
        self._sync_requested = False
        self._tick = False
        self._retiring: list[Segment] = []           # sealed, writable fd still open
        self._unsynced_sealed: list[Segment] = []    # sealed, fd closed, never synced (none)
        self._dir_dirty = False
        self._ckpt_dirty = False
        self._sync_waiters: list = []                # heap of (offset, seq, future)
        self._waiter_seq = 0
        self._readers: list[asyncio.Future] = []
        self._pass_waiters: list[asyncio.Future] = []
        self._inflight: concurrent.futures.Future | None = None
        self._writing: tuple | None = None     # (concurrent future, future) of a write job
        self._ckpt_job: tuple | None = None    # (concurrent future, future) of a checkpoint
        self._rotate_waiters: list[asyncio.Future] = []     # rotate() calls to serve
        self._unclaimed = 0                    # bytes pending and not taken by any job
        self._loop = asyncio.get_running_loop()
        self._worker: asyncio.Task | None = None
        self._state = _OPEN
        self._failed: BaseException | None = None
        self._close_done: asyncio.Future | None = None
        #: Called on the loop with the covered offset after every completed sync (tests).
        self.on_sync: Callable[[int], None] | None = None
        #: Completed syncs (groups), fdatasync calls, segment rotations.
        self.sync_count = 0
        self.fdatasync_count = 0
        self.rotation_count = 0
        # For upstream's danube_wal_* metrics: flush passes (a pass that wrote or synced)
        # and their wall time, rotations by reason, segments deleted by retention.
        self.flush_latency_ms = Summary()
        self.rotations = {"size": 0, "time": 0, "export": 0}
        self.deleted_segments = 0

    # ------------------------------------------------------------------ opening

    @classmethod
    async def open(cls, directory: str | os.PathLike, config: WALConfig | None = None, *,
                   start_offset: int = 0,
                   executor: concurrent.futures.Executor | None = None,
                   clock: Callable[[], float] = time.time) -> WAL:
        """Open (creating it if needed) the WAL in ``directory`` and recover its state.

        ``start_offset`` is where an empty directory's log begins (a topic that moved here
        continues its offsets); it is ignored when segments exist. ``executor`` runs the
        blocking work (recovery, syncs, checkpoints, deletions); by
        default the WAL makes a two-thread one of its own and shuts it down on close.
        ``clock`` gives the wall time used for segment ages (tests pass a fake one).

        Raises ``WALLockedError`` if another WAL has the directory open and
        ``CorruptSegmentError`` for damaged sealed data or a gap between segments.
        """
        config = config or WALConfig()
        if start_offset < 0:
            raise ValueError("start_offset must be >= 0")
        directory = os.fspath(directory)
        loop = asyncio.get_running_loop()
        own = executor is None
        if own:
            # Two threads: a sync and a deletion can run at once (syncs themselves
            # never overlap: the worker task runs one at a time).
            executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="danube-wal")
        try:
            cf = executor.submit(recover, directory, config, start_offset, clock)
            try:
                recovered = await asyncio.shield(asyncio.wrap_future(cf))
            except asyncio.CancelledError:
                cf.add_done_callback(
                    lambda f: f.cancelled() or f.exception() or release(f.result()))
                raise
        except BaseException:
            if own:
                executor.shutdown(wait=False)
            raise
        wal = cls(directory, config, recovered, executor, own, clock)
        wal._worker = loop.create_task(wal._run_worker(), name=f"wal-sync {directory}")
        if recovered.report.dropped_bytes or recovered.report.segments:
            log.debug("WAL %s opened: %s", directory, recovered.report)
        return wal

    # ------------------------------------------------------------------ properties

    @property
    def mode(self) -> str:
        """The durability mode: ALWAYS, INTERVAL or NONE."""
        return self._mode

    @property
    def directory(self) -> str:
        return self._dir

    @property
    def config(self) -> WALConfig:
        return self._config

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets."""
        return self._next_offset

    @property
    def last_offset(self) -> int:
        """The newest appended offset (``next_offset - 1``; -1 before any message)."""
        return self._next_offset - 1

    @property
    def first_offset(self) -> int:
        """The oldest offset still held (== next_offset when the log holds nothing)."""
        return self._first_offset

    @property
    def durable_offset(self) -> int:
        """The newest offset covered by a completed sync (everything recovered at open
        counts: open syncs it)."""
        return self._durable

    @property
    def closed(self) -> bool:
        return self._state != _OPEN

    def segments(self) -> list[SegmentInfo]:
        """Every segment, oldest first; the last one is the active segment."""
        return [s.info() for s in self._segments]

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Sync everything, write the checkpoint, trim the active segment to its data, unmap
        and close every file, stop the worker and (if the WAL made it) the executor.
        Idempotent; concurrent callers all wait for the same close."""
        if self._state == _CLOSED:
            return
        if self._close_done is not None:
            await asyncio.shield(self._close_done)
            return
        loop = asyncio.get_running_loop()
        self._close_done = loop.create_future()
        self._state = _CLOSING
        self._wake_readers(WALClosedError(f"WAL {self._dir} is closed"))
        try:
            self._kick.set()
            if self._worker is not None:
                await asyncio.shield(self._worker)     # runs a last sync + checkpoint
            if self._writing is not None:
                await asyncio.wait([self._writing[1]])
            if self._ckpt_job is not None:
                await asyncio.wait([self._ckpt_job[1]])
            active = self._active
            active.unmap()
            final = None
            if self._failed is None:
                self._ckpt_dirty = False
                final = build_checkpoint(self._segments, self._next_offset, self._durable,
                                         self._clock())
            fd, active.fd = active.fd, None     # the job below closes it
            await asyncio.wrap_future(self._executor.submit(
                _close_active, self._dir, fd, active.write_pos, final))
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("WAL %s: error while closing", self._dir)
            raise
        finally:
            self._release()
            self._state = _CLOSED
            if not self._close_done.done():
                self._close_done.set_result(None)

    def _release(self) -> None:
        """Free everything left, synchronously (also on a cancelled close)."""
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        running = [f for f in (self._inflight, self._writing and self._writing[0],
                               self._ckpt_job and self._ckpt_job[0]) if f]
        if running:
            concurrent.futures.wait(running)
        err = WALClosedError(f"WAL {self._dir} is closed")
        waiters, self._rotate_waiters = self._rotate_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_exception(err)
        for _, _, fut in self._sync_waiters:
            if not fut.done():
                fut.set_exception(err)
        self._sync_waiters = []
        self._wake_readers(err)
        self._finish_pass()
        for seg in self._segments:
            seg.unmap()
            if seg.fd is not None:
                try:
                    os.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None
        for seg in self._retiring:
            if seg.fd is not None:
                os.close(seg.fd)
                seg.fd = None
        self._mapped.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._own_executor:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> WAL:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ------------------------------------------------------------------ helpers

    def _check_usable(self) -> None:
        if self._state != _OPEN or self._failed is not None:
            self._raise_unusable()

    def _raise_unusable(self):
        if self._state != _OPEN:
            raise WALClosedError(f"WAL {self._dir} is closed")
        raise WALFailedError(f"WAL {self._dir} failed: {self._failed!r}") from self._failed

    def __repr__(self) -> str:
        return (f"<WAL {self._dir} {self._mode} offsets {self._first_offset}.."
                f"{self._next_offset - 1} durable {self._durable} "
                f"segments {len(self._segments)}{' closed' if self.closed else ''}>")
