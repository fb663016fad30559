"""An object store in a dict, for tests and for several brokers in one process.

A named store lives in a process-wide registry, so two broker instances configured with the
same name share their objects (what a shared bucket gives brokers on different machines); a
store made without a name is private to its creator."""

from __future__ import annotations

import itertools
import threading

from danube.storage.durable.base import (ObjectExists, ObjectInfo, ObjectNotFound, ObjectStore,
                                         ObjectStoreError, FileSlice, check_key, check_prefix,
                                         check_range)


class _Space:
    """The objects behind one name."""

    def __init__(self):
        self.lock = threading.Lock()
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.available = True
        # Etags are versions, not content hashes: an MD5 of a segment is ~10 ms of a core in
        # the broker's own process (this store uploads in-process), for nothing a test needs.
        self.versions = itertools.count(1)


_registry: dict[str, _Space] = {}
_registry_lock = threading.Lock()


def drop_memory_store(name: str) -> None:
    """Forget the objects of a named store (the next store opened with it starts empty)."""
    with _registry_lock:
        _registry.pop(name, None)


class MemoryObjectStore(ObjectStore):
    backend = "memory"

    def __init__(self, name: str | None = None):
        self.name = name
        if name is None:
            self._space = _Space()
        else:
            with _registry_lock:
                self._space = _registry.setdefault(name, _Space())

    def describe(self) -> str:
        return f"memory store {self.name!r}" if self.name is not None else "private memory store"

    def set_available(self, available: bool) -> None:
        """Simulate an outage: while unavailable, every call (of every store sharing this
        name) raises ObjectStoreError, as an unreachable server would."""
        self._space.available = available

    def _ensure_up(self, op):
        if not self._space.available:
            raise ObjectStoreError(f"{self.describe()}: {op}: store unavailable (simulated "
                                   f"outage)")

    def check(self) -> None:
        self._ensure_up("check")

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> ObjectInfo:
        check_key(key)
        data = bytes(data)
        space = self._space
        with space.lock:
            self._ensure_up(f"put {key!r}")
            if if_absent and key in space.objects:
                raise ObjectExists(f"{self.describe()}: {key!r} already exists")
            etag = f"v{next(space.versions)}"
            space.objects[key] = (data, etag)
        return ObjectInfo(key, len(data), etag)

    def put_file(self, key: str, path: str, size: int, *,
                 if_absent: bool = False) -> ObjectInfo:
        with FileSlice(path, size) as src:
            return self.put(key, src.read(), if_absent=if_absent)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(start, end)
        with self._space.lock:
            self._ensure_up(f"get {key!r}")
            try:
                data, _ = self._space.objects[key]
            except KeyError:
                raise ObjectNotFound(f"{self.describe()}: {key!r} not found") from None
        return data[start:end]

    def head(self, key: str) -> ObjectInfo:
        check_key(key)
        with self._space.lock:
            self._ensure_up(f"head {key!r}")
            try:
                data, etag = self._space.objects[key]
            except KeyError:
                raise ObjectNotFound(f"{self.describe()}: {key!r} not found") from None
        return ObjectInfo(key, len(data), etag)

    def list(self, prefix: str) -> list[ObjectInfo]:
        check_prefix(prefix)
        with self._space.lock:
            self._ensure_up(f"list {prefix!r}")
            found = [ObjectInfo(k, len(d), e) for k, (d, e) in self._space.objects.items()
                     if k.startswith(prefix)]
        return sorted(found, key=lambda info: info.key)

    def delete(self, key: str) -> None:
        check_key(key)
        with self._space.lock:
            self._ensure_up(f"delete {key!r}")
            self._space.objects.pop(key, None)


def open_store(cfg, environ):
    """storage.durable.backend memory (danube.config_durable.REGISTRY)."""
    return MemoryObjectStore(cfg.name)
