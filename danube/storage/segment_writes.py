"""Frames on their way to a segment file: the reusable buffers they are framed into, the
``pwrite`` that writes them, and the writes deferred to the WAL's sync job (``PendingWrite``,
``write_pending``)."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.storage.segment import Segment


_SCRATCH_KEEP = 8 << 20         # a frame buffer up to this size is kept for the next append
_scratch = threading.local()    # appends run on an event loop's thread


def frame_buffer(size: int) -> bytearray:
    """A buffer of at least ``size`` bytes for frames on their way to a ``pwrite``: one per
    thread, reused, so a batch costs no allocation (and no page faults on a fresh one)."""
    buf = getattr(_scratch, "buf", None)
    if buf is not None and len(buf) >= size:
        return buf
    buf = bytearray(max(size, 2 * len(buf) if buf is not None else 1 << 16))
    if len(buf) <= _SCRATCH_KEEP:
        _scratch.buf = buf
    return buf


_pool = threading.local()      # free buffers of deferred writes (taken and given back on a loop)
_POOL_MAX = 16


_POOL_MIN = 1 << 16             # smaller buffers are plain allocations, not pooled


def _take_buffer(size: int) -> bytearray:
    if size < _POOL_MIN:
        return bytearray(size)
    free = getattr(_pool, "free", None)
    if free:
        for i in range(len(free) - 1, -1, -1):
            if len(free[i]) >= size:
                return free.pop(i)
    return bytearray(size)


def _give_back(buf: bytearray) -> None:
    if len(buf) < _POOL_MIN or len(buf) > _SCRATCH_KEEP:
        return
    free = getattr(_pool, "free", None)
    if free is None:
        free = _pool.free = []
    if len(free) < _POOL_MAX:
        free.append(buf)


@dataclasses.dataclass(slots=True, eq=False)
class PendingWrite:
    """Frames appended to a segment (and to its index) but not yet written to its file: the
    WAL's sync job writes them, in order, just before its fdatasync (``always`` mode, see
    wal.py). ``buf[:nbytes]`` goes at file position ``pos``."""
    seg: Segment
    pos: int
    buf: bytearray
    nbytes: int
    first_offset: int
    count: int
    written: bool = False       # in the file (set by whichever thread wrote it)
    claimed: bool = False       # taken by a write job (the WAL's write-ahead)

    def done(self) -> None:
        """The write completed (called on the loop): the file holds the frames now."""
        self.seg.unwritten -= self.nbytes
        _give_back(self.buf)
        self.buf = None


def write_pending(writes: list[PendingWrite]) -> None:
    """Write PendingWrites in order (in a worker thread), those not written yet: one pwritev
    per run of writes that follow each other in a segment."""
    writes = [w for w in writes if not w.written]
    i, n = 0, len(writes)
    while i < n:
        first = writes[i]
        j, end = i + 1, first.pos + first.nbytes
        while (j < n and j - i < 512 and writes[j].seg is first.seg
               and writes[j].pos == end):
            end += writes[j].nbytes
            j += 1
        if j == i + 1:
            pwrite_all(first.seg.fd, first.buf, first.nbytes, first.pos)
        else:
            views = [memoryview(w.buf)[:w.nbytes] for w in writes[i:j]]
            try:
                done = os.pwritev(first.seg.fd, views, first.pos)
                for w in writes[i:j]:          # finish a short write one buffer at a time
                    if done < w.nbytes:
                        pwrite_all(w.seg.fd, memoryview(w.buf)[done:w.nbytes],
                                   w.nbytes - done, w.pos + done)
                    done = max(0, done - w.nbytes)
            finally:
                for v in views:
                    v.release()
        for w in writes[i:j]:
            w.written = True
        i = j


def pwrite_all(fd: int, buf, n: int, pos: int) -> None:
    """Write ``buf[:n]`` at file position ``pos`` (looping over short writes)."""
    with memoryview(buf) as view:
        done = 0
        while done < n:
            wrote = os.pwrite(fd, view[done:n], pos + done)
            if wrote <= 0:
                raise OSError(errno.EIO, f"pwrite wrote {wrote} of {n - done} bytes")
            done += wrote
