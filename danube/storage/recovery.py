"""Opening a WAL directory: lock it, find the segments, validate them, cut a torn tail.

Runs in the WAL's executor (it is all blocking file work). The rules:

* Segment files are ``wal.{first_offset:020d}.log``; sorted by name they are the log in
  order, and each must start where the previous one ends (a gap is ``CorruptSegmentError``).
* Sealed segments (all but the last) must consist of clean frames only. Damage there is an
  error naming the file and the first unreadable offset: it is acknowledged history, and
  dropping it would leave a hole in the middle of the topic that no reader would notice. A
  zero tail after the last frame is tolerated and trimmed (a seal whose truncation did not
  reach the disk before a machine crash). With ``validate_sealed="lazy"`` (the default) a
  sealed segment that the checkpoint lists with the same size is scanned on its first read
  instead of at open, so opening a long history costs a directory listing, not a full read.
* Trailing segments that hold no frame are removed where they follow a gap, and the log
  ends in the segment before them. A machine crash after rotations can leave that: a sync
  job makes new segments' directory entries durable before their data (see
  ``group_commit._Job``), and a rotation on the loop may create a segment while a job runs,
  which that job's directory sync may then record before the segment before it is synced.
* The last segment keeps every complete, CRC-clean frame; whatever follows (a torn frame, a
  corrupt one, stray bytes after a hole) is cut off with ftruncate and logged with its size.
  Offsets continue right after the last good frame.
* With no segment at all, the log starts at ``max(start_offset, checkpoint next_offset)``.
* Everything recovered is made durable before the WAL is used (fdatasync of the segments the
  checkpoint does not mark as synced, and of the last one; fsync of the directory), so a
  later sync's promise covers the recovered data too.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import time

from danube.dirsync import fsync_dir, makedirs_durable
from danube.fslock import try_lock
from danube.storage.checkpoint import (build_checkpoint, read_checkpoint, remove_stale_tmp,
                                       write_checkpoint)
from danube.storage._walframes import read_frame
from danube.storage.errors import CorruptSegmentError, WALLockedError
from danube.storage.segment import STATUS_NAMES, Segment
from danube.storage.segment_files import (MAX_OFFSET, parse_segment_name,
                                          remove_unshare_leftovers)

LOCK_NAME = "wal.lock"

log = logging.getLogger("danube.storage.wal")


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What ``WAL.open`` found. ``dropped_bytes`` is the torn/corrupt tail cut from the last
    segment (``dropped_status`` says why: "torn", "corrupt", "offset gap" or "clean" for
    stray bytes after a zero hole); ``trimmed_bytes`` the zero tails trimmed from sealed
    segments; ``lazy_segments`` the sealed segments left to validate on first read."""
    segments: int
    first_offset: int
    next_offset: int
    dropped_bytes: int
    dropped_status: str | None
    trimmed_bytes: int
    lazy_segments: int
    checkpoint_used: bool
    seconds: float


@dataclasses.dataclass(slots=True)
class Recovered:
    lock_fd: int | None
    segments: list[Segment]
    report: RecoveryReport


def lock_directory(directory: str) -> int:
    fd = try_lock(os.path.join(directory, LOCK_NAME))
    if fd is None:
        raise WALLockedError(f"WAL directory {directory} is open in another WAL")
    return fd


def _number(entry, key, default):
    value = entry.get(key) if entry else None
    return value if isinstance(value, (int, float)) else default


def _holds_no_frame(path: str, base: int) -> bool:
    """Whether the segment file does not start with a complete, CRC-clean frame of offset
    ``base`` (only the first frame is read)."""
    size = os.stat(path).st_size
    if not size:
        return True
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            try:
                return read_frame(mm, 0)[0] != base
            except ValueError:      # FrameError: torn, corrupt, or zeros
                return True
    finally:
        os.close(fd)


def _empty_tail(directory: str, found: list) -> int:
    """The index of the first of the trailing segments that hold no frame (``len(found)``
    if the last one holds one)."""
    k = len(found)
    while k and _holds_no_frame(os.path.join(directory, found[k - 1][1]), found[k - 1][0]):
        k -= 1
    return k


