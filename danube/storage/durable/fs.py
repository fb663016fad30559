"""An object store in a directory (a local disk, or a shared file system such as NFS mounted
by every broker).

Every write goes to a temporary file in the target's directory, is fsynced, and is then
renamed (or, for a conditional put, hard-linked) into place, followed by an fsync of the
directory: a reader sees the whole object or none of it, and an acknowledged upload survives
a power cut.

A sealed WAL segment (``put_sealed_file``) on the same file system is not copied: the object
is a hard link to the segment's file. Copying it would cost the broker's machine a read and a
write of every byte plus an fsync, for a second copy on the same disk that protects against
nothing the first does not (bench.tiered, session 8: while uploads ran every second the
publish p99 was +2.1 ms with the copy, +0.00 ms with the link). The WAL never writes to a
sealed file again; where it would (recovery trimming a tail, reopening the last segment for
appends), it first gives the file an inode of its own (``danube.storage.segment_files.unshare``)."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import uuid

from danube.storage.durable.base import (ObjectExists, ObjectInfo, ObjectNotFound, ObjectStore,
                                         ObjectStoreConfigError, ObjectStoreError, check_key,
                                         check_prefix, check_range)

# Temporary files start with this; list() never shows them and a crash can leave some behind.
TMP_PREFIX = ".danube-tmp-"
_COPY_CHUNK = 1 << 20
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK)


class FsObjectStore(ObjectStore):
    backend = "fs"

    def __init__(self, root: str):
        if not root:
            raise ObjectStoreConfigError("fs object store: the root directory is empty")
        self.root = os.path.abspath(root)

    def describe(self) -> str:
        return f"fs directory {self.root!r}"

    def _path(self, key):
        return os.path.join(self.root, *check_key(key).split("/"))

    def _error(self, op, key, exc):
        where = f"{self.describe()}: {op} {key!r}" if key is not None else \
            f"{self.describe()}: {op}"
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFound(f"{where}: not found")
        if isinstance(exc, PermissionError):
            return ObjectStoreConfigError(f"{where}: permission denied ({exc.strerror}: "
                                          f"{exc.filename})")
        return ObjectStoreError(f"{where}: {exc.strerror or exc} ({exc.filename})")

    def check(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except FileExistsError:
            raise ObjectStoreConfigError(f"{self.describe()}: exists and is not a "
                                         f"directory") from None
        except OSError as exc:
            raise ObjectStoreConfigError(f"{self.describe()}: cannot create the directory: "
                                         f"{exc.strerror}") from None
        if not os.path.isdir(self.root):
            raise ObjectStoreConfigError(f"{self.describe()}: exists and is not a directory")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ObjectStoreConfigError(f"{self.describe()}: not writable by this process")

    # -- writes --

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> ObjectInfo:
        def write(f):
            view = memoryview(data)
            while view:
                view = view[os.write(f, view):]
        return self._write(key, write, if_absent)

    def put_file(self, key: str, path: str, size: int, *,
                 if_absent: bool = False) -> ObjectInfo:
        def write(out):
            with open(path, "rb") as src:
                if os.fstat(src.fileno()).st_size < size:
                    raise ValueError(f"{path}: shorter than the {size} bytes to upload")
                left = size
                pos = 0
                while left:
                    # copy_file_range stays in the kernel (and reflinks where it can).
                    try:
                        n = os.copy_file_range(src.fileno(), out, min(left, 1 << 30), pos)
                    except OSError as exc:
                        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP,
                                             errno.EINVAL):
                            raise
                        n = 0
                    if n == 0:
                        chunk = os.pread(src.fileno(), min(left, _COPY_CHUNK), pos)
                        if not chunk:
                            raise ValueError(f"{path}: shorter than the {size} bytes to "
                                             f"upload")
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(out, view):]
                        n = len(chunk)
                    pos += n
                    left -= n
        return self._write(key, write, if_absent)

    keeps_files = True

    def put_sealed_file(self, key: str, path: str, size: int, *,
                        if_absent: bool = False) -> ObjectInfo:
        try:
            info = self._link(key, path, size, if_absent)
        except FileExistsError:
            raise ObjectExists(f"{self.describe()}: {key!r} already exists") from None
        except OSError as exc:
            # Another file system (EXDEV), or one without hard links: copy.
            if exc.errno not in _NO_LINK:
                raise self._error("put", key, exc) from exc
            info = None
        return info or self.put_file(key, path, size, if_absent=if_absent)

    def _link(self, key, path, size, if_absent):
        """Name ``path`` at ``key`` by a hard link; None when the file is longer than the
        segment (a link would take its tail along), which is then copied."""
        final = self._path(key)
        directory = os.path.dirname(final)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size != size:
                return None
            self._makedirs(directory)
            # The data must be durable before a name in the store points at it (the WAL has
            # usually synced it already, and then this costs nothing).
            os.fdatasync(fd)
            if if_absent:
                os.link(path, final)
            else:
                tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
                os.link(path, tmp)
                try:
                    os.replace(tmp, final)
                except BaseException:
                    _unlink_quietly(tmp)
                    raise
            _fsync_dir(directory)
            return ObjectInfo(key, size, _etag(os.fstat(fd)))
        finally:
            os.close(fd)

    def _write(self, key, write, if_absent):
        final = self._path(key)
        directory = os.path.dirname(final)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            self._makedirs(directory)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                write(fd)
                os.fsync(fd)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if if_absent:
                if _place_noreplace(tmp, final) == "linked":
                    os.unlink(tmp)
            else:
                os.replace(tmp, final)
            _fsync_dir(directory)
        except FileExistsError:
            _unlink_quietly(tmp)
            raise ObjectExists(f"{self.describe()}: {key!r} already exists") from None
        except OSError as exc:
            _unlink_quietly(tmp)
            raise self._error("put", key, exc) from exc
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return ObjectInfo(key, st.st_size, _etag(st))

    def _makedirs(self, directory):
        # The new directories' entries must be durable too, or a crash could lose a whole
        # directory of fsynced objects: fsync the parent of each one created.
        missing = []
        d = directory
        while not os.path.isdir(d):
            if d == self.root or len(d) <= len(self.root):
                break
            missing.append(d)
            d = os.path.dirname(d)
        os.makedirs(directory, exist_ok=True)
        for d in reversed(missing):
            _fsync_dir(os.path.dirname(d))

    # -- reads --

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                stop = size if end is None else min(end, size)
                parts = []
                pos = start
                while pos < stop:
                    chunk = os.pread(f.fileno(), stop - pos, pos)
                    if not chunk:
                        break
                    parts.append(chunk)
                    pos += len(chunk)
                return b"".join(parts)
        except IsADirectoryError:
            raise ObjectNotFound(f"{self.describe()}: get {key!r}: not found") from None
        except OSError as exc:
            raise self._error("get", key, exc) from exc

    def head(self, key: str) -> ObjectInfo:
        try:
            st = os.stat(self._path(key))
        except OSError as exc:
            raise self._error("head", key, exc) from exc
        if not _is_file(st):
            raise ObjectNotFound(f"{self.describe()}: head {key!r}: not found")
        return ObjectInfo(key, st.st_size, _etag(st))

    def list(self, prefix: str) -> list[ObjectInfo]:
        check_prefix(prefix)
        # Walk only the directory the prefix points into: "a/b/seg-" walks "a/b".
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = os.path.join(self.root, *base.split("/")) if base else self.root
        found = []
        try:
            self._walk(top, base, prefix, found)
        except OSError as exc:
            raise self._error("list", prefix, exc) from exc
        return sorted(found, key=lambda info: info.key)

    def _walk(self, directory, rel, prefix, found):
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.startswith(TMP_PREFIX):
                continue
            key = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                if key.startswith(prefix) or prefix.startswith(key + "/"):
                    self._walk(entry.path, key, prefix, found)
            elif key.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue        # deleted while we looked
                found.append(ObjectInfo(key, st.st_size, _etag(st)))

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except IsADirectoryError:
            return
        except OSError as exc:
            raise self._error("delete", key, exc) from exc
        # Empty directories stay: removing them would race a put creating a file in them.
        try:
            _fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise self._error("delete", key, exc) from exc


def _etag(st):
    return f"{st.st_mtime_ns:x}-{st.st_size:x}"


def _is_file(st):
    return stat.S_ISREG(st.st_mode)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_renameat2 = None


def _place_noreplace(src, dst):
    """Make ``dst`` name the file ``src`` unless ``dst`` exists (FileExistsError): link() is
    atomic create-if-absent on POSIX file systems. Where hard links are not supported (some
    FUSE and SMB mounts) renameat2(RENAME_NOREPLACE) does the same. Returns "linked" (src
    still exists) or "renamed"."""
    try:
        os.link(src, dst)
        return "linked"
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
    global _renameat2
    if _renameat2 is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _renameat2 = libc.renameat2
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst),
                  _RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), dst)
    return "renamed"


def open_store(cfg, environ):
    """storage.durable.backend fs (danube.config_durable.REGISTRY)."""
    return FsObjectStore(cfg.path)
