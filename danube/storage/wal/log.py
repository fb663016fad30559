"""The ``WAL`` class: one topic's write-ahead log (see the package docstring for what it
promises). It is a facade over composed parts, each given what it needs at construction:
the shared state (``WalState``: segments, offsets, pending writes, lifecycle; state.py),
appends and rotation (``Appender``, append.py), reads (``Reader``, read.py), the sync worker
(``GroupCommit``, group_commit.py) and retention (``Retention``, retention.py). ``WAL``
itself opens (recovery) and closes; everything else is a one-statement delegation, and the
hot calls (append, append_packed, sync_to, read) are the parts' bound methods, set on the
instance at construction, so the publish path pays no extra call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from typing import Callable, Sequence

from danube.metering import Summary
from danube.storage.checkpoint import write_checkpoint
from danube.storage.errors import WALClosedError
from danube.storage.recovery import RecoveryReport, recover, release
from danube.storage.segment import SegmentInfo
from danube.storage.wal.append import Appender
from danube.storage.wal.config import WALConfig
from danube.storage.wal.group_commit import GroupCommit, close_active
from danube.storage.wal.read import Reader
from danube.storage.wal.retention import Retention
from danube.storage.wal.state import CLOSED, CLOSING, OPEN, WalState

log = logging.getLogger("danube.storage.wal")


class WAL:
    """A topic's write-ahead log. Create it with ``await WAL.open(directory, config)``."""

    def __init__(self, directory: str, config: WALConfig, recovered, executor, own_executor,
                 clock):
        self._own_executor = own_executor
        self._lock_fd = recovered.lock_fd
        self._close_done: asyncio.Future | None = None
        self._state = state = WalState(directory, config, recovered.segments, executor, clock)
        self._reader = Reader(state)
        self._commit = GroupCommit(state)
        self._appender = Appender(state, self._reader, self._commit)
        self._retention = Retention(state, self._reader, self._commit)
        self.recovery: RecoveryReport = recovered.report
        # The hot calls, bound once: an instance attribute shadows the class's delegation.
        self.append = self._appender.append
        self.append_packed = self._appender.append_packed
        self.sync_to = self._commit.sync_to
        self.read = self._reader.read
        self._commit.start()

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
        journal = config.journal_in_use
        if journal is not None:
            journal.claim(directory)        # instead of the directory's lock file
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
            if journal is not None:
                journal.unclaim(directory)
            raise
        wal = cls(directory, config, recovered, executor, own, clock)
        if recovered.report.dropped_bytes or recovered.report.segments:
            log.debug("WAL %s opened: %s", directory, recovered.report)
        return wal

    # ------------------------------------------------------------------ delegations

    def append(self, payloads: Sequence) -> tuple[int, int]:
        """See ``Appender.append`` (bound on the instance at construction)."""
        return self._appender.append(payloads)

    def append_packed(self, data: bytes, ends) -> tuple[int, int]:
        """See ``Appender.append_packed`` (bound on the instance at construction)."""
        return self._appender.append_packed(data, ends)

    async def append_durable(self, payloads: Sequence) -> tuple[int, int]:
        """See ``Appender.append_durable``."""
        return await self._appender.append_durable(payloads)

    async def rotate(self) -> SegmentInfo | None:
        """See ``Appender.rotate``."""
        return await self._appender.rotate()

    async def sync_to(self, offset: int | None = None) -> int:
        """See ``GroupCommit.sync_to`` (bound on the instance at construction)."""
        return await self._commit.sync_to(offset)

    def read(self, from_offset: int, max_messages: int = 1024,
             max_bytes: int | None = None) -> list[tuple[int, bytes]]:
        """See ``Reader.read`` (bound on the instance at construction)."""
        return self._reader.read(from_offset, max_messages, max_bytes)

    async def wait_for(self, offset: int) -> int:
        """See ``Reader.wait_for``."""
        return await self._reader.wait_for(offset)

    async def truncate_before(self, offset: int) -> list[SegmentInfo]:
        """See ``Retention.truncate_before``."""
        return await self._retention.truncate_before(offset)

    async def retention(self, max_age_seconds: float | None = None,
                        max_bytes: int | None = None, keep_from_offset: int | None = None,
                        *, force: bool = False) -> list[SegmentInfo]:
        """See ``Retention.retention``."""
        return await self._retention.retention(max_age_seconds, max_bytes, keep_from_offset,
                                               force=force)

    # ------------------------------------------------------------------ properties

    @property
    def mode(self) -> str:
        """The durability mode: ALWAYS, INTERVAL or NONE."""
        return self._state.mode

    @property
    def directory(self) -> str:
        return self._state.directory

    @property
    def config(self) -> WALConfig:
        return self._state.config

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets."""
        return self._state.next_offset

    @property
    def last_offset(self) -> int:
        """The newest appended offset (``next_offset - 1``; -1 before any message)."""
        return self._state.next_offset - 1

    @property
    def first_offset(self) -> int:
        """The oldest offset still held (== next_offset when the log holds nothing)."""
        return self._state.first_offset

    @property
    def durable_offset(self) -> int:
        """The newest offset covered by a completed sync (everything recovered at open
        counts: open syncs it)."""
        return self._state.durable

    @property
    def closed(self) -> bool:
        return self._state.status != OPEN

    def segments(self) -> list[SegmentInfo]:
        """Every segment, oldest first; the last one is the active segment."""
        return [s.info() for s in self._state.segments]

    @property
    def on_sync(self) -> Callable[[int], None] | None:
        """Called on the loop with the covered offset after every completed sync (tests)."""
        return self._commit.on_sync

    @on_sync.setter
    def on_sync(self, callback: Callable[[int], None] | None) -> None:
        self._commit.on_sync = callback

    @property
    def sync_count(self) -> int:
        """Completed syncs (groups)."""
        return self._commit.sync_count

    @property
    def fdatasync_count(self) -> int:
        return self._commit.fdatasync_count

    @property
    def flush_latency_ms(self) -> Summary:
        """Flush passes (a pass that wrote or synced) and their wall time (upstream's
        danube_wal_flush_* metrics)."""
        return self._commit.flush_latency_ms

    @property
    def rotation_count(self) -> int:
        return self._appender.rotation_count

    @property
    def rotations(self) -> dict[str, int]:
        """Segment rotations by reason: size, time, export."""
        return self._appender.rotations

    @property
    def deleted_segments(self) -> int:
        """Segments deleted by retention."""
        return self._retention.deleted_segments

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Sync everything, write the checkpoint, trim the active segment to its data, unmap
        and close every file, stop the worker and (if the WAL made it) the executor.
        Idempotent; concurrent callers all wait for the same close."""
        state = self._state
        if state.status == CLOSED:
            return
        if self._close_done is not None:
            await asyncio.shield(self._close_done)
            return
        self._close_done = state.loop.create_future()
        state.status = CLOSING
        self._reader.wake(WALClosedError(f"WAL {state.directory} is closed"))
        try:
            await self._commit.stop()       # the worker runs a last sync + checkpoint
            active = state.active
            active.unmap()
            if state.journal is not None:
                # The journal holds what the segment may not (until its trim syncs the file
                # system): nothing to sync or trim here, and the checkpoint only if the
                # segments changed since the last one (recovery reads offsets from the
                # files, and a zero tail after the last frame is what it expects). A
                # broker with 100,000 topics stops without 100,000 trips to a thread.
                active.close_fd()
                final = self._commit.final_checkpoint(only_if_changed=True)
                if final is not None:
                    await asyncio.wrap_future(state.executor.submit(
                        write_checkpoint, state.directory, final, False))
            else:
                final = self._commit.final_checkpoint()
                fd, active.fd = active.fd, None     # the job below closes it
                await asyncio.wrap_future(state.executor.submit(
                    close_active, state.directory, fd, active.write_pos, final))
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("WAL %s: error while closing", state.directory)
            raise
        finally:
            self._release()
            state.status = CLOSED
            if not self._close_done.done():
                self._close_done.set_result(None)

    def _release(self) -> None:
        """Free everything left, synchronously (also on a cancelled close)."""
        state = self._state
        err = WALClosedError(f"WAL {state.directory} is closed")
        self._commit.release(err)
        self._reader.release(err)
        state.close_segments()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if state.journal is not None:
            state.journal.unclaim(state.directory)
        if self._own_executor:
            state.executor.shutdown(wait=False)

    async def __aenter__(self) -> WAL:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        s = self._state
        return (f"<WAL {s.directory} {s.mode} offsets {s.first_offset}.."
                f"{s.next_offset - 1} durable {s.durable} "
                f"segments {len(s.segments)}{' closed' if self.closed else ''}>")