def recover(directory: str, config, start_offset: int, clock) -> Recovered:
    started = time.perf_counter()
    # Under the broker's journal (mode always) nothing here is synced: the journal's replay
    # at start synced what the previous process left, and anything written since is in
    # the journal until its trim syncs the file system (danube/storage/journal). Its lock
    # covers the whole root; the WAL claims the directory in the journal instead.
    journaled = config.journal_in_use is not None
    if journaled:
        os.makedirs(directory, exist_ok=True)
        lock_fd = None
    else:
        makedirs_durable(directory)
        lock_fd = lock_directory(directory)
    segments: list[Segment] = []
    try:
        remove_stale_tmp(directory)
        remove_unshare_leftovers(directory)
        ckpt = read_checkpoint(directory)
        entries = {}
        if ckpt:
            entries = {e.get("name"): e for e in ckpt["segments"] if isinstance(e, dict)}
        active_entry = ckpt.get("active") if ckpt else None
        found = sorted((base, name) for name in os.listdir(directory)
                       if (base := parse_segment_name(name)) is not None)
        now = clock()
        dropped, dropped_status, trimmed, lazy = 0, None, 0, 0
        # Segments that hold no frame after one that holds none come after a gap (an empty
        # segment ends where it starts): what a machine crash after rotations can leave.
        empty = _empty_tail(directory, found)
        removed = [name for _, name in found[empty + 1:]]
        del found[empty + 1:]
        for i, (base, name) in enumerate(found):
            path = os.path.join(directory, name)
            if base > MAX_OFFSET:
                raise CorruptSegmentError(
                    f"WAL {directory}: segment file {name} names first offset {base}, beyond "
                    f"the largest offset a WAL can hold ({MAX_OFFSET})", path=path, offset=base)
            if segments and base != segments[-1].end_offset and i == empty:
                # The first empty one after a segment that lost its tail (a new segment's
                # directory entry reached the disk, the end of the one before did not): the
                # log ends in the one before, which becomes the active segment again.
                removed.insert(0, name)
                prev = segments.pop()
                prev.unmap()
                if not prev.validated:
                    lazy -= 1
                base, name, path = prev.base, prev.name, prev.path
            if segments and base != segments[-1].end_offset:
                prev = segments[-1]
                raise CorruptSegmentError(
                    f"WAL {directory}: {prev.name} ends at offset {prev.end_offset - 1} but the "
                    f"next segment {name} starts at offset {base}", path=path,
                    offset=prev.end_offset)
            if i < len(found) - 1:
                st = os.stat(path)
                e = entries.get(name)
                created = _number(e, "created_at", st.st_mtime)
                sealed_at = _number(e, "sealed_at", st.st_mtime)
                synced = bool(e and e.get("synced") is True and e.get("size") == st.st_size)
                last = e.get("last_offset") if e else None
                if (config.validate_sealed == "lazy" and e and e.get("first_offset") == base
                        and e.get("size") == st.st_size and st.st_size > 0
                        and isinstance(last, int) and last >= base):
                    seg = Segment.lazy_sealed(path, base, count=last - base + 1,
                                              size=st.st_size, max_size=config.segment_max_bytes,
                                              created_at=created, sealed_at=sealed_at,
                                              synced=synced)
                    lazy += 1
                else:
                    seg, t = Segment.recover_sealed(path, base,
                                                    max_size=config.segment_max_bytes,
                                                    created_at=created, sealed_at=sealed_at)
                    if t:
                        log.info("WAL %s: trimmed %d zero bytes after the last frame of sealed "
                                 "segment %s", directory, t, name)
                        trimmed += t
                    elif synced:
                        seg.synced_pos = seg.write_pos
                segments.append(seg)
            else:
                created = now
                if active_entry and active_entry.get("name") == name:
                    created = _number(active_entry, "created_at", now)
                seg, dropped, status = Segment.recover_active(
                    path, base, initial_size=config.first_segment_bytes,
                    max_size=config.segment_max_bytes, created_at=created)
                segments.append(seg)
                if dropped:
                    dropped_status = STATUS_NAMES.get(status, str(status))
                    log.warning("WAL %s: dropped %d bytes of %s tail from %s at byte %d, after "
                                "offset %d (the last complete, CRC-clean frame)", directory,
                                dropped, dropped_status, name, seg.write_pos,
                                seg.end_offset - 1)
        if removed:
            for name in removed:
                os.unlink(os.path.join(directory, name))
            fsync_dir(directory)
            log.warning("WAL %s: removed %s, empty and after the end of the log (offset %d): a "
                        "machine crash after a rotation", directory, ", ".join(removed),
                        segments[-1].end_offset - 1)
        if not segments:
            base = max(start_offset, ckpt["next_offset"] if ckpt else 0)
            segments.append(Segment.create(directory, base,
                                           size=min(config.first_segment_bytes,
                                                    config.segment_max_bytes),
                                           max_size=config.segment_max_bytes, created_at=now))
        elif start_offset > segments[-1].end_offset:
            log.warning("WAL %s: start_offset %d ignored, the directory holds offsets up to %d",
                        directory, start_offset, segments[-1].end_offset - 1)
        # Make the recovered state durable, so later promises cover it.
        for seg in segments[:-1]:
            if seg.synced_pos < seg.write_pos and not journaled:
                fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                seg.synced_pos = seg.write_pos
        active = segments[-1]
        if not journaled:
            os.fdatasync(active.fd)
            active.synced_pos = active.write_pos
        write_checkpoint(directory, build_checkpoint(segments, active.end_offset,
                                                     active.end_offset - 1, now),
                         not journaled)
        report = RecoveryReport(
            segments=len(found), first_offset=segments[0].base, next_offset=active.end_offset,
            dropped_bytes=dropped, dropped_status=dropped_status, trimmed_bytes=trimmed,
            lazy_segments=lazy, checkpoint_used=ckpt is not None,
            seconds=time.perf_counter() - started)
        return Recovered(lock_fd=lock_fd, segments=segments, report=report)
    except BaseException:
        for seg in segments:
            seg.unmap()
            if seg.fd is not None:
                os.close(seg.fd)
        if lock_fd is not None:
            os.close(lock_fd)
        raise


def release(recovered: Recovered) -> None:
    """Undo a recovery whose WAL never got built (its opener was cancelled)."""
    for seg in recovered.segments:
        seg.unmap()
        if seg.fd is not None:
            os.close(seg.fd)
            seg.fd = None
    if recovered.lock_fd is not None:
        os.close(recovered.lock_fd)
