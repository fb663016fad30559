"""The object-store interface of tiered storage. Calls are blocking; the broker runs them in
its tiered-storage threads.

Keys are relative, '/'-separated paths ("topics/default/t/00000000000000000000.seg"); every
backend puts its configured root prefix in front and strips it again in ``list``. An object
is written whole or not at all: a reader never sees half an upload.
"""

from __future__ import annotations

import abc
import dataclasses
import io
import os
import time


class ObjectStoreError(Exception):
    """Retryable failure (network, 5xx, timeouts)."""


class ObjectStoreConfigError(ObjectStoreError):
    """Not retryable: bad credentials, a missing bucket or container, a malformed config. The
    message names the backend, the endpoint and the bucket, and says what is wrong."""


class ObjectNotFound(ObjectStoreError):
    """The key does not exist."""


class ObjectExists(ObjectStoreError):
    """A conditional put found the key already there."""


@dataclasses.dataclass(frozen=True)
class ServiceCodes:
    """A cloud backend's own error codes, sorted into the kinds ``http_error`` decides on. A
    code in none of them is judged by its HTTP status alone."""
    container: str                          # what the backend calls a bucket
    exists: frozenset = frozenset()         # a conditional write found the key
    auth: frozenset = frozenset()           # credentials refused or not allowed
    missing_container: frozenset = frozenset()
    config: frozenset = frozenset()         # what retrying cannot fix
    not_found: frozenset = frozenset()      # a missing object, whatever the status says
    missing_object: frozenset = frozenset()  # a 404 that names the object, never the container
    bad_request_is_config: bool = False     # an HTTP 400 without a known code


def http_error(where: str, status: int | None, code: str, detail: str, codes: ServiceCodes, *,
               conditional: bool = False, container_level: bool = False,
               who: str = "", hint: str = "") -> ObjectStoreError:
    """The one decision table from a cloud store's answer to the error the tier acts on.

    ``where`` names the store, the operation and the key; ``detail`` is the service's own
    words; ``container_level`` says the operation can only miss the container (an upload, a
    listing), so a 404 there is a configuration error rather than a missing object; ``who``
    and ``hint`` say whose credentials were refused and which settings to check."""
    http = f"HTTP {status}" if status is not None else "no HTTP status"
    said = f"{detail}, {http}" if detail else http
    if conditional and (code in codes.exists or status in (409, 412)):
        return ObjectExists(f"{where}: already exists ({said})")
    if code in codes.auth or status in (401, 403):
        return ObjectStoreConfigError(
            f"{where}: access denied" + (f" for {who}" if who else "") + f" ({said})"
            + (f"; check {hint}" if hint else ""))
    if code in codes.missing_container or (
            container_level and status == 404 and code not in codes.missing_object):
        return ObjectStoreConfigError(f"{where}: the {codes.container} does not exist ({said})")
    if code in codes.config or (codes.bad_request_is_config and status == 400):
        return ObjectStoreConfigError(f"{where}: {said}")
    if code in codes.not_found or status == 404:
        return ObjectNotFound(f"{where}: not found")
    return ObjectStoreError(f"{where}: {said}")


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    key: str            # relative to the store's root, as given to put()
    size: int
    etag: str | None    # opaque, backend-specific; changes when the object is rewritten


class ObjectStore(abc.ABC):
    """One bucket (container, directory) under one root prefix."""

    backend: str        # "s3" | "gcs" | "azblob" | "fs" | "memory"

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the objects go, for logs and error messages."""

    @abc.abstractmethod
    def check(self) -> None:
        """Start-up probe: the endpoint answers, the credentials are accepted and the bucket
        exists. Raises ObjectStoreConfigError for what retrying cannot fix, ObjectStoreError
        when the endpoint cannot be reached; returns or raises within about ten seconds."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> ObjectInfo:
        """Write ``data`` at ``key``. With ``if_absent`` the write happens only if the key does
        not exist yet, else ObjectExists."""

    @abc.abstractmethod
    def put_file(self, key: str, path: str, size: int, *,
                 if_absent: bool = False) -> ObjectInfo:
        """Upload the first ``size`` bytes of the local file ``path``, streamed."""

    # True if put_sealed_file keeps the file itself rather than reading it: the uploader then
    # checks a segment through a mapping instead of reading it into memory.
    keeps_files = False

    def put_sealed_file(self, key: str, path: str, size: int, *,
                        if_absent: bool = False) -> ObjectInfo:
        """``put_file`` for a file whose first ``size`` bytes never change again (a sealed WAL
        segment): a store may keep the file itself instead of a copy."""
        return self.put_file(key, path, size, if_absent=if_absent)

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """The bytes [start, end) of the object (to its end when ``end`` is None). A range
        past the end of the object is cut short, as a file read is."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and etag; ObjectNotFound if the key does not exist."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (a plain string prefix, not only a
        directory), keys relative to the store's root, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a key that does not exist is not an error."""

    def close(self) -> None:
        """Release connections. The store is not used afterwards."""

    def refuse_existing(self, key: str) -> None:
        """ObjectExists if ``key`` is there: the HEAD before a put where the server does
        not enforce the condition itself. Racy (a writer between this and the put wins
        silently), so only for servers that leave no better way."""
        try:
            self.head(key)
        except ObjectNotFound:
            return
        raise ObjectExists(f"{self.describe()}: put {key!r}: already exists")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<{type(self).__name__} {self.describe()}>"


