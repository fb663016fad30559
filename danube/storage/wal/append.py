"""Appending to the WAL, and rotating its active segment.

``append`` frames a batch in C (``danube.storage._walframes``, no Python per message) into
the active segment, at once or, in mode ``always``, into a pending buffer the sync job writes (see
"Writes" in the package docstring). A batch that does not fit, or an active segment older
than ``max_age_seconds``, seals the segment and continues in a new one. ``Appender`` owns
the rotation counters; it hands pending writes and sealed segments to the sync worker
(``GroupCommit``) and wakes waiting readers (``Reader``) through their public methods, which
it binds once at construction so an append pays no lookup for them.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from danube.storage._walframes import HEADER_SIZE as _HEADER, measure_frames
from danube.storage.exhaustion import STATE as EXHAUSTION, exhausted
from danube.storage.segment import Segment, SegmentInfo
from danube.storage.wal.config import ALWAYS
from danube.storage.wal.group_commit import GroupCommit
from danube.storage.wal.read import Reader
from danube.storage.wal.state import OPEN, WalState

_LINUX = sys.platform.startswith("linux")


class Appender:
    """The WAL's appends and rotations."""

    def __init__(self, state: WalState, reader: Reader, commit: GroupCommit):
        self._s = state
        self._reader = reader
        self._commit = commit
        config = state.config
        self._max_age = config.max_age_seconds
        self._initial_bytes = min(config.segment_initial_bytes, config.segment_max_bytes)
        self._max_bytes = config.segment_max_bytes
        self._cache = state.cache
        self._kick = state.kick
        self._always = state.mode == ALWAYS
        # In mode always the sync worker syncs what is appended; with the journal, the
        # journal does (each append was handed to it by ``queue``).
        self._kick_worker = self._always and state.journal is None
        # the two calls every append makes, bound once
        self._queue = commit.queue
        self._deferred = commit.deferred
        #: An append was refused for lack of space or descriptors (see ``_refusal``).
        self._refused = False
        #: Segment rotations, in all and by reason (upstream's danube_wal_* metrics).
        self.rotation_count = 0
        self.rotations = {"size": 0, "time": 0, "export": 0}

    def append(self, payloads: Sequence) -> tuple[int, int]:
        """Append a batch (a list or tuple of bytes-like payloads) and return its
        ``(first_offset, last_offset)``. In ``interval`` and ``none`` modes it returns once
        the frames are in the page cache: that survives a process crash but not a machine
        crash until a sync covers it; in ``always`` mode the next sync writes them (see the
        package docstring). An empty batch returns ``(next_offset, next_offset - 1)``.

        Raises ``WALClosedError`` after close, ``WALFailedError`` after a failed sync,
        ValueError for a payload over MAX_PAYLOAD (nothing of the batch is written),
        ``DiskFullError`` when the volume is full and ``DescriptorLimitError`` when no
        file can be opened for a new segment (nothing of the batch is written, except that
        a prefix of a batch spanning several segments may be: ``next_offset`` says how far;
        the WAL stays usable, the next append tries again) and OSError for other failures
        of the file.
        """
        s = self._s
        if s.status != OPEN or s.failed is not None:
            s.raise_unusable()
        seg = s.active
        first = s.next_offset
        total, fit, _ = measure_frames(payloads, seg.room)
        n = len(payloads)
        if n == 0:
            return first, first - 1
        max_age = self._max_age
        try:
            if fit < n or (max_age is not None and seg.count
                           and s.clock() - seg.created_at >= max_age):
                self._append_slow(payloads, first, n, total)
            else:
                self._queue(seg.write(payloads, first, n, total, self._deferred(total)))
                s.next_offset = first + n
        except OSError as exc:
            err = self._refusal(exc, total)
            if err is None:
                raise
            raise err from exc
        if self._refused:
            self._space_back()
        self._cache.extend(first, payloads)
        if self._kick_worker:
            self._kick.set()
        if self._reader.waiting:
            self._reader.wake(None)
        return first, first + n - 1

    def append_packed(self, data: bytes, ends) -> tuple[int, int]:
        """``append`` for payloads packed back to back in ``data`` (bytes): payload ``i`` is
        ``data[ends[i - 1]:ends[i]]``, ``ends`` a uint64 array (``array('Q')``), as
        ``MessageBatchView.stamp`` makes them. No Python object per payload: the frames are
        written straight from ``data``, and the hot-tail cache keeps a reference to it."""
        s = self._s
        if s.status != OPEN or s.failed is not None:
            s.raise_unusable()
        n = len(ends)
        first = s.next_offset
        if n == 0:
            return first, first - 1
        seg = s.active
        total = _HEADER * n + ends[n - 1]
        max_age = self._max_age
        if total > seg.room or (max_age is not None and seg.count
                                and s.clock() - seg.created_at >= max_age):
            # Rotation: rare, so the payloads become a list for the general path.
            view = memoryview(data)
            starts = [0, *ends[:-1]]
            return self.append([view[a:b] for a, b in zip(starts, ends)])
        try:
            self._queue(seg.write_packed(data, ends, first, n, total, self._deferred(total)))
        except OSError as exc:
            err = self._refusal(exc, total)
            if err is None:
                raise
            raise err from exc
        if self._refused:
            self._space_back()
        s.next_offset = first + n
        self._cache.extend_packed(first, data, ends)
        if self._kick_worker:
            self._kick.set()
        if self._reader.waiting:
            self._reader.wake(None)
        return first, first + n - 1

    async def append_durable(self, payloads: Sequence) -> tuple[int, int]:
        """``append``, then in ``always`` mode wait for a sync covering the batch (shared
        with concurrent callers). In ``interval`` and ``none`` modes it returns after the
        write, like ``append``."""
        first, last = self.append(payloads)
        if self._always and last >= first and last > self._s.durable:
            await self._commit.sync_to(last)
        return first, last

    def _append_slow(self, payloads, first: int, n: int, total: int) -> None:
        """Rotation: by age, or because the batch does not fit. A batch that fits in a segment
        goes whole into a fresh one; a bigger batch fills segments one after another, and a
        frame bigger than a segment gets a segment of its own size."""
        s = self._s
        if s.active.count:
            self._rotate(first, "time" if total <= s.active.room else "size")
        if total <= s.active.room:
            self._queue(s.active.write(payloads, first, n, total, self._deferred(total)))
            s.next_offset = first + n
            return
        done = 0
        try:
            while done < n:
                rest = payloads[done:]
                _, k, _ = measure_frames(rest, s.active.room)
                chunk = rest[:max(k, 1)]
                size = measure_frames(chunk, 0)[0]
                self._queue(s.active.write(chunk, first + done, len(chunk), size,
                                           self._deferred(size)))
                done += len(chunk)
                s.next_offset = first + done
                if done < n:
                    self._rotate(first + done, "size")
        finally:
            if done < n:        # a failure part way: keep the cache in line with the data
                self._cache.extend(first, payloads[:done])

    def _refusal(self, exc: OSError, total: int):
        """The ``StorageExhaustedError`` an append that failed with ``exc`` raises for a
        full disk or the descriptor limit, else None (``exc`` goes on). Nothing is torn:
        the frames are written only after the room for them is allocated (``Segment.write``
        grows the file first, a rotation creates the next segment whole or removes it), and
        the offsets and the index move only after the write."""
        s = self._s
        seg = s.active
        needed = max(total, min(self._max_bytes, 2 * seg.size) - seg.size)
        err = exhausted(exc, s.directory, "append to the WAL", needed)
        if err is not None:
            self._refused = True
        return err

    def _space_back(self) -> None:
        self._refused = False
        EXHAUSTION.space_back()

    def _rotate(self, base: int, reason: str = "export") -> None:
        s = self._s
        old = s.active
        if s.pending:
            self._commit.write_all_pending()
        now = s.clock()
        new = Segment.create(s.directory, base, size=self._initial_bytes,
                             max_size=self._max_bytes, created_at=now,
                             frames_hint=old.count)
        try:
            old.seal(now)
        except BaseException:
            new.unmap()
            os.close(new.fd)
            os.unlink(new.path)
            raise
        if not _LINUX and old.mm is not None:
            old.mm.flush()
        s.segments.append(new)
        s.bases.append(base)
        s.active = new
        self._reader.touch(old)
        self._commit.retire(old, new)
        self.rotation_count += 1
        self.rotations[reason] += 1

    def _seal_active(self) -> Segment | None:
        """For ``rotate()``, in the sync worker: seal the active segment if it holds data,
        and return it."""
        s = self._s
        if not s.active.count:
            return None
        sealed = s.active
        self._rotate(s.next_offset)
        return sealed

    async def rotate(self) -> SegmentInfo | None:
        """Seal the active segment now if it holds data (e.g. before exporting it, or when
        an idle topic's segment should age out). Returns the sealed segment once its file is
        final (trimmed, synced unless the mode is ``none``, descriptor closed), or None if
        there was nothing to seal.

        The sync worker makes the rotation, between two syncs, after writing what is pending
        in the executor (see ``GroupCommit.rotate_between_syncs``): the event loop neither
        waits for a sync in flight nor copies the pending frames into the page cache."""
        self._s.check_usable()
        if not self._s.active.count:
            return None
        old = await self._commit.rotate_between_syncs(self._seal_active)
        if old is None:
            return None
        await self._commit.settle_retiring()
        return old.info()
