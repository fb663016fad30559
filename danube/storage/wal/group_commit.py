"""Group commit: the WAL's sync worker and what it runs in the executor.

One background task per WAL (``_run_worker``) makes every sync: it gathers the pending
writes and the segments with unsynced data into one job (``_Job``), runs it in the executor
(one ``pwritev`` per run of pending buffers, then one ``fdatasync`` per segment), and then
answers every ``sync_to`` caller the job covers. While a job runs, new appends queue for the
next one, so the number of fdatasync calls tracks the disk's speed, not the request rate;
what is appended meanwhile is written ahead in another executor thread (``_write_ahead``) so
the next sync finds it written. The worker also serves ``rotate()`` between two syncs, closes
the descriptors of sealed segments, makes interval-mode syncs, and writes checkpoints in a
thread shared by every WAL, after the job whose state they record.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
import os
import sys
import threading
import time
from typing import Sequence

from danube.storage.checkpoint import build_checkpoint, fsync_dir, write_checkpoint
from danube.storage.errors import WALFailedError
from danube.storage.segment_writes import PendingWrite, write_pending
from danube.storage.wal.config import ALWAYS, INTERVAL, NONE
from danube.storage.wal.state import OPEN as _OPEN

_LINUX = sys.platform.startswith("linux")
#: The syscall a sync makes per segment; tests wrap it to count and order calls.
_fdatasync = getattr(os, "fdatasync", os.fsync)

log = logging.getLogger("danube.storage.wal")

#: Pending bytes that make the sync worker write ahead while a sync runs (see _write_ahead).
_WRITE_AHEAD_MIN = 64 << 10
#: Appends smaller than this are written at once in mode always when nothing is pending.
_DEFER_MIN = 16 << 10


class _Job:
    """One pass of the sync worker, prepared on the loop, run in the executor."""

    __slots__ = ("target", "writes", "sync", "retire", "dir_fsync", "ckpt", "fdatasyncs")

    def __init__(self):
        self.target: int | None = None       # offset durable once the job is done
        self.writes: list = []               # PendingWrites, in order, before the syncs
        self.sync: list = []                 # (segment, fd or None, position)
        self.retire: list = []               # (segment, fd) to close after syncing
        self.dir_fsync = False
        self.ckpt: dict | None = None
        self.fdatasyncs = 0

    def needs_thread(self) -> bool:
        """Whether ``run`` has anything to do (the checkpoint is written separately)."""
        return bool(self.writes or self.sync or self.retire or self.dir_fsync)

    def run(self, directory: str) -> None:
        try:
            write_pending(self.writes)
            for seg, fd, _ in self.sync:
                if fd is None:      # sealed, descriptor already closed (none mode)
                    fd2 = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        _fdatasync(fd2)
                    finally:
                        os.close(fd2)
                else:
                    _fdatasync(fd)
                self.fdatasyncs += 1
            if self.dir_fsync:
                fsync_dir(directory)
        finally:
            for _, fd in self.retire:
                os.close(fd)


class _GroupCommit:
    """The ``WAL``'s sync worker and durability calls (a mixin of ``WAL``, see log.py)."""

    async def sync_to(self, offset: int | None = None) -> int:
        """Return once a sync covers ``offset`` (default: everything appended so far), in
        any mode; returns ``durable_offset``. Concurrent callers share syncs. Raises
        ValueError for an offset not appended yet, ``WALFailedError`` if the sync fails,
        ``WALClosedError`` if the WAL closes first."""
        if offset is None:
            offset = self._next_offset - 1
        if offset <= self._durable:
            return self._durable
        self._check_usable()
        if offset >= self._next_offset:
            raise ValueError(f"offset {offset} has not been appended (next offset "
                             f"{self._next_offset})")
        fut = asyncio.get_running_loop().create_future()
        self._waiter_seq += 1
        heapq.heappush(self._sync_waiters, (offset, self._waiter_seq, fut))
        self._sync_requested = True
        self._kick.set()
        return await fut

    async def append_durable(self, payloads: Sequence) -> tuple[int, int]:
        """``append``, then in ``always`` mode wait for a sync covering the batch (shared
        with concurrent callers). In ``interval`` and ``none`` modes it returns after the
        write, like ``append``."""
        first, last = self.append(payloads)
        if self._mode == ALWAYS and last >= first and last > self._durable:
            await self.sync_to(last)
        return first, last

    def _deferred(self, nbytes: int) -> bool:
        """Whether an append of ``nbytes`` of frames is left to the sync job. A small one
        (a single message, say) costs less written at once, which keeps the file in order
        only while nothing is pending."""
        return self._defer and (nbytes >= _DEFER_MIN or bool(self._pending))

    def _queue(self, pending: PendingWrite | None) -> None:
        if pending is not None:
            self._pending.append(pending)
            self._unclaimed += pending.nbytes
            self._write_ahead()

    def _claim_unwritten(self) -> list:
        """The pending writes no job has written or taken, now taken by the caller's."""
        todo = [p for p in self._pending if not p.written and not p.claimed]
        for pending in todo:
            pending.claimed = True
        self._unclaimed = 0
        return todo

    def _write_ahead(self) -> None:
        """While a sync job runs, write what was appended since it started in another
        executor thread, so that the next sync finds it written: copying into the page cache
        overlaps the fdatasync instead of following it. One such write job at a time, and
        only for enough bytes to be worth a trip to the executor (small appends, such as
        single messages, are left to the sync job)."""
        if (self._writing is not None or self._inflight is None or self._failed is not None
                or self._unclaimed < _WRITE_AHEAD_MIN):
            return
        todo = self._claim_unwritten()
        if not todo:
            return
        cf = self._executor.submit(write_pending, todo)
        fut = asyncio.wrap_future(cf, loop=self._loop)
        self._writing = (cf, fut)

        def done(_):
            self._writing = None
            exc = None if cf.cancelled() else cf.exception()
            if exc is not None:
                self._fail(exc)
            else:
                self._write_ahead()

        fut.add_done_callback(done)

    async def _run_worker(self) -> None:
        interval = self._config.sync_interval_ms / 1000 if self._mode == INTERVAL else None
        while True:
            if not self._kick.is_set():
                if self._state != _OPEN:
                    break
                if interval is None:
                    await self._kick.wait()
                else:
                    try:
                        async with asyncio.timeout(interval):
                            await self._kick.wait()
                    except TimeoutError:
                        self._tick = True
            self._kick.clear()
            if self._rotate_waiters:
                await self._rotate_for_waiters()
            job = self._make_job()
            if job is None:
                self._finish_pass()
                continue
            exc = None
            if job.needs_thread():
                if self._writing is not None:
                    # Writes started while the previous sync ran: this job's fdatasync must
                    # come after them (and nothing is written twice at once).
                    await asyncio.wait([self._writing[1]])
                started = time.perf_counter()
                self._inflight = self._executor.submit(job.run, self._dir)
                self._write_ahead()
                try:
                    await asyncio.wrap_future(self._inflight)
                except asyncio.CancelledError:
                    raise
                except BaseException as e:  # noqa: BLE001 - reported to every waiter
                    exc = e
                finally:
                    self._inflight = None
                if exc is None:
                    # upstream's danube_wal_flush_total / _latency_ms: a write and sync pass
                    self.flush_latency_ms.observe((time.perf_counter() - started) * 1000.0)
            self._finish_job(job, exc)
            if job.ckpt is not None and exc is None:
                self._write_checkpoint(job.ckpt)

    def _write_checkpoint(self, body: dict) -> None:
        """Write the checkpoint in the executor, after the job whose state it records, and
        outside the path of acknowledgements: it is a hint for recovery (which checks it
        against the files), and its write (a file, its fsync, a rename and a directory fsync)
        would otherwise delay every append waiting for that job. One at a time; a newer one
        waits for the next pass. They run in a thread of their own, shared by every WAL of
        the process, so that checkpoints (a rotation makes one for each topic uploaded at
        the same time) never occupy the threads that syncs wait for."""
        cf = _checkpoint_executor().submit(write_checkpoint, self._dir, body)
        fut = asyncio.wrap_future(cf, loop=self._loop)
        self._ckpt_job = (cf, fut)

        def done(_):
            self._ckpt_job = None
            exc = None if cf.cancelled() else cf.exception()
            if exc is not None:
                self._fail(exc)
            elif self._ckpt_dirty and self._state == _OPEN:
                self._kick.set()

        fut.add_done_callback(done)

    def _make_job(self) -> _Job | None:
        job = _Job()
        active = self._active
        want = self._sync_requested or self._state != _OPEN
        if self._mode == ALWAYS and self._durable < self._next_offset - 1:
            want = True         # plain appends are synced too, just not waited for
        if self._tick:
            want = want or self._durable < self._next_offset - 1
            self._tick = False
        if self._mode != NONE and any(s.synced_pos < s.write_pos for s in self._retiring):
            want = True         # sync sealed segments as they are sealed
        self._sync_requested = False
        if self._failed is not None:
            want = False
        if want:
            job.writes = list(self._pending)
            for pending in job.writes:
                pending.claimed = True          # the write-ahead leaves them to this job
            self._unclaimed = 0
            job.target = self._next_offset - 1
            for seg in self._retiring:
                if seg.synced_pos < seg.write_pos:
                    job.sync.append((seg, seg.fd, seg.write_pos))
            for seg in self._unsynced_sealed:
                job.sync.append((seg, None, seg.write_pos))
            if active.write_pos > active.synced_pos:
                if not _LINUX:
                    active.mm.flush()
                job.sync.append((active, active.fd, active.write_pos))
            job.dir_fsync = self._dir_dirty
            self._dir_dirty = False
        job.retire = [(s, s.fd) for s in self._retiring]
        self._retiring = []
        if self._ckpt_dirty and self._failed is None and self._ckpt_job is None:
            durable = self._durable if job.target is None else job.target
            job.ckpt = build_checkpoint(self._segments, self._next_offset, durable,
                                        self._clock(), {s for s, _, _ in job.sync})
            self._ckpt_dirty = False
        if job.target is None and not job.needs_thread() and job.ckpt is None:
            return None
        return job

    def _finish_job(self, job: _Job, exc: BaseException | None) -> None:
        for seg, _ in job.retire:
            seg.fd = None
            if seg.synced_pos < seg.write_pos and not any(s is seg for s, _, _ in job.sync):
                self._unsynced_sealed.append(seg)
        self.fdatasync_count += job.fdatasyncs
        if exc is not None:
            self._fail(exc)
            self._finish_pass()
            return
        for pending in job.writes:
            assert self._pending[0] is pending
            self._pending.popleft()
            pending.done()
        for seg, _, pos in job.sync:
            seg.synced_pos = max(seg.synced_pos, pos)
        if job.sync:
            synced = {id(s) for s, _, _ in job.sync}
            self._unsynced_sealed = [s for s in self._unsynced_sealed if id(s) not in synced]
        if job.target is not None:
            self._durable = max(self._durable, job.target)
            self.sync_count += 1
            if self.on_sync is not None:
                self.on_sync(self._durable)
            waiters = self._sync_waiters
            while waiters and waiters[0][0] <= self._durable:
                fut = heapq.heappop(waiters)[2]
                if not fut.done():
                    fut.set_result(self._durable)
        self._finish_pass()

    def _finish_pass(self) -> None:
        waiters, self._pass_waiters = self._pass_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            log.error("WAL %s: sync failed, refusing further appends: %r", self._dir, exc)
        err = WALFailedError(f"WAL {self._dir}: sync failed: {exc!r}")
        err.__cause__ = exc
        for _, _, fut in self._sync_waiters:
            if not fut.done():
                fut.set_exception(err)
        self._sync_waiters = []


_ckpt_pool: concurrent.futures.ThreadPoolExecutor | None = None
_ckpt_pool_lock = threading.Lock()


def _checkpoint_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that writes every WAL's checkpoints (see ``WAL._write_checkpoint``)."""
    global _ckpt_pool
    with _ckpt_pool_lock:
        if _ckpt_pool is None:
            _ckpt_pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="danube-wal-checkpoint")
        return _ckpt_pool


def _close_active(directory: str, fd: int, write_pos: int, ckpt: dict | None) -> None:
    """Trim the active segment's preallocated tail, make that durable, close it, and write the
    final checkpoint."""
    try:
        if ckpt is not None:
            os.ftruncate(fd, write_pos)
            _fdatasync(fd)
    finally:
        os.close(fd)
    if ckpt is not None:
        write_checkpoint(directory, ckpt)
