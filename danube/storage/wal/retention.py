"""WAL retention: deleting the oldest sealed segments, by offset or by age and size.

Segments go oldest first, so the log stays contiguous; the active segment is never deleted,
nor a sealed one whose descriptor the sync worker has not closed yet. ``Retention`` removes
them from the shared state, has the reader drop their mappings and the sync worker forget
them, then unlinks the files in the executor.
"""

from __future__ import annotations

import asyncio
import logging
import os

from danube.storage.checkpoint import fsync_dir
from danube.storage.segment import Segment, SegmentInfo
from danube.storage.wal.group_commit import GroupCommit
from danube.storage.wal.read import Reader
from danube.storage.wal.state import WalState

log = logging.getLogger("danube.storage.wal")


class Retention:
    """The WAL's retention: deletes sealed segments, oldest first."""

    def __init__(self, state: WalState, reader: Reader, commit: GroupCommit):
        self._s = state
        self._reader = reader
        self._commit = commit
        #: Segments deleted so far (upstream's danube_wal_* metrics).
        self.deleted_segments = 0

    async def truncate_before(self, offset: int) -> list[SegmentInfo]:
        """Delete the sealed segments whose every offset is below ``offset`` (never the
        active segment); returns what was deleted, oldest first."""
        self._s.check_usable()
        await self._commit.settle_retiring()
        victims = []
        for seg in self._s.segments[:-1]:
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
        self._s.check_usable()
        await self._commit.settle_retiring()
        now = self._s.clock()
        total = sum(s.write_pos for s in self._s.segments)
        victims = []
        for seg in self._s.segments[:-1]:
            too_old = max_age_seconds is not None and now - seg.sealed_at > max_age_seconds
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big) or seg.fd is not None:
                break
            if not force and keep_from_offset is not None and seg.last_offset >= keep_from_offset:
                break
            victims.append(seg)
            total -= seg.write_pos
        return await self._delete(victims)

    async def _delete(self, victims: list[Segment]) -> list[SegmentInfo]:
        if not victims:
            return []
        infos = [s.info() for s in victims]
        n = len(victims)
        s = self._s
        del s.segments[:n]
        del s.bases[:n]
        s.first_offset = s.segments[0].base
        for seg in victims:
            self._reader.forget(seg)
            self._commit.forget_sealed(seg)
        paths = [seg.path for seg in victims]
        self._commit.checkpoint_soon()
        self.deleted_segments += n
        try:
            await asyncio.wrap_future(s.executor.submit(_unlink_all, s.directory, paths))
        finally:
            s.kick.set()        # write the checkpoint
        log.info("WAL %s: deleted %d segment(s), offsets %d..%d", s.directory, n,
                 infos[0].first_offset, infos[-1].last_offset)
        return infos


def _unlink_all(directory: str, paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    fsync_dir(directory)
