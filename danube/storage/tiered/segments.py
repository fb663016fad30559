"""Blocking work on segment bytes, run in the tiered-storage threads: preparing a sealed WAL
segment for upload, and reading frames back out of an uploaded object."""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time

from danube.storage._walframes import (MAX_PAYLOAD, SCAN_CLEAN, SCAN_CORRUPT, SCAN_TORN,
                                       FrameError, read_frames_into, scan_frames, walk_frames)
from danube.storage.durable.base import ObjectExists, ObjectStore
from danube.storage.segment import STATUS_NAMES
from danube.storage.tiered.catalog import SPARSE_EVERY, SegmentDescriptor, object_key, segment_id

log = logging.getLogger("danube.tiered")

READ_CHUNK = 8 << 20          # bytes fetched per ranged GET when replaying history
_HDR = 16


class SegmentUploadError(Exception):
    pass


def upload_segment(objstore: ObjectStore, topic: str, path: str, first_offset: int,
                   last_offset: int, size: int, epoch: int | None = None) -> SegmentDescriptor:
    """Upload a sealed segment file, checked frame by frame first (a corrupt segment is not
    copied to the durable tier, where it would outlive the local evidence). The put is
    conditional: an object already there with the same bytes (a retry after a lost response)
    is adopted, one with other bytes (an earlier owner's upload the catalogue never recorded)
    is replaced (see _upload_checked)."""
    with open(path, "rb") as f:
        if objstore.keeps_files and size:
            # The store keeps the file (a hard link): check it through a mapping, no copy.
            on_disk = os.fstat(f.fileno()).st_size
            if on_disk < size:
                raise SegmentUploadError(f"{path}: {on_disk} bytes on disk, expected {size}")
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as data:
                return _upload_checked(objstore, topic, path, data, first_offset,
                                       last_offset, size, epoch)
        data = f.read(size)
    if len(data) != size:
        raise SegmentUploadError(f"{path}: {len(data)} bytes on disk, expected {size}")
    return _upload_checked(objstore, topic, path, data, first_offset, last_offset, size,
                           epoch)


def _upload_checked(objstore, topic, path, data, first_offset, last_offset, size, epoch):
    offsets, positions, valid_end, status = scan_frames(data, 0, size, first_offset)
    if status != SCAN_CLEAN or valid_end != size or not len(offsets) \
            or int(offsets[-1]) != last_offset:
        raise SegmentUploadError(
            f"{path}: segment is not clean ({STATUS_NAMES.get(status, status)} at byte "
            f"{valid_end} of {size}, {len(offsets)} frames, expected offsets "
            f"{first_offset}..{last_offset})")
    key = object_key(topic, first_offset, last_offset, epoch)
    try:
        if objstore.keeps_files:
            etag = objstore.put_sealed_file(key, path, size, if_absent=True).etag
        else:
            etag = objstore.put(key, data, if_absent=True).etag
    except ObjectExists:
        # Segments are uploaded in order after the catalogue's end, so an object already at
        # the key is either this upload's own (a retry after a lost response: the same
        # bytes, adopted) or a previous owner's that never reached the catalogue: killed
        # between its PUT and its catalogue write. That one was never acknowledged in
        # durability uploaded (acks wait for the catalogue), no reader sees it (reads go
        # through the catalogue), and this owner's log holds other messages at its offsets:
        # it is replaced. Refusing stopped the topic's uploads (and its uploaded acks) for
        # good; adopting it on its size alone put another message under an acked offset.
        info = objstore.head(key)
        if info.size == size and objstore.get(key) == bytes(data):
            etag = info.etag
        else:
            log.warning("%s: %s held %d bytes no catalogue names (an earlier owner's "
                        "unrecorded upload); replacing it with this owner's segment %d..%d",
                        objstore.describe(), key, info.size, first_offset, last_offset)
            if objstore.keeps_files:
                etag = objstore.put_sealed_file(key, path, size).etag
            else:
                etag = objstore.put(key, data).etag
    index = tuple((int(offsets[i]), int(positions[i]))
                  for i in range(0, len(offsets), SPARSE_EVERY))
    return SegmentDescriptor(segment_id=segment_id(key), object_key=key,
                             start_offset=first_offset, end_offset=last_offset, size=size,
                             etag=etag, created_at=time.time(), offset_index=index)


# -- reading history back -----------------------------------------------------------------
#
# A reader of an uploaded segment fetches it in ranged GETs that need not fall on frame
# boundaries (so the next ones can be requested before the current one has landed), finds the
# complete frames of each by walking their headers (``walk_frames``: no payload is touched),
# and hands them out as HistoryChunks, which decode lazily: ``read(n)`` CRC-checks and copies
# out the next ``n`` frames only. A frame cut by a range boundary is carried over and joined
# with the start of the next range; a frame bigger than a range is assembled from several.

