"""Reading the WAL: the hot-tail cache, the segments' mappings, and frames appended but not
written yet (pending buffers, in mode ``always``). Readers see data as soon as it is
appended; one that must not see what a machine crash could take back bounds its reads by
``durable_offset``.

``Reader`` owns the readers waiting at the head of the log and the mappings of sealed
segments kept open (least recently used first).
"""

from __future__ import annotations

import asyncio
import bisect
import collections

from danube.storage._walframes import read_frames_into
from danube.storage.errors import OffsetTruncatedError, WALClosedError
from danube.storage.segment import Segment
from danube.storage.wal.state import OPEN, WalState


class Reader:
    """The WAL's reads and the readers waiting for appends."""

    def __init__(self, state: WalState):
        self._s = state
        self._verify = state.config.verify_reads
        self._max_mapped = max(1, state.config.max_mapped_sealed)
        #: Futures of ``wait_for`` calls, woken by the next append (or close).
        self.waiting: list[asyncio.Future] = []
        self._mapped: collections.OrderedDict[Segment, None] = collections.OrderedDict()
        for seg in state.segments[:-1]:
            if seg.mm is not None:
                self.touch(seg)

    def read(self, from_offset: int, max_messages: int = 1024,
             max_bytes: int | None = None) -> list[tuple[int, bytes]]:
        """Up to ``max_messages`` messages from ``from_offset`` on, as ``(offset, payload)``,
        stopping before the payload total would exceed ``max_bytes`` (the first message is
        returned whatever its size). Empty at the head of the log (see ``wait_for``).

        Served from the hot-tail cache when ``from_offset`` is recent, else from the
        segments. Raises ``OffsetTruncatedError`` below ``first_offset`` and
        ``CorruptSegmentError`` if a lazily validated sealed segment turns out damaged.
        """
        s = self._s
        if s.status != OPEN:
            raise WALClosedError(f"WAL {s.directory} is closed")
        if from_offset < s.first_offset:
            if from_offset < 0:
                raise ValueError(f"negative offset {from_offset}")
            raise OffsetTruncatedError(from_offset, s.first_offset)
        end = s.next_offset
        if from_offset >= end or max_messages <= 0:
            return []
        budget = -1 if max_bytes is None else max(0, max_bytes)
        cache = s.cache
        if from_offset >= cache.first_offset:
            got = cache.read(from_offset, max_messages, budget)
            if got is not None:
                return got
        out: list = []
        i = bisect.bisect_right(s.bases, from_offset) - 1
        verify = self._verify
        off = from_offset
        pending_writes = s.pending
        unwritten = pending_writes[0].first_offset if pending_writes else end
        segments, active = s.segments, s.active
        while off < unwritten:
            seg = segments[i]
            if seg is not active:
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
        for pending in pending_writes:
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
        s = self._s
        while s.next_offset <= offset:
            s.check_usable()
            fut = asyncio.get_running_loop().create_future()
            self.waiting.append(fut)
            await fut
        return s.next_offset - 1

    def wake(self, exc: BaseException | None) -> None:
        """Wake every ``wait_for`` caller: with ``exc`` raised in it, or to read again."""
        readers, self.waiting = self.waiting, []
        for fut in readers:
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)

    def _map(self, seg: Segment) -> None:
        if seg.mm is None or not seg.validated:
            seg.ensure_validated()
        self.touch(seg)

    def touch(self, seg: Segment) -> None:
        """Mark a sealed segment's mapping as just used; unmap the least recently used ones
        beyond ``max_mapped_sealed`` (never ``seg`` itself)."""
        self._mapped[seg] = None
        self._mapped.move_to_end(seg)
        while len(self._mapped) > self._max_mapped:
            old, _ = self._mapped.popitem(last=False)
            old.unmap()

    def forget(self, seg: Segment) -> None:
        """Unmap a segment that is being deleted."""
        self._mapped.pop(seg, None)
        seg.unmap()

    def release(self, exc: BaseException) -> None:
        """Closing: fail every waiting reader with ``exc``; the mappings go with the
        segments (``WalState.close_segments``)."""
        self.wake(exc)
        self._mapped.clear()
