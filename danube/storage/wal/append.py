"""Appending to the WAL, and rotating its active segment.

``append`` frames a batch in C (``danube.storage._walframes``, no Python per message) into
the active segment, at once or, in mode ``always``, into a pending buffer the sync job writes (see
"Writes" in the package docstring). A batch that does not fit, or an active segment older
than ``max_age_seconds``, seals the segment and continues in a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
from typing import Sequence

from danube.storage._walframes import HEADER_SIZE as _HEADER, measure_frames
from danube.storage.errors import WALClosedError
from danube.storage.segment import Segment, SegmentInfo
from danube.storage.segment_writes import write_pending
from danube.storage.wal.state import OPEN as _OPEN

_LINUX = sys.platform.startswith("linux")


class _Appending:
    """The ``WAL``'s appends and rotations (a mixin of ``WAL``, see log.py)."""

    def append(self, payloads: Sequence) -> tuple[int, int]:
        """Append a batch (a list or tuple of bytes-like payloads) and return its
        ``(first_offset, last_offset)``. In ``interval`` and ``none`` modes it returns once
        the frames are in the page cache: that survives a process crash but not a machine
        crash until a sync covers it; in ``always`` mode the next sync writes them (see the
        package docstring). An empty batch returns ``(next_offset, next_offset - 1)``.

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

    def _append_slow(self, payloads, first: int, n: int, total: int) -> None:
        """Rotation: by age, or because the batch does not fit. A batch that fits in a segment
        goes whole into a fresh one; a bigger batch fills segments one after another, and a
        frame bigger than a segment gets a segment of its own size."""
        if self._active.count:
            self._rotate(first, "time" if total <= self._active.room else "size")
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
                    self._rotate(first + done, "size")
        finally:
            if done < n:        # a failure part way: keep the cache in line with the data
                self._cache.extend(first, payloads[:done])

    def _rotate(self, base: int, reason: str = "export") -> None:
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
        self.rotations[reason] += 1
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