_HEADER = struct.Struct("<QII")


class HistoryChunk:
    """Complete frames fetched from an uploaded segment, ``data[pos:end]``, the first one
    carrying ``next_offset``; ``base`` is the object position of ``data[0]``. Frames are
    decoded (and their CRCs checked) only as they are read. ``error``, when set, describes
    damage right after ``end``: reading up to it returns the good frames, reading past it
    raises SegmentUploadError."""

    __slots__ = ("where", "key", "data", "base", "pos", "end", "next_offset", "error")

    def __init__(self, where: str, key: str, data: bytes, base: int, pos: int, end: int,
                 next_offset: int, error: str | None = None):
        self.where = where
        self.key = key
        self.data = data
        self.base = base
        self.pos = pos
        self.end = end
        self.next_offset = next_offset
        self.error = error

    @property
    def pending(self) -> int:
        """Bytes of frames not read yet."""
        return self.end - self.pos

    def read(self, max_messages: int) -> list[tuple[int, bytes]]:
        """The next ``max_messages`` messages (fewer at the end of the chunk, [] once it is
        used up), each CRC-checked. Raises SegmentUploadError, naming the object and the byte
        position, at a damaged frame."""
        if self.pos >= self.end:
            if self.error is not None:
                raise SegmentUploadError(self.error)
            return []
        out: list = []
        try:
            nbytes = read_frames_into(out, self.data, self.pos, self.end, self.next_offset,
                                      max_messages, -1, True)
        except FrameError:
            if not out:
                raise SegmentUploadError(self._damage()) from None
            # Deliver the good frames before the damaged one; the next read raises.
            nbytes = sum(len(p) for _, p in out)
        self.pos += nbytes + _HDR * len(out)
        self.next_offset += len(out)
        return out

    def skip_to(self, offset: int) -> bool:
        """Move on to the frame carrying ``offset`` (walking headers, nothing decoded).
        False if the chunk has no such frame: ``offset`` is behind it, or past its end (the
        chunk is then used up)."""
        if offset < self.next_offset:
            return False
        n = offset - self.next_offset
        if n:
            count, pos, _ = walk_frames(self.data, self.pos, self.end, self.next_offset, n)
            self.pos = pos
            self.next_offset += count
            if count < n:
                if self.error is not None:
                    raise SegmentUploadError(self.error)
                return False
        return self.pos < self.end or self.error is not None

    def _damage(self) -> str:
        pos = self.pos
        hdr = self.data[pos:pos + _HDR]
        if len(hdr) < _HDR:
            why = "a frame header cut short"
        else:
            off, ln, crc = _HEADER.unpack(hdr)
            if off == 0 and ln == 0 and crc == 0:
                why = "an all-zero frame header"
            elif off != self.next_offset:
                why = f"a frame carrying offset {off}"
            elif ln > self.end - pos - _HDR:
                why = f"a frame of {ln} bytes cut short"
            else:
                why = "a CRC mismatch"
        return (f"{self.where}: {self.key} is damaged: {why} at byte {self.base + pos} "
                f"(where offset {self.next_offset} should be)")


