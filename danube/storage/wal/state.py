"""The state every part of a WAL shares: its segments, the active one, its offsets, the
frames appended but not written yet (pending writes), and its lifecycle.

``WalState`` holds it and nothing else: the parts that change it (append.py, group_commit.py,
read.py, retention.py) are given it at construction. Its fields are plain slots, read on the
append path with no call in between.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
from typing import Callable

from danube.storage._tailcache import TailCache
from danube.storage.errors import WALClosedError, WALFailedError
from danube.storage.segment import Segment

OPEN, CLOSING, CLOSED = 0, 1, 2


class WalState:
    """One WAL's shared state (see the module docstring)."""

    __slots__ = ("directory", "config", "mode", "executor", "clock", "loop", "segments",
                 "bases", "active", "next_offset", "first_offset", "durable", "cache",
                 "pending", "kick", "status", "failed", "journal", "journal_key")

    def __init__(self, directory: str, config, segments: list[Segment],
                 executor: concurrent.futures.Executor, clock: Callable[[], float]):
        self.directory = directory
        self.config = config
        self.mode = config.durability
        self.executor = executor
        self.clock = clock
        self.loop = asyncio.get_running_loop()
        #: Every segment, oldest first (the last is ``active``), and their base offsets.
        self.segments = segments
        self.bases = [s.base for s in segments]
        self.active = segments[-1]
        self.next_offset = self.active.end_offset
        self.first_offset = segments[0].base
        #: The newest offset a completed sync covers (open syncs what it recovers).
        self.durable = self.next_offset - 1
        self.cache = TailCache(config.cache_capacity, self.next_offset)
        #: Appended frames not written to their file yet, oldest first (mode always: see
        #: "Writes" in the package docstring).
        self.pending: collections.deque = collections.deque()
        #: Wakes the sync worker (group_commit.py): something to sync, rotate or close.
        self.kick = asyncio.Event()
        self.status = OPEN
        #: The error of a failed sync or write: the WAL then refuses appends.
        self.failed: BaseException | None = None
        #: The broker's journal when it makes this WAL's appends durable (mode always),
        #: and this WAL's name in its records.
        self.journal = journal = config.journal_in_use
        self.journal_key = journal.key(directory) if journal is not None else b""

    def check_usable(self) -> None:
        if self.status != OPEN or self.failed is not None:
            self.raise_unusable()

    def raise_unusable(self):
        if self.status != OPEN:
            raise WALClosedError(f"WAL {self.directory} is closed")
        raise WALFailedError(f"WAL {self.directory} failed: {self.failed!r}") from self.failed

    def close_segments(self) -> None:
        """Unmap every segment and close its descriptor (closing, or a cancelled close)."""
        for seg in self.segments:
            seg.unmap()
            if seg.fd is not None:
                try:
                    os.close(seg.fd)
                except OSError:
                    pass
                seg.fd = None
