"""Message storage: one ``TopicLog`` per reliable topic (topic_log.py), over the topic's
write-ahead log (wal/: mmap segments, group commit, retention) and, when storage is tiered,
its durable tier (tiered/: object-store uploads, history readers, built on the WAL's sealed
segments; durable/: the object stores)."""

from danube.storage.errors import (CorruptSegmentError, OffsetTruncatedError, WALClosedError,
                                   WALError, WALFailedError, WALLockedError)
from danube.storage.recovery import RecoveryReport
from danube.storage.segment import SegmentInfo
from danube.storage.topic_log import TopicLog, TopicLogReader
from danube.storage.wal import ALWAYS, INTERVAL, NONE, WAL, WALConfig

__all__ = [
    "ALWAYS", "INTERVAL", "NONE", "CorruptSegmentError", "OffsetTruncatedError",
    "RecoveryReport", "SegmentInfo", "TopicLog", "TopicLogReader", "WAL", "WALClosedError",
    "WALConfig", "WALError", "WALFailedError", "WALLockedError",
]
