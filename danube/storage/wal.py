"""Per-topic write-ahead log: mmap'd segment files, group commit, a hot-tail cache, retention.

One ``WAL`` owns one directory (one topic). Messages get offsets from 0 (or ``start_offset``)
up, contiguous and never reused while the data that carried them survives. ``append`` frames
a batch in C (``danube._wal``, no Python per message) and returns at once; the frames go to
the active segment with ``pwrite`` (see segment.py for why not through the mapping, which
serves reads), at once or, in mode ``always``, from the sync worker (see "Writes" below).
Durability is a separate, shared step (``sync_to``), so one ``fdatasync`` covers every append
made before it started ("group commit").

Layout of the directory::

    wal.00000000000000000000.log    sealed segment: frames of offsets 0..N, no zero tail
    wal.0000000000000000N+1.log     active segment: preallocated, zero tail after the data
    wal.ckpt                        checkpoint (a hint for recovery, see checkpoint.py)
    wal.lock                        flock'ed while a WAL has the directory open

Each frame is ``[u64 offset][u32 len][u32 crc32c(header[0:12] + payload)][payload]``
(see ``danube/_wal.pyx``).

Durability modes, and exactly what each promises
------------------------------------------------

Appends are written into the kernel's page cache for the file (``pwrite``; the segments'
``MAP_SHARED`` mappings readers use are that same cache). So:

**Process crash** (kill -9, OOM kill, a segfault, ``os._exit``) -- every append that was
written is recovered: the page cache belongs to the kernel, not the process, and is written
back later whatever happened to the writer. In ``interval`` and ``none`` modes that is every
append that returned. In ``always`` mode it is at least every append a completed sync covers
(every acknowledged one); appends made after the last sync started may be lost, as on a
machine crash. A batch being written at the instant of the kill can be cut; recovery drops
that torn frame (nobody was told about it) and keeps everything before it.

**Machine crash** (power loss, kernel panic, VM reset) -- what reached stable storage:

* ``always``: every offset covered by a completed sync is kept -- that is, every offset for
  which ``append_durable`` or ``sync_to`` returned. A sync is ``fdatasync`` of each segment
  with unsynced data (plus an fsync of the directory when a segment was created), run in the
  executor. Appends whose sync had not completed may be lost; recovery keeps the longest
  clean prefix. Concurrent callers share syncs: while one sync runs, new appends queue for
  the next, so the number of fdatasync calls tracks the disk's speed, not the request rate.
  Plain ``append`` in this mode also schedules a sync, it just does not wait for it.
* ``interval``: a background sync every ``sync_interval_ms`` (and when a segment is sealed);
  ``append_durable`` returns after the write, not the sync. Up to about one interval of
  acknowledged appends can be lost, from the end of the log.
* ``none``: the WAL never syncs while running (only at open and at close, or when a caller
  asks with ``sync_to``); the kernel writes back when it likes (``vm.dirty_expire_centisecs``,
  30 s by default). Anything not written back can be lost, including part of an already
  sealed segment -- which recovery then reports as ``CorruptSegmentError``, since it cannot
  tell that apart from disk damage.

After a machine crash in ``interval`` or ``none`` mode the log continues right after the last
surviving offset, so offsets that were lost are given out again to new messages; a reader
that saw the lost messages before the crash may see different ones at the same offsets.
``always`` never hands out an offset twice for data that was acknowledged. (All of this
assumes a disk that honours cache flushes, as any fsync-based store does.)

Readers see data as soon as it is appended, before it is durable (and, in ``always`` mode,
before it is written: ``read`` serves it from the pending buffers). A caller that must not
expose data that could still be lost (in ``always`` mode) bounds its reads by
``durable_offset``.

Writes
------

In ``interval`` and ``none`` modes ``append`` writes its frames before it returns. In
``always`` mode nobody is told about an append before a sync covers it, so the write can wait
for the sync: ``append`` frames the batch into a buffer (a PendingWrite) and returns, and the
sync job, in the executor, writes every pending buffer (one ``pwritev`` per run of them) just
before its ``fdatasync``. (An append under 16 KiB while nothing is pending, such as a single
message, is written at once: that costs less than the bookkeeping.) The event loop then never waits on the copy into the page cache,
which is the largest cost of a durable append when the page cache grows (on the reference VM
~480 us of CPU per 230 KB batch, see bench/reliable): with several batches in flight the loop
works on the next ones while the executor writes and syncs. Rotation writes whatever is
pending before the segment is sealed and its successor created, so a process crash never
leaves a gap between segments. A rotation forced by an append (the batch does not fit, or
the segment is too old) does that on the loop, once per segment, waiting for a write in
flight if there is one; ``rotate()`` (the tiered uploader's, every upload interval) asks the
sync worker instead, which rotates between two syncs after writing the pending frames in the
executor, so the loop waits for nothing and copies only what was appended meanwhile.

A sync is ``fdatasync``: appends are ``pwrite`` calls, so it covers them on any POSIX system;
the file size only changes when a segment grows or is sealed, and fdatasync covers that too.
(Before appends used ``pwrite`` they were stores into the ``MAP_SHARED`` mapping, which on
Linux is the page cache too; the msync of the dirty range on other Unixes is kept, harmless.)

Threads and tasks
-----------------

The WAL is used from one event loop. It owns one background task (the sync worker: group
commit, interval syncs, closing the descriptors of sealed segments, rotations asked for by
``rotate()``, checkpoint writes) and runs blocking file work in an executor: a two-thread
executor of its own by default (a sync and a deletion may overlap; syncs never do), or one
shared by many WALs (pass ``executor=``; a broker with thousands of topics should).
Checkpoints are written by one more thread, shared by every WAL of the process, after the
sync job whose state they record, not in it: appends waiting for that sync (the first after
a rotation, say) are acknowledged without waiting for the checkpoint's own fsyncs, and
checkpoints never hold the threads that syncs wait for. That is safe because a checkpoint is
only a hint that recovery checks against the files, and a new segment's directory entry is
made durable by the sync job itself. ``close()`` stops the task and waits for work in the
executors.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import dataclasses
import heapq
import logging
import os
import sys
import threading
import time
from typing import Callable, Sequence

from danube.storage._walframes import (HEADER_SIZE as _HEADER, TailCache, measure_frames,
                                       read_frames_into)
from danube.storage.checkpoint import build_checkpoint, fsync_dir, write_checkpoint
from danube.storage.errors import OffsetTruncatedError, WALClosedError, WALFailedError
from danube.storage.recovery import RecoveryReport, recover, release
from danube.storage.segment import PendingWrite, Segment, SegmentInfo, write_pending

__all__ = ["ALWAYS", "INTERVAL", "NONE", "WAL", "WALConfig", "SegmentInfo", "RecoveryReport"]

ALWAYS = "always"
INTERVAL = "interval"
NONE = "none"
_MODES = (ALWAYS, INTERVAL, NONE)

_LINUX = sys.platform.startswith("linux")
#: The syscall a sync makes per segment; tests wrap it to count and order calls.
_fdatasync = getattr(os, "fdatasync", os.fsync)

log = logging.getLogger("danube.storage.wal")

_OPEN, _CLOSING, _CLOSED = 0, 1, 2

#: Pending bytes that make the sync worker write ahead while a sync runs (see _write_ahead).
_WRITE_AHEAD_MIN = 64 << 10
#: Appends smaller than this are written at once in mode always when nothing is pending.
_DEFER_MIN = 16 << 10

@dataclasses.dataclass(frozen=True, slots=True)
class WALConfig:
    """WAL settings. Upstream's broker YAML keys are noted where one exists.

    * ``durability``: ``"always"`` | ``"interval"`` | ``"none"`` (see the module docstring;
      ``storage.wal.durability``, per topic ``storage.wal.topic_durability``).
    * ``sync_interval_ms``: interval mode's period
      (``storage.wal.advanced.file_sync.interval_ms``).
    * ``segment_max_bytes``: a segment is sealed once the next batch would not fit
      (``storage.wal.rotation.max_bytes``).
    * ``max_age_seconds``: a non-empty active segment older than this is sealed before the
      next append (``storage.wal.rotation.max_hours`` x 3600); None: no age limit.
    * ``cache_capacity``: messages kept in memory for readers at the head
      (``storage.wal.advanced.cache_capacity``).
    * ``segment_initial_bytes``: the first preallocation of a new segment; it doubles as
      needed up to ``segment_max_bytes``, so a thousand quiet topics do not reserve
      ``segment_max_bytes`` of disk each.
    * ``validate_sealed``: ``"lazy"`` scans a sealed segment the checkpoint vouches for on its
      first read; ``"open"`` scans every segment at open.
    * ``verify_reads``: check the CRC of every frame read from a segment (recovery has
      already checked everything written before the open).
    * ``max_mapped_sealed``: sealed segments kept mapped for readers (least recently read
      ones are unmapped beyond this).
    """
    durability: str = ALWAYS
    sync_interval_ms: int = 5000
    segment_max_bytes: int = 64 << 20
    max_age_seconds: float | None = None
    cache_capacity: int = 1024
    segment_initial_bytes: int = 1 << 20
    validate_sealed: str = "lazy"
    verify_reads: bool = False
    max_mapped_sealed: int = 8

    def __post_init__(self):
        if self.durability not in _MODES:
            raise ValueError(f"durability must be one of {_MODES}, got {self.durability!r}")
        if self.validate_sealed not in ("lazy", "open"):
            raise ValueError(f"validate_sealed must be 'lazy' or 'open', got "
                             f"{self.validate_sealed!r}")
        if self.segment_max_bytes < 4096:
            raise ValueError("segment_max_bytes must be at least 4096")
        if self.segment_initial_bytes < 1:
            raise ValueError("segment_initial_bytes must be positive")
        if self.sync_interval_ms <= 0:
            raise ValueError("sync_interval_ms must be positive")
        if self.max_age_seconds is not None and self.max_age_seconds <= 0:
            raise ValueError("max_age_seconds must be positive or None")
        if self.cache_capacity < 0 or self.max_mapped_sealed < 0:
            raise ValueError("cache_capacity and max_mapped_sealed must be >= 0")


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


class WAL:
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
        # (see "Writes" in the module docstring); these are the ones not written yet.
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

    # ------------------------------------------------------------------ appending

    def append(self, payloads: Sequence) -> tuple[int, int]:
        """Append a batch (a list or tuple of bytes-like payloads) and return its
        ``(first_offset, last_offset)``. In ``interval`` and ``none`` modes it returns once
        the frames are in the page cache: that survives a process crash but not a machine
        crash until a sync covers it; in ``always`` mode the next sync writes them (see the
        module docstring). An empty batch returns ``(next_offset, next_offset - 1)``.

        Raises ``WALClosedError`` after close, ``WALFailedError`` after a failed sync,
        ValueError for a payload over MAX_PAYLOAD (nothing of the batch is written) and
        OSError when the disk is full (a prefix of a batch that spans several segments may
        then have been written: ``next_offset`` says how far).
        """
        if self._state != _OPEN or self._failed is not None:
            self._raise_unusable()
        seg = self._active
        first = self._next_offset
        total, fit, _ = measure_frames(payloads, seg.room)
        n = len(payloads)
        if n == 0:
            return first, first - 1
        max_age = self._config.max_age_seconds
        if fit < n or (max_age is not None and seg.count
                       and self._clock() - seg.created_at >= max_age):
            self._append_slow(payloads, first, n, total)
        else:
            self._queue(seg.write(payloads, first, n, total, self._deferred(total)))
            self._next_offset = first + n
        self._cache.extend(first, payloads)
        if self._kick_on_append:
            self._kick.set()
        if self._readers:
            self._wake_readers(None)
        return first, first + n - 1

    def append_packed(self, data: bytes, ends) -> tuple[int, int]:
        """``append`` for payloads packed back to back in ``data`` (bytes): payload ``i`` is
        ``data[ends[i - 1]:ends[i]]``, ``ends`` a uint64 array (``array('Q')``), as
        ``MessageBatchView.stamp`` makes them. No Python object per payload: the frames are
        written straight from ``data``, and the hot-tail cache keeps a reference to it."""
        if self._state != _OPEN or self._failed is not None:
            self._raise_unusable()
        n = len(ends)
        first = self._next_offset
        if n == 0:
            return first, first - 1
        seg = self._active
        total = _HEADER * n + ends[n - 1]
        max_age = self._config.max_age_seconds
        if total > seg.room or (max_age is not None and seg.count
                                and self._clock() - seg.created_at >= max_age):
            # Rotation: rare, so the payloads become a list for the general path.
            view = memoryview(data)
            starts = [0, *ends[:-1]]
            return self.append([view[a:b] for a, b in zip(starts, ends)])
        self._queue(seg.write_packed(data, ends, first, n, total, self._deferred(total)))
        self._next_offset = first + n
        self._cache.extend_packed(first, data, ends)
        if self._kick_on_append:
            self._kick.set()
        if self._readers:
            self._wake_readers(None)
        return first, first + n - 1

    def _write_pending_now(self) -> None:
        """Write every appended frame to its file now, on the loop (rotation, once per
        segment): a segment is sealed, and the next one created, only once the sealed one
        holds all its frames, so a process crash never leaves a gap between segments. Jobs
        writing some of them are waited for; what they wrote is not written twice."""
        running = [f for f in (self._inflight, self._writing and self._writing[0]) if f]
        if running:
            concurrent.futures.wait(running)
        write_pending(list(self._pending))
        self._unclaimed = 0

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

    def _append_slow(self, payloads, first: int, n: int, total: int) -> None:
        """Rotation: by age, or because the batch does not fit. A batch that fits in a segment
        goes whole into a fresh one; a bigger batch fills segments one after another, and a
        frame bigger than a segment gets a segment of its own size."""
        if self._active.count:
            self._rotate(first)
        if total <= self._active.room:
            self._queue(self._active.write(payloads, first, n, total, self._deferred(total)))
            self._next_offset = first + n
            return
        done = 0
        try:
            while done < n:
                rest = payloads[done:]
                _, k, _ = measure_frames(rest, self._active.room)
                chunk = rest[:max(k, 1)]
                size = measure_frames(chunk, 0)[0]
                self._queue(self._active.write(chunk, first + done, len(chunk), size,
                                               self._deferred(size)))
                done += len(chunk)
                self._next_offset = first + done
                if done < n:
                    self._rotate(first + done)
        finally:
            if done < n:        # a failure part way: keep the cache in line with the data
                self._cache.extend(first, payloads[:done])

    def _rotate(self, base: int) -> None:
        old = self._active
        if self._pending:
            self._write_pending_now()
        now = self._clock()
        cfg = self._config
        new = Segment.create(self._dir, base, size=min(cfg.segment_initial_bytes,
                                                       cfg.segment_max_bytes),
                             max_size=cfg.segment_max_bytes, created_at=now,
                             frames_hint=old.count)
        try:
            old.seal(now)
        except BaseException:
            new.unmap()
            os.close(new.fd)
            os.unlink(new.path)
            raise
        if not _LINUX:
            old.mm.flush()
        self._segments.append(new)
        self._bases.append(base)
        self._active = new
        self._retiring.append(old)
        self._touch(old)
        self._dir_dirty = self._ckpt_dirty = True
        self.rotation_count += 1
        self._kick.set()

    async def rotate(self) -> SegmentInfo | None:
        """Seal the active segment now if it holds data (e.g. before exporting it, or when
        an idle topic's segment should age out). Returns the sealed segment once its file is
        final (trimmed, synced unless the mode is ``none``, descriptor closed), or None if
        there was nothing to seal.

        The sync worker makes the rotation, between two syncs, after writing what is pending
        in the executor (see ``_rotate_for_waiters``): the event loop neither waits for a
        sync in flight nor copies the pending frames into the page cache."""
        self._check_usable()
        if not self._active.count:
            return None
        fut = self._loop.create_future()
        self._rotate_waiters.append(fut)
        self._kick.set()
        old = await fut
        if old is None:
            return None
        await self._settle_retiring()
        return old.info()

    async def _rotate_for_waiters(self) -> None:
        """In the sync worker, no sync job in flight: serve the ``rotate()`` calls. Appends
        still pending are written in the executor first (they are claimed, so no other job
        writes them), then ``_rotate`` runs on the loop with nothing left to wait for and
        only what was appended meanwhile to write."""
        waiters, self._rotate_waiters = self._rotate_waiters, []
        sealed = error = None
        try:
            if self._writing is not None:
                await asyncio.wait([self._writing[1]])
            self._check_usable()
            todo = self._claim_unwritten()
            if todo:
                try:
                    await asyncio.wrap_future(self._executor.submit(write_pending, todo))
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - as a failed write-ahead
                    self._fail(exc)
                    raise
            self._check_usable()
            if self._active.count:
                sealed = self._active
                self._rotate(self._next_offset)
        except asyncio.CancelledError:
            error = WALClosedError(f"WAL {self._dir} is closed")
            raise
        except BaseException as exc:  # noqa: BLE001 - reported to the callers
            error = exc
        finally:
            for fut in waiters:
                if not fut.done():
                    if error is None:
                        fut.set_result(sealed)
                    else:
                        fut.set_exception(error)

    # ------------------------------------------------------------------ durability

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

    # ------------------------------------------------------------------ reading

    def read(self, from_offset: int, max_messages: int = 1024,
             max_bytes: int | None = None) -> list[tuple[int, bytes]]:
        """Up to ``max_messages`` messages from ``from_offset`` on, as ``(offset, payload)``,
        stopping before the payload total would exceed ``max_bytes`` (the first message is
        returned whatever its size). Empty at the head of the log (see ``wait_for``).

        Served from the hot-tail cache when ``from_offset`` is recent, else from the
        segments. Raises ``OffsetTruncatedError`` below ``first_offset`` and
        ``CorruptSegmentError`` if a lazily validated sealed segment turns out damaged.
        """
        if self._state != _OPEN:
            raise WALClosedError(f"WAL {self._dir} is closed")
        if from_offset < self._first_offset:
            if from_offset < 0:
                raise ValueError(f"negative offset {from_offset}")
            raise OffsetTruncatedError(from_offset, self._first_offset)
        end = self._next_offset
        if from_offset >= end or max_messages <= 0:
            return []
        budget = -1 if max_bytes is None else max(0, max_bytes)
        if from_offset >= self._cache.first_offset:
            got = self._cache.read(from_offset, max_messages, budget)
            if got is not None:
                return got
        out: list = []
        i = bisect.bisect_right(self._bases, from_offset) - 1
        verify = self._config.verify_reads
        off = from_offset
        unwritten = self._pending[0].first_offset if self._pending else end
        while off < unwritten:
            seg = self._segments[i]
            if seg is not self._active:
                self._map(seg)
            nbytes = seg.read_into(out, off, max_messages - len(out), budget, verify)
            off = from_offset + len(out)
            if len(out) >= max_messages or off >= end:
                return out
            if off < min(seg.end_offset, unwritten):
                return out                          # stopped by the byte budget
            if budget >= 0:
                budget -= nbytes
                if budget <= 0:
                    return out
            if off >= seg.end_offset:
                i += 1
        # The rest is appended but not written to the files yet: read it from the buffers.
        for pending in self._pending:
            if off >= pending.first_offset + pending.count:
                continue
            seg = pending.seg
            pos = int(seg.index[off - seg.base]) - pending.pos
            nbytes = read_frames_into(out, pending.buf, pos, pending.nbytes, off,
                                      max_messages - len(out), budget, verify)
            off = from_offset + len(out)
            if len(out) >= max_messages or off < pending.first_offset + pending.count:
                break
            if budget >= 0:
                budget -= nbytes
                if budget <= 0:
                    break
        return out

    async def wait_for(self, offset: int) -> int:
        """Wait until ``offset`` has been appended (a reader that caught up calls this with
        its next offset); returns ``last_offset``. Raises ``WALClosedError`` on close."""
        while self._next_offset <= offset:
            self._check_usable()
            fut = asyncio.get_running_loop().create_future()
            self._readers.append(fut)
            await fut
        return self._next_offset - 1

    def _wake_readers(self, exc: BaseException | None) -> None:
        readers, self._readers = self._readers, []
        for fut in readers:
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)

    def _map(self, seg: Segment) -> None:
        if seg.mm is None or not seg.validated:
            seg.ensure_validated()
        self._touch(seg)

    def _touch(self, seg: Segment) -> None:
        """Mark a sealed segment's mapping as just used; unmap the least recently used ones
        beyond ``max_mapped_sealed`` (never ``seg`` itself)."""
        self._mapped[seg] = None
        self._mapped.move_to_end(seg)
        while len(self._mapped) > max(1, self._config.max_mapped_sealed):
            old, _ = self._mapped.popitem(last=False)
            old.unmap()

    # ------------------------------------------------------------------ retention

    async def truncate_before(self, offset: int) -> list[SegmentInfo]:
        """Delete the sealed segments whose every offset is below ``offset`` (never the
        active segment); returns what was deleted, oldest first."""
        self._check_usable()
        await self._settle_retiring()
        victims = []
        for seg in self._segments[:-1]:
            if seg.last_offset >= offset or seg.fd is not None:
                break
            victims.append(seg)
        return await self._delete(victims)

    async def retention(self, max_age_seconds: float | None = None,
                        max_bytes: int | None = None, keep_from_offset: int | None = None,
                        *, force: bool = False) -> list[SegmentInfo]:
        """Delete the oldest sealed segments while the log breaks a limit: sealed longer
        than ``max_age_seconds`` ago, or all segments together larger than ``max_bytes``.

        Never deletes the active segment, and never a segment holding an offset at or after
        ``keep_from_offset`` (the slowest subscription's next offset) unless ``force``.
        Segments go oldest first, so the log stays contiguous. Returns what was deleted.
        """
        self._check_usable()
        await self._settle_retiring()
        now = self._clock()
        total = sum(s.write_pos for s in self._segments)
        victims = []
        for seg in self._segments[:-1]:
            too_old = max_age_seconds is not None and now - seg.sealed_at > max_age_seconds
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big) or seg.fd is not None:
                break
            if not force and keep_from_offset is not None and seg.last_offset >= keep_from_offset:
                break
            victims.append(seg)
            total -= seg.write_pos
        return await self._delete(victims)

    async def _settle_retiring(self) -> None:
        """Wait for the worker to sync (as the mode says) and close the descriptors of
        just-sealed segments."""
        while (self._state == _OPEN and self._failed is None
               and any(s.fd is not None for s in self._segments[:-1])):
            fut = asyncio.get_running_loop().create_future()
            self._pass_waiters.append(fut)
            self._kick.set()
            await fut

    async def _delete(self, victims: list[Segment]) -> list[SegmentInfo]:
        if not victims:
            return []
        infos = [s.info() for s in victims]
        n = len(victims)
        del self._segments[:n]
        del self._bases[:n]
        self._first_offset = self._segments[0].base
        for seg in victims:
            self._mapped.pop(seg, None)
            seg.unmap()
            if seg in self._unsynced_sealed:
                self._unsynced_sealed.remove(seg)
        paths = [s.path for s in victims]
        self._ckpt_dirty = True
        try:
            await asyncio.wrap_future(self._executor.submit(_unlink_all, self._dir, paths))
        finally:
            self._kick.set()        # write the checkpoint
        log.info("WAL %s: deleted %d segment(s), offsets %d..%d", self._dir, n,
                 infos[0].first_offset, infos[-1].last_offset)
        return infos

    # ------------------------------------------------------------------ the sync worker

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


def _unlink_all(directory: str, paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    fsync_dir(directory)


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

