"""Directory entries that survive a power cut: a new file, a rename or a new directory is on
disk only once the directory holding its name is fsynced (POSIX promises nothing before;
ext4 happens to commit it with the next journal commit, other file systems need not).

A bottom-layer module (stdlib only): the broker process, storage and metadata use it.
tests/e2e/test_power_cut.py drops every entry whose directory was not synced."""

from __future__ import annotations

import ctypes
import os


def fsync_dir(directory: str) -> None:
    """Make the directory's entries (created, renamed, deleted files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)``, then the parent of each directory it
    created synced, so that the new path (a topic's WAL directory, the metadata store's)
    is still there after a power cut. Costs nothing when the directory exists."""
    directory = os.path.abspath(directory)
    if os.path.isdir(directory):
        return
    missing = []
    path = directory
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    os.makedirs(directory, exist_ok=True)
    for created in reversed(missing):
        fsync_dir(os.path.dirname(created))


def sync_filesystem(path: str) -> None:
    """Make everything written to the file system holding ``path`` durable: every file's
    data and every directory entry (Linux ``syncfs``, errors reported since 5.8; ``sync``
    elsewhere). One call instead of an fsync per file: the WAL journal trims itself with it
    (danube/storage/journal), whatever the number of topics written since."""
    libc = _libc()
    syncfs = getattr(libc, "syncfs", None) if libc is not None else None
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


_LIBC = []


def _libc():
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
