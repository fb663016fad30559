"""Blocking work on segment bytes, run in the tiered-storage threads: preparing a sealed WAL
segment for upload, and reading frames back out of an uploaded object."""

from __future__ import annotations

import time

from danube._wal import SCAN_CLEAN, SCAN_TORN, read_frames, scan_frames
from danube.storage.durable.base import ObjectExists, ObjectStore
from danube.storage.segment import STATUS_NAMES
from danube.storage.tiered.catalog import (SPARSE_EVERY, SegmentDescriptor, object_key)

READ_CHUNK = 4 << 20          # bytes fetched per ranged GET when replaying history
_HDR = 16


class SegmentUploadError(Exception):
    pass


def upload_segment(objstore: ObjectStore, topic: str, path: str, first_offset: int,
                   last_offset: int, size: int) -> SegmentDescriptor:
    """Upload a sealed segment file, checked frame by frame first (a corrupt segment is not
    copied to the durable tier, where it would outlive the local evidence). The put is
    conditional: if the object is already there (a crash between the upload and the catalogue
    write, or a retry after a lost response) and has the expected size, it is adopted."""
    with open(path, "rb") as f:
        data = f.read(size)
    if len(data) != size:
        raise SegmentUploadError(f"{path}: {len(data)} bytes on disk, expected {size}")
    offsets, positions, valid_end, status = scan_frames(data, 0, size, first_offset)
    if status != SCAN_CLEAN or valid_end != size or not len(offsets) \
            or int(offsets[-1]) != last_offset:
        raise SegmentUploadError(
            f"{path}: segment is not clean ({STATUS_NAMES.get(status, status)} at byte "
            f"{valid_end} of {size}, {len(offsets)} frames, expected offsets "
            f"{first_offset}..{last_offset})")
    key = object_key(topic, first_offset, last_offset)
    try:
        etag = objstore.put(key, data, if_absent=True).etag
    except ObjectExists:
        info = objstore.head(key)
        if info.size != size:
            raise SegmentUploadError(
                f"{objstore.describe()}: {key} already exists with {info.size} bytes, "
                f"expected {size}; refusing to overwrite it") from None
        etag = info.etag
    index = tuple((int(offsets[i]), int(positions[i]))
                  for i in range(0, len(offsets), SPARSE_EVERY))
    name = key.rsplit("/", 1)[-1]
    return SegmentDescriptor(segment_id=name[:-len(".dnb1")], object_key=key,
                             start_offset=first_offset, end_offset=last_offset, size=size,
                             etag=etag, created_at=time.time(), offset_index=index)


def read_history(objstore: ObjectStore, desc: SegmentDescriptor, offset: int,
                 max_bytes: int = READ_CHUNK) -> list[tuple[int, bytes]]:
    """Messages from ``offset`` on (at least one, at most about ``max_bytes`` of frames) out
    of one uploaded segment, CRC-checked. Seeks with the sparse index, so it fetches at most
    ``SPARSE_EVERY`` frames it does not return."""
    base_offset, pos = desc.seek(offset)
    while True:
        end = min(desc.size, pos + max_bytes)
        data = objstore.get(desc.object_key, pos, end)
        offsets, positions, valid_end, status = scan_frames(data, 0, len(data), base_offset)
        if status not in (SCAN_CLEAN, SCAN_TORN) or (status == SCAN_TORN and end == desc.size):
            raise SegmentUploadError(
                f"{objstore.describe()}: {desc.object_key} is damaged "
                f"({STATUS_NAMES.get(status, status)} at byte {pos + valid_end})")
        if not len(offsets) or int(offsets[-1]) < offset:
            if valid_end == 0:
                # A frame bigger than the chunk: fetch exactly that frame.
                need = _HDR + int.from_bytes(data[8:12], "little") if len(data) >= 12 else 0
                if need <= max_bytes or end == desc.size:
                    raise SegmentUploadError(f"{desc.object_key}: no frame at byte {pos}")
                max_bytes = need
                continue
            # Everything fetched lies before ``offset``: move on to the last frame's end.
            pos += valid_end
            base_offset = int(offsets[-1]) + 1
            continue
        skip = offset - base_offset if offset > base_offset else 0
        start = int(positions[skip])
        return read_frames(data, start, valid_end, base_offset + skip, len(offsets) - skip)
