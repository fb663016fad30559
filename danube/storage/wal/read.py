"""Reading the WAL: the hot-tail cache, the segments' mappings, and frames appended but not
written yet (pending buffers, in mode ``always``). Readers see data as soon as it is
appended; one that must not see what a machine crash could take back bounds its reads by
``durable_offset``.
"""

from __future__ import annotations

import asyncio
import bisect

from danube.storage._walframes import read_frames_into
from danube.storage.errors import OffsetTruncatedError, WALClosedError
from danube.storage.segment import Segment
from danube.storage.wal.state import OPEN as _OPEN


class _Reading:
    """The ``WAL``'s reads (a mixin of ``WAL``, see log.py)."""

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
