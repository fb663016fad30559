"""Typed metadata errors, so callers can tell "retry or resync later" apart from "this call was
wrong". The broker core and the cluster layer catch these; exactly one place maps them to gRPC
status codes."""


class MetadataError(Exception):
    """Base class of every error a metadata store raises on purpose."""


class MetadataUnavailable(MetadataError):
    """The store cannot serve the call now: it is closed, its file cannot be written, or (for a
    remote store) the backend is unreachable. The operation may or may not have been applied if
    the failure happened during commit; callers retry or give up, they don't assume."""


class StoreLocked(MetadataUnavailable):
    """Another process holds the embedded store's directory. Two brokers on one data directory
    would silently fork the metadata, so the second one is refused."""


class WatchOverflow(MetadataError):
    """A watcher fell more than its ``max_pending`` events behind, so events were dropped and the
    watch has ended. The watcher's view is no longer complete: re-read the state with ``scan``
    and open a new watch."""


class InvalidKey(ValueError):
    """A key or prefix breaks the key rules (a ``str`` starting with '/', no NUL, valid
    Unicode). A programming error, not a store condition, hence a ``ValueError`` rather than a
    ``MetadataError``."""
