"""WAL retention: deleting the oldest sealed segments, by offset or by age and size.

Segments go oldest first, so the log stays contiguous; the active segment is never deleted,
nor a sealed one whose descriptor the sync worker has not closed yet.
"""

from __future__ import annotations

import asyncio
import logging
import os

from danube.storage.checkpoint import fsync_dir
from danube.storage.segment import Segment, SegmentInfo
from danube.storage.wal.state import OPEN as _OPEN

log = logging.getLogger("danube.storage.wal")


class _Retention:
    """The ``WAL``'s retention (a mixin of ``WAL``, see log.py)."""

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
        self.deleted_segments += n
        try:
            await asyncio.wrap_future(self._executor.submit(_unlink_all, self._dir, paths))
        finally:
            self._kick.set()        # write the checkpoint
        log.info("WAL %s: deleted %d segment(s), offsets %d..%d", self._dir, n,
                 infos[0].first_offset, infos[-1].last_offset)
        return infos


def _unlink_all(directory: str, paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    fsync_dir(directory)
