"""Segment files on disk: their names (``wal.{first_offset:020d}.log``), preallocation, and
giving a file shared with the object store an inode of its own before it is changed."""

import errno
import os
import re
import shutil

from danube.storage.checkpoint import fsync_dir


_NAME_RE = re.compile(r"^wal\.(\d{20})\.log$")
# The largest offset the WAL handles: its frame scanner takes offsets as signed 64-bit
# integers. A segment name's 20 digits can say more; such a file is not one the WAL wrote.
MAX_OFFSET = 2**63 - 1


def segment_name(first_offset: int) -> str:
    return f"wal.{first_offset:020d}.log"


def parse_segment_name(name: str) -> int | None:
    """The first offset a segment file name carries, or None for other files."""
    m = _NAME_RE.match(name)
    return int(m.group(1)) if m else None


UNSHARE_SUFFIX = ".unshare.tmp"


def unshare(path: str) -> bool:
    """Give the segment file ``path`` an inode of its own before it is changed in place;
    True if it had to be copied. An uploaded segment can have a second name: the fs object
    store keeps it as a hard link to the WAL's file rather than a copy, and writing through
    the shared inode would change the uploaded object."""
    if os.stat(path).st_nlink <= 1:
        return False
    tmp = path + UNSHARE_SUFFIX
    try:
        shutil.copyfile(path, tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(path) or ".")
    return True


def remove_unshare_leftovers(directory: str) -> None:
    """Drop the copies of a crash in the middle of ``unshare`` (the original is intact)."""
    for name in os.listdir(directory):
        if name.endswith(UNSHARE_SUFFIX):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def allocate(fd: int, start: int, end: int) -> None:
    """Reserve ``[start, end)`` of the file (extending it), falling back to a sparse
    ftruncate where the filesystem cannot preallocate."""
    if end <= start:
        return
    try:
        os.posix_fallocate(fd, start, end - start)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, end)
