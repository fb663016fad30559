"""Broker metadata: one ``MetadataStore`` interface, an embedded SQLite store for a broker that
runs alone, and an in-memory store with identical semantics for tests of the layers above.
Nothing here knows about the broker; the key layout lives in ``danube.metadata.keys``."""

from danube.metadata._watch import Watch
from danube.metadata.embedded import EmbeddedStore
from danube.metadata.errors import (InvalidKey, MetadataError, MetadataUnavailable, StoreLocked,
                                    WatchOverflow)
from danube.metadata.memory import MemoryStore
from danube.metadata.store import DELETE, PUT, Entry, MetadataStore, WatchEvent

__all__ = [
    "DELETE", "PUT", "EmbeddedStore", "Entry", "InvalidKey", "MemoryStore", "MetadataError",
    "MetadataStore", "MetadataUnavailable", "StoreLocked", "Watch", "WatchEvent",
    "WatchOverflow",
]
