"""Message storage: the per-topic write-ahead log (mmap segments, group commit, retention).

Tiered storage (object-store uploads, cold readers) builds on the WAL's sealed segments."""

from danube.storage.errors import (CorruptSegmentError, OffsetTruncatedError, WALClosedError,
                                   WALError, WALFailedError, WALLockedError)
from danube.storage.recovery import RecoveryReport
from danube.storage.segment import SegmentInfo
from danube.storage.wal import ALWAYS, INTERVAL, NONE, WAL, WALConfig

__all__ = [
    "ALWAYS", "INTERVAL", "NONE", "CorruptSegmentError", "OffsetTruncatedError",
    "RecoveryReport", "SegmentInfo", "WAL", "WALClosedError", "WALConfig", "WALError",
    "WALFailedError", "WALLockedError",
]