class SegmentReader:
    """Reads one uploaded segment sequentially from ``offset``. ``next_range()`` plans the
    ranged GETs, ``max_bytes`` each, from the sparse-index entry at or before ``offset`` to
    the end of the object; ``feed()`` takes each range's bytes, in order, and returns the
    HistoryChunks of the complete frames at or after ``offset``.

    Damage (a misnumbered frame, an impossible length, an object shorter than the catalogue
    says, a frame cut short at the object's end, a last offset other than the catalogue's)
    becomes a chunk whose ``error`` is raised when the reader gets there; nothing is fed
    after it. CRCs are checked by the chunks, as frames are read."""

    def __init__(self, where: str, desc: SegmentDescriptor, offset: int,
                 max_bytes: int = READ_CHUNK):
        self.where = where
        self.desc = desc
        self.offset = offset             # the first offset wanted
        self.expect, self.pos = desc.seek(offset)   # next frame to chunk: its offset, position
        self.fed = self.pos              # bytes fed so far end here
        self.planned = self.pos          # ranges planned so far end here
        self.max_bytes = max(1, max_bytes)
        self.broken = False
        self._carry: list = []           # a frame cut by a range boundary (starts at pos)
        self._carry_len = 0
        self._need = 0                   # that frame's full size, once its header is known

    @property
    def next_offset(self) -> int:
        """The offset the next chunk fed out will start at."""
        return max(self.expect, self.offset)

    def next_range(self) -> tuple[int, int] | None:
        """The next ``(start, end)`` byte range to GET, or None when all are planned."""
        if self.planned >= self.desc.size or self.broken:
            return None
        start = self.planned
        self.planned = min(self.desc.size, start + self.max_bytes)
        return start, self.planned

    def feed(self, start: int, end: int, data: bytes) -> list[HistoryChunk]:
        """The bytes of range ``[start, end)`` (ranges fed in order); returns the chunks of
        the frames completed by them, possibly none (a frame continues in the next range)."""
        if self.broken:
            return []
        if start != self.fed:
            raise ValueError(f"{self.desc.object_key}: range at byte {start} fed out of order "
                             f"(expected byte {self.fed})")
        chunks: list[HistoryChunk] = []
        n = min(len(data), end - start)
        self.fed = start + n
        i = 0
        if self._carry_len:
            i = self._fill_carry(data, n, chunks)
        if not self._carry_len and not self.broken:
            if self.expect < self.offset:
                skip = self.offset - self.expect
                count, i, status = walk_frames(data, i, n, self.expect, skip)
                self.expect += count
                self.pos = start + i
                if count == skip:
                    status = None
            else:
                status = None
            if status is None:
                count, j, status = walk_frames(data, i, n, self.expect)
                if count:
                    chunks.append(HistoryChunk(self.where, self.desc.object_key, data, start,
                                               i, j, self.expect))
                    self.expect += count
                self.pos = start + j
                i = j
            if status == SCAN_TORN:
                self._carry = [data[i:n]]
                self._carry_len = n - i
                self._need = 0
            elif status != SCAN_CLEAN:
                if status == SCAN_CORRUPT:
                    why = f"an impossible frame length at byte {self.pos}"
                else:
                    why = (f"a frame carrying offset {_HEADER.unpack_from(data, i)[0]} at "
                           f"byte {self.pos}, expected {self.expect}")
                self._break(chunks, why)
        if self.broken:
            return chunks
        if n < end - start:
            self._break(chunks, f"the object ends at byte {start + n}, the catalogue says "
                                f"{self.desc.size} bytes")
        elif self.fed >= self.desc.size:
            if self._carry_len:
                self._break(chunks, f"its last frame, at byte {self.pos}, is cut short")
            elif self.expect - 1 != self.desc.end_offset:
                self._break(chunks, f"it ends at offset {self.expect - 1}, the catalogue says "
                                    f"{self.desc.end_offset}")
        return chunks

    def _fill_carry(self, data: bytes, n: int, chunks: list) -> int:
        """Complete the carried frame from the start of ``data``; returns the bytes used."""
        i = 0
        if not self._need:
            if self._carry_len < _HDR:
                i = min(_HDR - self._carry_len, n)
                self._carry.append(data[:i])
                self._carry_len += i
                if self._carry_len < _HDR:
                    return i
            head = b"".join(self._carry)
            self._carry = [head]
            off, ln, _ = _HEADER.unpack_from(head)
            if ln > MAX_PAYLOAD:
                self._break(chunks, f"an impossible frame length at byte {self.pos}")
                return i
            if off != self.expect:
                self._break(chunks, f"a frame carrying offset {off} at byte {self.pos}, "
                                    f"expected {self.expect}")
                return i
            self._need = _HDR + ln
        take = min(self._need - self._carry_len, n - i)
        if take:
            self._carry.append(data[i:i + take])
            self._carry_len += take
            i += take
        if self._carry_len == self._need:
            frame = b"".join(self._carry)
            self._carry = []
            self._carry_len = self._need = 0
            if self.expect >= self.offset:
                chunks.append(HistoryChunk(self.where, self.desc.object_key, frame, self.pos,
                                           0, len(frame), self.expect))
            self.expect += 1
            self.pos += len(frame)
        return i

    def _break(self, chunks: list, why: str) -> None:
        self.broken = True
        chunks.append(HistoryChunk(self.where, self.desc.object_key, b"", self.pos, 0, 0,
                                   self.expect,
                                   error=f"{self.where}: {self.desc.object_key} is damaged: "
                                         f"{why}"))


def read_history(objstore: ObjectStore, desc: SegmentDescriptor, offset: int,
                 max_bytes: int = READ_CHUNK) -> list[tuple[int, bytes]]:
    """Messages from ``offset`` on (at least one; those of one ranged GET of about
    ``max_bytes``) out of one uploaded segment, CRC-checked: a blocking one-shot read, for
    tools and tests. Subscriptions read through ``history.HistoryCursor``, which keeps GETs
    in flight and decodes as it delivers."""
    reader = SegmentReader(objstore.describe(), desc, offset, max_bytes)
    while (rng := reader.next_range()) is not None:
        out: list = []
        for chunk in reader.feed(*rng, objstore.get(desc.object_key, *rng)):
            try:
                while got := chunk.read(1 << 20):
                    out += got
            except SegmentUploadError:
                if out:
                    return out       # the good frames first; the next call raises
                raise
        if out:
            return out
    raise SegmentUploadError(f"{objstore.describe()}: {desc.object_key} has no frame at "
                             f"offset {offset}")
