"""One WAL segment file: a run of frames with consecutive offsets, mapped for reading.

A segment is named after its first offset (``wal.{first_offset:020d}.log``), so a sorted
directory listing is the log in order and the file holding an offset is found by bisection on
the names. Frames inside a segment carry consecutive offsets (``scan_frames`` rejects a gap),
so the in-memory index is just the header position of every frame in a uint64 array,
and offset ``o`` lives at ``index[o - first_offset]``.

The active segment is preallocated (``posix_fallocate``, so a full disk is an OSError when the
segment grows rather than part way through a batch, and readers of the mapping never touch a hole)
in chunks that double up to ``max_size``, and mapped ``MAP_SHARED`` on its first read. Appends are
framed in C (``encode_frames_indexed`` / ``encode_frames_packed``) into a reusable buffer and written with
one ``pwrite`` per batch; the mapping sees the data at once (both are the page cache). Sealing
shrinks the mapping and the file to the data's end, so a sealed file holds no zero tail and its size
is the end of its last frame.

Why ``pwrite`` and not a copy into the mapping: a store into a ``MAP_SHARED`` page that is not
yet mapped writable faults (ext4's ``page_mkwrite`` runs per 4 KiB page), and every
``fdatasync`` write-protects the pages it cleans, so each new batch faults its pages again;
the sync itself is slower too (it must also clean the page-table entries). Measured on the
reference VM (ext4, 230 KB batches, ``fdatasync`` after each): copy into the mapping ~135 us
(with the page cache filled ahead by a reader thread; ~210 us without) + sync ~340 us per
batch, ``pwrite`` ~50-80 us + sync ~230-260 us, like ``write`` appending to a file.

Nothing reads the file ahead of the writes any more: with stores into the mapping a prefetch
avoided page-fault stalls (17 ms every 8 MiB), but before a ``pwrite`` it only costs. Reading
preallocated (unwritten) extents makes the kernel zero every page, with readahead as large
folios, and dirtying those large folios then makes each ``fdatasync`` write back more: in the
broker benchmark (100 B x 1000 batches, 4 producers) the prefetch thread was 41% of the
broker's CPU and the mean sync 0.8-1.0 ms; without it, syncs take 0.45 ms and throughput rose
from 0.9-1.1 M to 1.35-1.5 M messages/s.

File names, preallocation and unsharing are in ``segment_files``; the frame buffers, ``pwrite``
and the writes deferred to the WAL's sync job in ``segment_writes``.

Blocking calls here (file creation, fallocate, mmap, pwrite, scans) are short operations on
the append path, or run in the WAL's executor (recovery); fdatasync is never called from here.
"""

from __future__ import annotations

import dataclasses
import mmap
import os

from array import array

from danube.storage._walframes import (SCAN_CLEAN, SCAN_CORRUPT, SCAN_GAP, SCAN_TORN,
                                       encode_frames_indexed, encode_frames_packed,
                                       last_nonzero, read_frames_into, scan_frames)
from danube.storage.errors import CorruptSegmentError
from danube.storage.segment_files import allocate, segment_name, unshare
# PendingWrite and write_pending are re-exported: this was their home.
from danube.storage.segment_writes import (PendingWrite, _take_buffer, frame_buffer, pwrite_all,
                                           write_pending)

_INDEX_MIN = 1024
STATUS_NAMES = {SCAN_CLEAN: "clean", SCAN_TORN: "torn", SCAN_CORRUPT: "corrupt",
                SCAN_GAP: "offset gap"}
_ZERO = (0,)


