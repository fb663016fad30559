"""Typed storage errors. The broker core catches these; exactly one place maps them to gRPC
status codes."""


class WALError(Exception):
    """Base class of every error the WAL raises on purpose."""


class WALClosedError(WALError):
    """The WAL is closed (or closing): no more appends, reads or waits."""


class WALLockedError(WALError):
    """Another WAL (in this process or another) has the directory open. Two writers on one
    topic directory would interleave offsets, so the second one is refused."""


class WALFailedError(WALError):
    """A sync or a write failed (disk full, I/O error). After a failed ``fdatasync`` the
    kernel may have dropped the dirty pages it could not write, so a retry could report
    success for data that is gone: the WAL refuses further appends and must be reopened
    (recovery then shows what really is on disk). ``__cause__`` holds the OSError."""


class CorruptSegmentError(WALError):
    """Data in a sealed segment is damaged, or segments do not join up (an offset gap).

    Sealed data is not silently dropped: it was acknowledged long ago and a hole in the
    middle of a topic's history would go unnoticed by every reader. ``path`` is the file,
    ``offset`` the first offset that cannot be read, ``position`` the byte position in the
    file where the damage starts (None for a gap between files), ``status`` the scan result
    (``SCAN_TORN``, ``SCAN_CORRUPT``, ``SCAN_GAP``) or None.
    """

    def __init__(self, message, *, path, offset, position=None, status=None):
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.position = position
        self.status = status


class OffsetTruncatedError(WALError, LookupError):
    """A read asked for an offset below the first offset the WAL still holds (retention
    deleted it). ``first_offset`` says where the local log begins; older history lives in
    the tiered store, if any."""

    def __init__(self, offset, first_offset):
        super().__init__(f"offset {offset} is below the first retained offset {first_offset}")
        self.offset = offset
        self.first_offset = first_offset


class TieredStartupError(Exception):
    """The durable store of tiered storage is unusable at start-up (bad credentials, a
    missing bucket, an unreachable endpoint); the message says which and where."""


class WriteBufferError(WALError):
    """The write buffer (``storage.write_buffer``) did not take an append: Valkey/Redis could
    not be reached, refused the write, or (with ``on_wait_timeout: fail``) too few replicas
    confirmed it in time. The append is not acknowledged; it stays in the local WAL and is
    written to the buffer again, so a later publish finds the buffer complete."""


class WriteBufferFullError(WriteBufferError):
    """A topic has ``max_pending_bytes`` of appends waiting for the write buffer (it is down
    or slow): the publish is refused before anything of it is stored."""


class WriteBufferFencedError(WriteBufferError):
    """A later owner of the topic has claimed its stream (a higher ownership epoch): this
    broker's appends are refused there, and it must not acknowledge them."""


class WriteBufferStartupError(TieredStartupError):
    """The write buffer is unusable at start-up (unreachable, a replica, a wrong URL)."""


class OwnershipLostError(WALError):
    """A cluster's later owner of the topic raised its ownership epoch: this broker's writes
    to the shared storage (the catalogue, a shared WAL root) are refused, and nothing it
    still holds may be acknowledged."""


class UploadFailedError(WALError):
    """Durability ``uploaded``: the upload that was to carry an append failed. The append
    is not acknowledged; it stays in the local WAL and is uploaded by a later export."""


class StorageExhaustedError(WALError):
    """An append, or the opening of a log, refused for lack of a resource an operator can
    give back: disk space (``DiskFullError``) or file descriptors (``DescriptorLimitError``).
    Nothing of the refused batch was written (a batch larger than a segment may have had a
    prefix written: ``next_offset`` says how far) and the WAL stays usable: the next append
    tries again, so publishing resumes once the resource is back. ``__cause__`` holds the
    OSError. Built by ``danube.storage.exhaustion.exhausted``, which also counts it."""


class DiskFullError(StorageExhaustedError):
    """ENOSPC or EDQUOT. ``directory``: the WAL directory; ``mount_point``: the volume it is
    on; ``free_bytes``: what the volume had free for the broker just after the refusal
    (None if unknown); ``needed_bytes``: what the refused allocation asked for (0 if
    unknown)."""

    def __init__(self, message, *, directory, mount_point, free_bytes, needed_bytes=0):
        super().__init__(message)
        self.directory = directory
        self.mount_point = mount_point
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes


class DescriptorLimitError(StorageExhaustedError):
    """EMFILE (this process's RLIMIT_NOFILE) or ENFILE (the system's table). ``soft`` and
    ``hard``: the process's RLIMIT_NOFILE when refused."""

    def __init__(self, message, *, soft, hard, system_wide=False):
        super().__init__(message)
        self.soft = soft
        self.hard = hard
        self.system_wide = system_wide
