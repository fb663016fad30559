"""Group commit: the WAL's sync worker and what it runs in the executor.

``GroupCommit`` owns the sync worker and what it works from. One background task per WAL
(``_run_worker``) makes every sync: it gathers the pending
writes and the segments with unsynced data into one job (``_Job``), runs it in the executor
(one ``pwritev`` per run of pending buffers, then one ``fdatasync`` per segment), and then
answers every ``sync_to`` caller the job covers. While a job runs, new appends queue for the
next one, so the number of fdatasync calls tracks the disk's speed, not the request rate;
what is appended meanwhile is written ahead in another executor thread (``_write_ahead``) so
the next sync finds it written. The worker also serves ``rotate()`` between two syncs, closes
the descriptors of sealed segments, makes interval-mode syncs, and writes checkpoints in a
thread shared by every WAL, after the job whose state they record. Besides the pending
writes (in the shared ``WalState``) it owns the bookkeeping of syncs: the sealed segments
still to sync and close, the ``sync_to`` callers, the jobs in flight, the checkpoint's
dirtiness, the ``rotate()`` requests.
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
from typing import Callable

from danube.storage.checkpoint import build_checkpoint, fsync_dir, write_checkpoint
from danube.metering import Summary
from danube.storage.errors import WALClosedError, WALFailedError
from danube.storage.exhaustion import DESCRIPTOR_ERRNOS, DISK_FULL_ERRNOS
from danube.storage.segment import Segment
from danube.storage.segment_writes import PendingWrite, write_pending
from danube.storage.wal.config import ALWAYS, INTERVAL, NONE
from danube.storage.wal.state import OPEN, WalState

_LINUX = sys.platform.startswith("linux")
#: The syscall a sync makes per segment; tests wrap it to count and order calls.
_fdatasync = getattr(os, "fdatasync", os.fsync)

log = logging.getLogger("danube.storage.wal")

#: Pending bytes that make the sync worker write ahead while a sync runs (see _write_ahead).
_WRITE_AHEAD_MIN = 64 << 10
#: Appends smaller than this are written at once in mode always when nothing is pending.
_DEFER_MIN = 16 << 10


class _Job:
    """One pass of the sync worker, prepared on the loop, run in the executor.

    Its syncs run in the order a power cut needs: first the segments whose directory entries
    are durable, then the directory, then the segments created since the last directory sync
    (``after_dir``, in log order). The entry of a new segment is made durable only after the
    data of the segment before it, so no power cut leaves a segment whose predecessor lost
    its tail, except new segments that hold nothing (recovery removes those). And a new
    segment's data is synced only once its entry is durable: an append whose segment's sync
    returned survives, where data synced before its entry was lost with the file
    (tests/e2e/test_power_cut_order.py)."""

    __slots__ = ("target", "writes", "sync", "after_dir", "retire", "dir_fsync", "ckpt",
                 "fdatasyncs")

    def __init__(self):
        self.target: int | None = None       # offset durable once the job is done
        self.writes: list = []               # PendingWrites, in order, before the syncs
        self.sync: list = []                 # (segment, fd or None, position)
        self.after_dir = 0                   # how many of `sync` (its end) follow the dir
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
            split = len(self.sync) - self.after_dir
            for seg, fd, _ in self.sync[:split]:
                self._sync(seg, fd)
            if self.dir_fsync:
                fsync_dir(directory)
            for seg, fd, _ in self.sync[split:]:
                self._sync(seg, fd)
        finally:
            for _, fd in self.retire:
                os.close(fd)

    def _sync(self, seg: Segment, fd: int | None) -> None:
        if fd is None:      # sealed, descriptor already closed (none mode)
            fd2 = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _fdatasync(fd2)
            finally:
                os.close(fd2)
        else:
            _fdatasync(fd)
        self.fdatasyncs += 1


class GroupCommit:
    """The WAL's sync worker and durability calls (see the module docstring)."""

    def __init__(self, state: WalState):
        self._s = state
        # In mode always appends are written by the sync job, just before its fdatasync
        # (see "Writes" in the package docstring).
        self._defer = state.mode == ALWAYS
        # The broker's journal makes the appends durable instead (mode always; see
        # ``journaled``): the frames then go to the segment file from its writer thread.
        self._journal = state.journal
        self._drain_waiters: list[asyncio.Future] = []
        self._sync_requested = False
        self._tick = False
        self._retiring: list[Segment] = []           # sealed, writable fd still open
        self._unsynced_sealed: list[Segment] = []    # sealed, fd closed, never synced (none)
        self._dir_dirty = False
        self._new_entries: list[Segment] = []        # created since the last directory sync
        self._ckpt_dirty = False
        self._sync_waiters: list = []                # heap of (offset, seq, future)
        self._waiter_seq = 0
        self._pass_waiters: list[asyncio.Future] = []
        self._inflight: concurrent.futures.Future | None = None
        self._writing: tuple | None = None     # (concurrent future, future) of a write job
        self._ckpt_job: tuple | None = None    # (concurrent future, future) of a checkpoint
        self._rotate_waiters: list = []        # (future, seal) of rotate() calls to serve
        self._unclaimed = 0                    # bytes pending and not taken by any job
        #: The worker task (``start``).
        self.worker: asyncio.Task | None = None
        #: Called on the loop with the covered offset after every completed sync (tests).
        self.on_sync: Callable[[int], None] | None = None
        #: Completed syncs (groups) and fdatasync calls.
        self.sync_count = 0
        self.fdatasync_count = 0
        #: For upstream's danube_wal_* metrics: flush passes (a pass that wrote or synced)
        #: and their wall time.
        self.flush_latency_ms = Summary()

    def start(self) -> None:
        self.worker = self._s.loop.create_task(self._run_worker(),
                                               name=f"wal-sync {self._s.directory}")
        if self._journal is not None:
            self._journal.touch(self)       # its active segment's descriptor counts

    async def sync_to(self, offset: int | None = None) -> int:
        """Return once a sync covers ``offset`` (default: everything appended so far), in
        any mode; returns ``durable_offset``. Concurrent callers share syncs. Raises
        ValueError for an offset not appended yet, ``WALFailedError`` if the sync fails,
        ``WALClosedError`` if the WAL closes first."""
        s = self._s
        if offset is None:
            offset = s.next_offset - 1
        if offset <= s.durable:
            return s.durable
        s.check_usable()
        if offset >= s.next_offset:
            raise ValueError(f"offset {offset} has not been appended (next offset "
                             f"{s.next_offset})")
        fut = s.loop.create_future()
        self._waiter_seq += 1
        heapq.heappush(self._sync_waiters, (offset, self._waiter_seq, fut))
        if self._journal is None:       # (the journal answers by itself: ``journaled``)
            self._sync_requested = True
            s.kick.set()
        return await fut

    # ------------------------------------------------------------------ pending writes

    def deferred(self, nbytes: int) -> bool:
        """Whether an append of ``nbytes`` of frames is left to the sync job. A small one
        (a single message, say) costs less written at once, which keeps the file in order
        only while nothing is pending."""
        return self._defer and (nbytes >= _DEFER_MIN or bool(self._s.pending)
                                or self._journal is not None)

    def queue(self, pending: PendingWrite | None) -> None:
        """Take an append's pending write (None: it was written at once)."""
        if pending is not None:
            self._s.pending.append(pending)
            if self._journal is not None:
                self._journal.submit(self._s.journal_key, self, pending)
                self._journal.touch(self)
                return
            self._unclaimed += pending.nbytes
            self._write_ahead()

    def write_all_pending(self) -> None:
        """Write every appended frame to its file now, on the loop (rotation, once per
        segment): a segment is sealed, and the next one created, only once the sealed one
        holds all its frames, so a process crash never leaves a gap between segments. Jobs
        writing some of them are waited for; what they wrote is not written twice."""
        if self._journal is not None:
            # The journal's writer may be writing some of them: one of the two writes each.
            with self._journal.segment_lock:
                write_pending(list(self._s.pending))
            return
        running = [f for f in (self._inflight, self._writing and self._writing[0]) if f]
        if running:
            concurrent.futures.wait(running)
        write_pending(list(self._s.pending))
        self._unclaimed = 0

    def _claim_unwritten(self) -> list:
        """The pending writes no job has written or taken, now taken by the caller's."""
        todo = [p for p in self._s.pending if not p.written and not p.claimed]
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
        if (self._writing is not None or self._inflight is None or self._s.failed is not None
                or self._unclaimed < _WRITE_AHEAD_MIN):
            return
        todo = self._claim_unwritten()
        if not todo:
            return
        cf = self._s.executor.submit(write_pending, todo)
        fut = asyncio.wrap_future(cf, loop=self._s.loop)
        self._writing = (cf, fut)

        def done(_):
            self._writing = None
            exc = None if cf.cancelled() else cf.exception()
            if exc is not None:
                self._fail(exc)
            else:
                self._write_ahead()

        fut.add_done_callback(done)

    # ------------------------------------------------------------------ sealed segments

    def retire(self, seg: Segment, successor: Segment) -> None:
        """A segment was just sealed and ``successor`` created: sync the sealed one (as the
        mode says), close its descriptor, make the successor's directory entry durable and
        record both in a checkpoint."""
        self._retiring.append(seg)
        self._dir_dirty = self._ckpt_dirty = True
        if self._s.mode != NONE:     # (none syncs only when asked: order does not matter)
            self._new_entries.append(successor)
        self._s.kick.set()

    def forget_sealed(self, seg: Segment) -> None:
        """A sealed segment is being deleted: it needs no sync any more."""
        if seg in self._unsynced_sealed:
            self._unsynced_sealed.remove(seg)

    def checkpoint_soon(self) -> None:
        """The segment list changed: the next pass writes a checkpoint."""
        self._ckpt_dirty = True

    async def settle_retiring(self) -> None:
        """Wait for the worker to sync (as the mode says) and close the descriptors of
        just-sealed segments."""
        s = self._s
        while (s.status == OPEN and s.failed is None
               and any(seg.fd is not None for seg in s.segments[:-1])):
            fut = s.loop.create_future()
            self._pass_waiters.append(fut)
            s.kick.set()
            await fut

    def rotate_between_syncs(self, seal: Callable[[], Segment | None]) -> asyncio.Future:
        """A future for ``rotate()``: the worker, between two syncs and with every pending
        frame written (in the executor), calls ``seal`` (which seals the active segment and
        returns it, or None) and resolves the future with what it returned."""
        fut = self._s.loop.create_future()
        self._rotate_waiters.append((fut, seal))
        self._s.kick.set()
        return fut

    async def _rotate_for_waiters(self) -> None:
        """In the sync worker, no sync job in flight: serve the ``rotate()`` calls. Appends
        still pending are written in the executor first (they are claimed, so no other job
        writes them), then the rotation runs on the loop with nothing left to wait for and
        only what was appended meanwhile to write."""
        waiters, self._rotate_waiters = self._rotate_waiters, []
        s = self._s
        sealed = error = None
        try:
            if self._writing is not None:
                await asyncio.wait([self._writing[1]])
            s.check_usable()
            todo = self._claim_unwritten()
            if todo:
                try:
                    await asyncio.wrap_future(s.executor.submit(write_pending, todo))
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - as a failed write-ahead
                    self._fail(exc)
                    raise
            s.check_usable()
            sealed = waiters[0][1]()
        except asyncio.CancelledError:
            error = WALClosedError(f"WAL {s.directory} is closed")
            raise
        except BaseException as exc:  # noqa: BLE001 - reported to the callers
            error = exc
        finally:
            for fut, _ in waiters:
                if not fut.done():
                    if error is None:
                        fut.set_result(sealed)
                    else:
                        fut.set_exception(error)

    # ------------------------------------------------------------------ the worker

    async def _run_worker(self) -> None:
        s = self._s
        kick = s.kick
        interval = s.config.sync_interval_ms / 1000 if s.mode == INTERVAL else None
        while True:
            if not kick.is_set():
                if s.status != OPEN:
                    break
                if interval is None:
                    await kick.wait()
                else:
                    try:
                        async with asyncio.timeout(interval):
                            await kick.wait()
                    except TimeoutError:
                        self._tick = True
            kick.clear()
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
                self._inflight = s.executor.submit(job.run, s.directory)
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
        cf = _checkpoint_executor().submit(write_checkpoint, self._s.directory, body,
                                           self._journal is None)
        fut = asyncio.wrap_future(cf, loop=self._s.loop)
        self._ckpt_job = (cf, fut)

        def done(_):
            self._ckpt_job = None
            exc = None if cf.cancelled() else cf.exception()
            if exc is not None and _exhausted(exc):
                # A full disk or the descriptor limit: the checkpoint is a hint (recovery
                # checks it against the files, and the one before stays in place, whole),
                # so the WAL goes on and the next pass writes it again; failing the WAL
                # would keep it refusing appends after the space is back.
                log.warning("WAL %s: checkpoint not written (%s); writing it again on the "
                            "next pass", self._s.directory, exc)
                self._ckpt_dirty = True
            elif exc is not None:
                self._fail(exc)
            elif self._ckpt_dirty and self._s.status == OPEN:
                self._s.kick.set()

        fut.add_done_callback(done)

    def _make_job(self) -> _Job | None:
        s = self._s
        job = _Job()
        active = s.active
        want = self._sync_requested or s.status != OPEN
        journal = self._journal is not None
        if s.mode == ALWAYS and s.durable < s.next_offset - 1 and not journal:
            want = True         # plain appends are synced too, just not waited for
        if self._tick:
            want = want or s.durable < s.next_offset - 1
            self._tick = False
        if (s.mode != NONE and not journal
                and any(seg.synced_pos < seg.write_pos for seg in self._retiring)):
            want = True         # sync sealed segments as they are sealed
        self._sync_requested = False
        if s.failed is not None:
            want = False
        if want and journal:
            # The journal covers every append; its trim syncs the segments (and their
            # directory entries) with the file system.
            self._dir_dirty = False
            self._new_entries = []
        elif want:
            job.writes = list(s.pending)
            for pending in job.writes:
                pending.claimed = True          # the write-ahead leaves them to this job
            self._unclaimed = 0
            job.target = s.next_offset - 1
            for seg in self._retiring:
                if seg.synced_pos < seg.write_pos:
                    job.sync.append((seg, seg.fd, seg.write_pos))
            for seg in self._unsynced_sealed:
                job.sync.append((seg, None, seg.write_pos))
            if active.write_pos > active.synced_pos:
                if not _LINUX and active.mm is not None:
                    active.mm.flush()
                job.sync.append((active, active.fd, active.write_pos))
            job.dir_fsync = self._dir_dirty
            self._dir_dirty = False
            if job.dir_fsync and self._new_entries:
                new = set(self._new_entries)
                job.sync.sort(key=lambda entry: (entry[0] in new, entry[0].base))
                job.after_dir = sum(seg in new for seg, _, _ in job.sync)
                self._new_entries = []
        job.retire = [(seg, seg.fd) for seg in self._retiring]
        self._retiring = []
        if self._ckpt_dirty and s.failed is None and self._ckpt_job is None:
            durable = s.durable if job.target is None else job.target
            job.ckpt = build_checkpoint(s.segments, s.next_offset, durable,
                                        s.clock(), {seg for seg, _, _ in job.sync})
            self._ckpt_dirty = False
        if job.target is None and not job.needs_thread() and job.ckpt is None:
            return None
        return job

    def _finish_job(self, job: _Job, exc: BaseException | None) -> None:
        s = self._s
        for seg, _ in job.retire:
            seg.fd = None
            if self._journal is not None:
                continue
            if seg.synced_pos < seg.write_pos and not any(x is seg for x, _, _ in job.sync):
                self._unsynced_sealed.append(seg)
        self.fdatasync_count += job.fdatasyncs
        if exc is not None:
            self._fail(exc)
            self._finish_pass()
            return
        pending_writes = s.pending
        for pending in job.writes:
            assert pending_writes[0] is pending
            pending_writes.popleft()
            pending.done()
        for seg, _, pos in job.sync:
            seg.synced_pos = max(seg.synced_pos, pos)
        if job.sync:
            synced = {id(seg) for seg, _, _ in job.sync}
            self._unsynced_sealed = [x for x in self._unsynced_sealed if id(x) not in synced]
        if job.target is not None:
            self._covered(job.target)
        self._finish_pass()

    def _covered(self, offset: int) -> None:
        """A sync (or a journal commit) covers ``offset``: answer the callers it covers."""
        s = self._s
        if offset > s.durable:
            s.durable = offset
        self.sync_count += 1
        if self.on_sync is not None:
            self.on_sync(s.durable)
        waiters = self._sync_waiters
        while waiters and waiters[0][0] <= s.durable:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(s.durable)

    def journaled(self, pendings: list, exc: BaseException | None,
                  flush_ms: float = 0.0) -> None:
        """On the loop: the journal committed ``pendings`` (this WAL's, in order) in
        ``flush_ms`` and wrote them to their segment file, or failed with ``exc``."""
        s = self._s
        if exc is not None:
            self._fail(exc)
            return
        self.flush_latency_ms.observe(flush_ms)
        queue = s.pending
        for pending in pendings:
            if queue and queue[0] is pending:
                queue.popleft()
            pending.done()
        self._covered(pendings[-1].first_offset + pendings[-1].count - 1)
        if not queue:
            self._drained()

    def close_idle_file(self) -> bool:
        """With the journal: close the active segment's descriptor if nothing of this WAL
        is pending (the journal's writer uses it only for pending frames); False while
        something is. It is opened again on the next append or read."""
        s = self._s
        if s.pending or s.status != OPEN:
            return s.status != OPEN
        s.active.close_fd()
        return True

    def _drained(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _finish_pass(self) -> None:
        waiters, self._pass_waiters = self._pass_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        s = self._s
        if s.failed is None:
            s.failed = exc
            log.error("WAL %s: sync failed, refusing further appends: %r", s.directory, exc)
        err = WALFailedError(f"WAL {s.directory}: sync failed: {exc!r}")
        err.__cause__ = exc
        for _, _, fut in self._sync_waiters:
            if not fut.done():
                fut.set_exception(err)
        self._sync_waiters = []
        self._drained()

    # ------------------------------------------------------------------ closing

    async def stop(self) -> None:
        """Closing (the state says so already): let the worker make its last sync and
        checkpoint, and wait for the write and checkpoint jobs still running (with the
        journal: first for it to commit every append)."""
        s = self._s
        if self._journal is not None and s.pending and s.failed is None:
            fut = s.loop.create_future()
            self._drain_waiters.append(fut)
            await fut
        self._s.kick.set()
        if self.worker is not None:
            await asyncio.shield(self.worker)
        if self._writing is not None:
            await asyncio.wait([self._writing[1]])
        if self._ckpt_job is not None:
            await asyncio.wait([self._ckpt_job[1]])

    def final_checkpoint(self, only_if_changed: bool = False) -> dict | None:
        """The checkpoint ``close`` writes (None after a failure: recovery checks the
        files then; with ``only_if_changed``, None also when the segments are those the last
        checkpoint recorded)."""
        s = self._s
        if s.failed is not None or (only_if_changed and not self._ckpt_dirty):
            return None
        self._ckpt_dirty = False
        return build_checkpoint(s.segments, s.next_offset, s.durable, s.clock())

    def release(self, exc: BaseException) -> None:
        """Closing, or a cancelled close: stop the worker, wait for the executor jobs, fail
        every caller still waiting with ``exc`` and close the descriptors of segments sealed
        since the last pass."""
        if self.worker is not None and not self.worker.done():
            self.worker.cancel()
        if self._journal is not None:
            self._journal.barrier()     # its writer is done with this WAL's files
            self._journal.untouch(self)
        self._drained()
        running = [f for f in (self._inflight, self._writing and self._writing[0],
                               self._ckpt_job and self._ckpt_job[0]) if f]
        if running:
            concurrent.futures.wait(running)
        waiters, self._rotate_waiters = self._rotate_waiters, []
        for fut, _ in waiters:
            if not fut.done():
                fut.set_exception(exc)
        for _, _, fut in self._sync_waiters:
            if not fut.done():
                fut.set_exception(exc)
        self._sync_waiters = []
        self._finish_pass()
        for seg in self._retiring:
            if seg.fd is not None:
                os.close(seg.fd)
                seg.fd = None


def _exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full or no descriptor is left (see exhaustion.py)."""
    return isinstance(exc, OSError) and exc.errno in (DISK_FULL_ERRNOS | DESCRIPTOR_ERRNOS)


_ckpt_pool: concurrent.futures.ThreadPoolExecutor | None = None
_ckpt_pool_lock = threading.Lock()


def _checkpoint_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that writes every WAL's checkpoints (see ``GroupCommit._write_checkpoint``)."""
    global _ckpt_pool
    with _ckpt_pool_lock:
        if _ckpt_pool is None:
            _ckpt_pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="danube-wal-checkpoint")
        return _ckpt_pool


def close_active(directory: str, fd: int, write_pos: int, ckpt: dict | None) -> None:
    """Trim the active segment's preallocated tail, make that durable, close it, and write the
    final checkpoint (a WAL without the journal)."""
    try:
        if ckpt is not None:
            os.ftruncate(fd, write_pos)
            _fdatasync(fd)
    finally:
        os.close(fd)
    if ckpt is not None:
        write_checkpoint(directory, ckpt)