def _u64(n: int) -> array:
    """A zeroed uint64 array of ``n`` entries: the stdlib's array, which the Cython codec
    reads and writes through the buffer protocol as it would any uint64 buffer (numpy would
    add ~70 MB to every install for one flat array)."""
    return array("Q", _ZERO) * n


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What a segment holds: offsets ``first_offset..last_offset`` (``last_offset ==
    first_offset - 1`` when empty) in ``size`` bytes of frames. ``sealed_at`` is None for the
    active segment. Times are seconds since the epoch."""
    path: str
    first_offset: int
    last_offset: int
    size: int
    created_at: float
    sealed_at: float | None


class Segment:
    """A segment's file, mapping and frame index. Owned by one WAL; not thread-safe."""

    __slots__ = ("path", "name", "base", "fd", "mm", "size", "write_pos", "index", "count",
                 "max_size", "created_at", "sealed_at", "synced_pos", "validated",
                 "unwritten")

    def __init__(self, path: str, base: int, *, max_size: int, created_at: float):
        self.path = path
        self.name = os.path.basename(path)
        self.base = base
        self.fd: int | None = None          # writable fd: active, or sealed and not yet retired
        self.mm: mmap.mmap | None = None
        self.size = 0                       # mapped (= file) size
        self.write_pos = 0                  # end of the last frame
        self.unwritten = 0                  # bytes before write_pos still in PendingWrites
        self.index = _u64(0)
        self.count = 0
        self.max_size = max_size
        self.created_at = created_at
        self.sealed_at: float | None = None
        self.synced_pos = 0                 # data below this is known to be on stable storage
        self.validated = True               # False: sealed, known from the checkpoint only

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, directory: str, base: int, *, size: int, max_size: int,
               created_at: float, frames_hint: int = 0) -> Segment:
        """A new, empty active segment of ``size`` preallocated bytes; its index starts
        with room for ``frames_hint`` frames (what the previous segment held), so a busy
        log does not regrow it from scratch in every segment."""
        seg = cls(os.path.join(directory, segment_name(base)), base, max_size=max_size,
                  created_at=created_at)
        fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            allocate(fd, 0, size)
        except BaseException:
            os.close(fd)
            os.unlink(seg.path)
            raise
        seg.fd, seg.size = fd, size
        seg.index = _u64(max(_INDEX_MIN, frames_hint))
        return seg

    @classmethod
    def recover_active(cls, path: str, base: int, *, initial_size: int, max_size: int,
                       created_at: float) -> tuple[Segment, int, int]:
        """Open the last segment for appending after a restart.

        Keeps every complete, CRC-clean frame; a torn or corrupt tail (and anything else
        non-zero after the last good frame) is cut off with ftruncate. Returns the segment,
        the number of bytes dropped and the scan status at the cut.
        """
        seg = cls(path, base, max_size=max_size, created_at=created_at)
        unshare(path)       # a graceful shutdown may have sealed and uploaded it
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            file_size = os.fstat(fd).st_size
            dropped, status, valid_end, positions = 0, SCAN_CLEAN, 0, None
            if file_size:
                with mmap.mmap(fd, file_size) as mm:
                    _, positions, valid_end, status = scan_frames(mm, 0, -1, base)
                    dropped = last_nonzero(mm, valid_end) - valid_end
            if dropped:
                os.ftruncate(fd, valid_end)
                file_size = valid_end
            size = file_size if file_size > valid_end else max(valid_end,
                                                              min(initial_size, max_size))
            if size == 0:
                size = initial_size
            allocate(fd, file_size, size)
        except BaseException:
            os.close(fd)
            raise
        seg.fd, seg.size, seg.write_pos = fd, size, valid_end
        n = 0 if positions is None else len(positions)
        seg.index = _u64(max(_INDEX_MIN, n * 2))
        if n:
            seg.index[:n] = positions
        seg.count = n
        return seg, dropped, status

    @classmethod
    def recover_sealed(cls, path: str, base: int, *, max_size: int, created_at: float,
                       sealed_at: float) -> tuple[Segment, int]:
        """Open and validate a sealed segment. Every byte must be clean frames (a zero tail is
        tolerated and trimmed: a seal whose truncation did not reach the disk). Returns the
        segment (mapped read-only) and the bytes of zero tail trimmed."""
        seg = cls(path, base, max_size=max_size, created_at=created_at)
        seg.sealed_at = sealed_at
        size = os.stat(path).st_size
        trimmed = 0
        if size:
            seg.map_readonly()
            trimmed = seg._validate(None, None)
            if trimmed:
                seg.unmap()
                unshare(path)
                os.truncate(path, seg.write_pos)
                if seg.write_pos:
                    seg.map_readonly()
        seg.synced_pos = 0
        return seg, trimmed

    @classmethod
    def lazy_sealed(cls, path: str, base: int, *, count: int, size: int, max_size: int,
                    created_at: float, sealed_at: float, synced: bool) -> Segment:
        """A sealed segment known from the checkpoint (same name and size on disk); it is
        mapped and validated on first read."""
        seg = cls(path, base, max_size=max_size, created_at=created_at)
        seg.sealed_at = sealed_at
        seg.count, seg.size, seg.write_pos = count, size, size
        seg.synced_pos = size if synced else 0
        seg.validated = False
        return seg

    # ------------------------------------------------------------------ state

    @property
    def sealed(self) -> bool:
        return self.sealed_at is not None

    @property
    def end_offset(self) -> int:
        """One past the last offset held (== base when empty)."""
        return self.base + self.count

    @property
    def last_offset(self) -> int:
        return self.base + self.count - 1

    @property
    def room(self) -> int:
        """Bytes that may still be appended before the segment is full."""
        return max(0, self.max_size - self.write_pos)

    # ------------------------------------------------------------------ writing

    def write(self, payloads, first_offset: int, n: int, total: int,
              defer: bool = False) -> PendingWrite | None:
        """Append ``n`` frames taking ``total`` bytes (as measured by ``measure_frames``):
        written to the file now, or with ``defer`` returned as a PendingWrite for the
        caller to write later (they are in the index, and readable from it, at once)."""
        self._make_room(n, total)
        buf = _take_buffer(total) if defer else frame_buffer(total)
        encode_frames_indexed(buf, 0, first_offset, payloads, self.index, self.count,
                              self.write_pos)
        return self._commit(buf, first_offset, n, total, defer)

    def write_packed(self, data, ends, first_offset: int, n: int, total: int,
                     defer: bool = False) -> PendingWrite | None:
        """``write`` for payloads packed in one buffer (see ``encode_frames_packed``)."""
        self._make_room(n, total)
        buf = _take_buffer(total) if defer else frame_buffer(total)
        encode_frames_packed(buf, 0, first_offset, data, ends, self.index, self.count,
                             self.write_pos)
        return self._commit(buf, first_offset, n, total, defer)

    def _commit(self, buf, first_offset: int, n: int, total: int,
                defer: bool) -> PendingWrite | None:
        # The index entries past `count` were filled already; they count once committed.
        pending = None
        if defer:
            pending = PendingWrite(self, self.write_pos, buf, total, first_offset, n)
            self.unwritten += total
        else:
            pwrite_all(self.fd, buf, total, self.write_pos)
        self.write_pos += total
        self.count += n
        return pending

    @property
    def file_end(self) -> int:
        """End of the frames already written to the file."""
        return self.write_pos - self.unwritten

    def ensure_fd(self) -> None:
        """Open the segment's file again if its descriptor was closed while idle (the
        journal keeps a bounded number of active segments open: ``Journal.touch``)."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)

    def close_fd(self) -> None:
        """Close the descriptor and the mapping of an idle active segment (reopened by
        ``ensure_fd`` on its next use)."""
        self.unmap()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _make_room(self, n: int, total: int) -> None:
        if self.fd is None:
            self.ensure_fd()
        end = self.write_pos + total
        if end > self.size:
            self._grow(end)
        if self.count + n > len(self.index):
            index = _u64(max(2 * len(self.index), self.count + n))
            index[:self.count] = self.index[:self.count]
            self.index = index

    def _grow(self, end: int) -> None:
        self.grow_to(max(end, min(self.max_size, 2 * self.size)))

    def grow_to(self, new: int) -> None:
        """Preallocate the file up to ``new`` bytes (and map all of it, if mapped)."""
        if new > self.size:
            self.ensure_fd()
            allocate(self.fd, self.size, new)
            if self.mm is not None:
                self.mm.resize(new)
            self.size = new

    def seal(self, now: float) -> None:
        """No more appends: shrink the mapping and the file to the end of the data."""
        if self.size != self.write_pos:
            self.ensure_fd()
            if self.mm is not None:
                self.mm.resize(self.write_pos)      # ftruncate + mremap
            else:
                os.ftruncate(self.fd, self.write_pos)
            self.size = self.write_pos
        self.index = self.index[:self.count]      # a copy, trimmed to the frames
        self.sealed_at = now

    # ------------------------------------------------------------------ reading

    def map_readonly(self) -> None:
        """Map a sealed segment for reading (the mapping keeps its own descriptor)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        if self.validated:
            self.size = size
        elif size != self.size:
            self.unmap()
            raise CorruptSegmentError(
                f"WAL segment {self.path} is {size} bytes, the checkpoint recorded "
                f"{self.size}", path=self.path, offset=self.base)

    def ensure_validated(self) -> None:
        """Scan a segment known only from the checkpoint (mapping it first)."""
        if self.mm is None:
            self.map_readonly()
        if not self.validated:
            try:
                self._validate(self.count, self.size)
            except BaseException:
                self.unmap()
                raise
            self.validated = True

    def _validate(self, expect_count: int | None, expect_size: int | None) -> int:
        """Scan the whole mapping; sealed data must be clean. Sets the index; returns the
        bytes of zero tail after the last frame."""
        _, positions, valid_end, status = scan_frames(self.mm, 0, -1, self.base)
        n = len(positions)
        if status != SCAN_CLEAN:
            raise CorruptSegmentError(
                f"WAL segment {self.path} is damaged at byte {valid_end} (offset "
                f"{self.base + n}): {STATUS_NAMES.get(status, status)} frame; sealed data is "
                f"not dropped automatically", path=self.path, offset=self.base + n,
                position=valid_end, status=status)
        if expect_count is not None and (n != expect_count or valid_end != expect_size):
            raise CorruptSegmentError(
                f"WAL segment {self.path} holds {n} frames in {valid_end} bytes, the checkpoint "
                f"recorded {expect_count} frames in {expect_size} bytes (damaged from offset "
                f"{self.base + n})", path=self.path, offset=self.base + n, position=valid_end,
                status=status)
        self.index, self.count, self.write_pos = positions, n, valid_end
        return len(self.mm) - valid_end

    def read_into(self, out: list, offset: int, max_messages: int, max_bytes: int,
                  verify: bool) -> int:
        """Append frames from ``offset`` (which this segment holds) to ``out`` as
        ``(offset, payload)``; returns the payload bytes added (see ``read_frames_into``).
        The active segment is mapped on its first read: a log whose readers are served from
        the hot-tail cache holds one descriptor, not two (a mapping keeps one of its own)."""
        if self.mm is None and self.sealed_at is None:
            self.ensure_fd()
            self.mm = mmap.mmap(self.fd, self.size)
        pos = int(self.index[offset - self.base])
        return read_frames_into(out, self.mm, pos, self.file_end, offset, max_messages,
                                max_bytes, verify)

    # ------------------------------------------------------------------ teardown

    def unmap(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None

    def info(self) -> SegmentInfo:
        return SegmentInfo(path=self.path, first_offset=self.base, last_offset=self.last_offset,
                           size=self.write_pos, created_at=self.created_at,
                           sealed_at=self.sealed_at)


__all__ = ["PendingWrite", "STATUS_NAMES", "Segment", "SegmentInfo", "write_pending"]