# The start-up probe: each attempt gets short timeouts, a refused or timed-out attempt is
# tried once more, and check() answers within about ten seconds even from a server that
# accepts connections and never replies (2 x 3 s read timeout + the pause).
PROBE_CONNECT_TIMEOUT = 2.0
PROBE_READ_TIMEOUT = 3.0
PROBE_ATTEMPTS = 2
PROBE_PAUSE = 0.5


def probe(attempt) -> None:
    """Run ``attempt`` (one request, raising ObjectStoreError) up to PROBE_ATTEMPTS times
    while it fails with a retryable error; what retrying cannot fix is raised at once."""
    for n in range(PROBE_ATTEMPTS):
        try:
            return attempt()
        except (ObjectStoreConfigError, ObjectNotFound):
            raise
        except ObjectStoreError:
            if n == PROBE_ATTEMPTS - 1:
                raise
        time.sleep(PROBE_PAUSE)


def shorten(text, limit: int = 300) -> str:
    """An SDK's error text for one log line: the first line, cut at ``limit``."""
    text = str(text).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def check_key(key: str) -> str:
    """Refuse keys that would name something outside the root on some backend ('..', a
    leading '/') or that two backends would store differently ('a//b', a trailing '/')."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/") or key.endswith("/") or "\0" in key or "\\" in key:
        raise ValueError(f"invalid object key {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"invalid object key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A list prefix: '' (everything), or a key's beginning; a trailing '/' is allowed."""
    if prefix == "":
        return prefix
    check_key(prefix[:-1] + "x" if prefix.endswith("/") else prefix)
    return prefix


def check_range(start: int, end: int | None) -> None:
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"invalid byte range [{start}, {end})")


def normalize_prefix(prefix: str | None) -> str:
    """A root prefix without leading or trailing '/': 'a/b' for '/a/b/'."""
    prefix = (prefix or "").strip("/")
    if prefix:
        check_key(prefix)
    return prefix


def join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


def strip(prefix: str, name: str) -> str:
    return name[len(prefix) + 1:] if prefix else name


class FileSlice(io.RawIOBase):
    """The first ``size`` bytes of an open file as a seekable stream, so an SDK can upload
    (and rewind to retry) a segment whose file is longer than its data (a preallocated WAL
    segment) without reading it into memory."""

    def __init__(self, path: str, size: int):
        super().__init__()
        self._f = open(path, "rb")
        try:
            actual = os.fstat(self._f.fileno()).st_size
        except BaseException:
            self._f.close()
            raise
        if size < 0 or size > actual:
            self._f.close()
            raise ValueError(f"{path}: asked to upload {size} bytes of a {actual}-byte file")
        self._size = size
        self._pos = 0

    def __len__(self):
        return self._size

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def read(self, n=-1):
        left = self._size - self._pos
        if left <= 0:
            return b""
        if n is None or n < 0 or n > left:
            n = left
        data = os.pread(self._f.fileno(), n, self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buf):
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def readall(self):
        return self.read()

    def close(self):
        if not self.closed:
            self._f.close()
        super().close()


def tuning(cfg) -> dict:
    """The timeouts and retries every cloud backend's store takes, from its DurableConfig."""
    return dict(connect_timeout=cfg.connect_timeout_seconds,
                read_timeout=cfg.read_timeout_seconds, retries=cfg.retries)
