"""One process per directory: an exclusive, non-blocking ``flock`` on a lock file in it.

The embedded metadata store and each WAL directory take one. The kernel drops the lock when
the holding process dies, however it dies, so a crash never leaves a stale lock behind.
A bottom-layer module (stdlib only): storage and metadata both use it."""

from __future__ import annotations

import fcntl
import os


def try_lock(path: str) -> int | None:
    """Open (creating it if needed) the file at ``path`` and take an exclusive ``flock`` on
    it. Returns the descriptor, which holds the lock until it is closed, or None when another
    open file description holds it. Other OSErrors propagate, with nothing left open."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd
