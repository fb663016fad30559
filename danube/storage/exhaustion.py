"""Running out of disk space or file descriptors, told apart from other storage failures.

A full volume (ENOSPC, EDQUOT) or the descriptor limit (EMFILE, ENFILE) is not a fault of
the broker nor of the data: the operator frees space or raises a limit and the broker goes
on. ``exhausted`` turns such an OSError into a typed error (``DiskFullError``,
``DescriptorLimitError``) whose message names the volume and its free bytes, or the limit
and how to raise it; the broker answers it as RESOURCE_EXHAUSTED. ``STATE`` counts the
refusals and knows whether the disk is full now, for the exporter and the readiness check
(``/health/ready`` on the metrics port).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from danube.storage.errors import DescriptorLimitError, DiskFullError, StorageExhaustedError

try:
    import resource
except ImportError:         # not on POSIX
    resource = None

log = logging.getLogger("danube.storage")

#: Seconds between two log lines about the descriptor limit.
LOG_EVERY = 60.0

DISK_FULL_ERRNOS = frozenset(e for e in (errno.ENOSPC, getattr(errno, "EDQUOT", None))
                             if e is not None)
DESCRIPTOR_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE))

#: What raising the descriptor limit takes, said in every refusal for it.
RAISE_LIMIT = ("raise it with `ulimit -n N` in the shell that starts the broker, or "
               "LimitNOFILE=N in its systemd unit (each reliable topic keeps a few files "
               "open: its active WAL segment and its lock)")


def mount_point(path: str) -> str:
    """The mount point of the volume ``path`` is on (or would be on: the nearest existing
    ancestor's)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    while not os.path.ismount(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path: str) -> int | None:
    """Bytes of ``path``'s volume an unprivileged writer may still use (None if unknown)."""
    try:
        st = os.statvfs(mount_point(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def descriptor_limits() -> tuple[int | None, int | None]:
    """This process's RLIMIT_NOFILE: (soft, hard); None for unlimited or unknown."""
    if resource is None:
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft), (None if hard == inf else hard)


def _limit(value):
    return "unlimited" if value is None else str(value)


def exhausted(exc: BaseException, directory: str, what: str = "write",
              needed_bytes: int = 0) -> StorageExhaustedError | None:
    """The typed error for ``exc`` when it says a resource ran out (None for any other
    error), counted in ``STATE``. ``directory``: where the broker was writing (a WAL
    directory); ``what``: what was refused, for the message ("append to /ns/t");
    ``needed_bytes``: what the refused allocation asked for, when known."""
    if isinstance(exc, StorageExhaustedError):
        return exc
    if not isinstance(exc, OSError):
        return None
    if exc.errno in DISK_FULL_ERRNOS:
        mount = mount_point(directory)
        free = free_bytes(directory)
        quota = " (disk quota exceeded)" if exc.errno != errno.ENOSPC else ""
        asked = f", {needed_bytes} asked for" if needed_bytes else ""
        err = DiskFullError(
            f"disk full{quota}: cannot {what}: the volume of the WAL directory {directory} "
            f"(mounted at {mount}) has {'an unknown number of' if free is None else free} "
            f"bytes free{asked}; free space there (or delete topics, or lower retention) "
            f"and publishing resumes by itself", directory=directory, mount_point=mount,
            free_bytes=free, needed_bytes=needed_bytes)
    elif exc.errno in DESCRIPTOR_ERRNOS:
        soft, hard = descriptor_limits()
        if exc.errno == errno.EMFILE:
            err = DescriptorLimitError(
                f"too many open files: cannot {what}: the broker has reached its descriptor "
                f"limit (RLIMIT_NOFILE soft {_limit(soft)}, hard {_limit(hard)}); "
                f"{RAISE_LIMIT}", soft=soft, hard=hard)
        else:
            err = DescriptorLimitError(
                f"too many open files in the system: cannot {what}: the kernel's file table "
                f"is full (fs.file-max; the broker's RLIMIT_NOFILE is soft {_limit(soft)}, "
                f"hard {_limit(hard)}); raise fs.file-max with sysctl or close files "
                f"elsewhere", soft=soft, hard=hard, system_wide=True)
    else:
        return None
    err.__cause__ = exc
    STATE.record(err)
    return err


class Exhaustion:
    """What the storage refused for lack of space or descriptors (one per process: the
    exporter and the readiness check read it from another thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        #: Refused appends and log openings, by reason ("disk_full", "descriptor_limit").
        self.refused = {"disk_full": 0, "descriptor_limit": 0}
        #: The last DiskFullError while the disk is full, else None.
        self.disk_full: DiskFullError | None = None
        self.disk_full_since: float | None = None
        #: The last DescriptorLimitError and when it came (time.time()).
        self.descriptor_limit: DescriptorLimitError | None = None
        self.descriptor_limit_at: float | None = None
        self._descriptor_logged: float | None = None

    def record(self, err: StorageExhaustedError) -> None:
        """Count a refusal; the first of a full disk, and one refusal for descriptors a
        minute at most, is logged."""
        now = time.time()
        with self._lock:
            if isinstance(err, DiskFullError):
                self.refused["disk_full"] += 1
                first = self.disk_full is None
                if first:
                    self.disk_full_since = now
                self.disk_full = err
            else:
                self.refused["descriptor_limit"] += 1
                first = (self._descriptor_logged is None
                         or now - self._descriptor_logged >= LOG_EVERY)
                if first:
                    self._descriptor_logged = now
                self.descriptor_limit = err
                self.descriptor_limit_at = now
        if first:
            log.error("storage refused a request: %s", err)

    def space_back(self) -> None:
        """An append went through after a refusal: the disk is not full any more."""
        with self._lock:
            was = self.disk_full
            self.disk_full = self.disk_full_since = None
        if was is not None:
            log.warning("the WAL volume %s has room again: publishes are taken",
                        was.mount_point)

    def disk_full_now(self) -> DiskFullError | None:
        """The refusal that says the disk is full, or None once it is not: an append went
        through since, or the volume has room again for what was refused (checked here, so
        the readiness check clears without waiting for a publish)."""
        err = self.disk_full
        if err is None:
            return None
        free = free_bytes(err.directory)
        if free is not None and free > (err.free_bytes or 0) + max(err.needed_bytes, 1 << 20):
            with self._lock:
                if self.disk_full is not err:
                    return self.disk_full
                self.disk_full = self.disk_full_since = None
            log.warning("the WAL volume %s has room again (%d bytes free)", err.mount_point,
                        free)
            return None
        return err

    def descriptors_recently(self, within: float) -> DescriptorLimitError | None:
        """The last descriptor-limit refusal if it came less than ``within`` seconds ago."""
        at = self.descriptor_limit_at
        if at is None or time.time() - at > within:
            return None
        return self.descriptor_limit


STATE = Exhaustion()
