"""A subscription's reader of durable history: what a dispatcher uses for offsets the local
WAL no longer holds.

Reads are asynchronous (ranged GETs in the tiered threads) while the dispatcher's pass is
synchronous, so ``read`` either returns messages already fetched or starts a fetch and
returns None; the dispatcher is woken (``on_ready``) when the fetch lands. One chunk is read
ahead while the previous one is delivered, so a replay streams instead of stalling on every
GET. A failed fetch is retried with backoff; the subscription waits (at-least-once never
skips data that exists). An offset the durable tier does not have either raises
``OffsetTruncatedError`` with where history resumes, as the WAL does.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from danube.storage.errors import OffsetTruncatedError
from danube.storage.tiered.segments import read_history

log = logging.getLogger("danube.tiered")

RETRY_FIRST = 0.5
RETRY_MAX = 10.0


class HistoryCursor:
    def __init__(self, tier, on_ready):
        self.tier = tier
        self.on_ready = on_ready
        self._buf: collections.deque = collections.deque()   # (offset, payload), contiguous
        self._fetching: asyncio.Task | None = None
        self._fetch_from = -1
        self._missing: tuple[int, int] | None = None         # (offset, resume_at)
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._buf.clear()
        if self._fetching is not None:
            self._fetching.cancel()

    @property
    def _buf_next(self) -> int:
        return self._buf[-1][0] + 1 if self._buf else -1

    def read(self, offset: int, max_messages: int, local_first: int):
        """Up to ``max_messages`` messages from ``offset`` (below ``local_first``, the
        WAL's first offset), or None while they are being fetched."""
        if self._missing is not None and self._missing[0] == offset:
            resume = self._missing[1]
            self._missing = None
            raise OffsetTruncatedError(offset, min(resume, local_first))
        buf = self._buf
        while buf and buf[0][0] < offset:
            buf.popleft()
        if buf and buf[0][0] != offset:
            buf.clear()
        if not buf:
            self._fetch(offset, local_first)
            return None
        n = min(max_messages, len(buf))
        out = [buf.popleft() for _ in range(n)]
        # Read ahead: the next chunk is fetched while this one is delivered.
        if len(buf) < 256 and out[-1][0] + 1 < local_first:
            self._fetch(self._buf_next if buf else out[-1][0] + 1, local_first)
        return out

    def _fetch(self, offset: int, local_first: int) -> None:
        if self._closed or (self._fetching is not None and not self._fetching.done()):
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at:
            return
        self._fetch_from = offset
        self._fetching = loop.create_task(self._run_fetch(offset, local_first))

    async def _run_fetch(self, offset: int, local_first: int) -> None:
        tiered = self.tier.tiered
        catalog = self.tier.catalog
        desc = catalog.locate(offset)
        if desc is None:
            resume = catalog.next_start_after(offset)
            self._missing = (offset, local_first if resume is None else resume)
            self._wake()
            return
        try:
            got = await tiered.run(read_history, tiered.objstore, desc, offset)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - retried; the subscription waits
            tiered.stats["read_failures"] += 1
            self._failures += 1
            delay = min(RETRY_MAX, RETRY_FIRST * 2 ** (self._failures - 1))
            loop = asyncio.get_running_loop()
            self._retry_at = loop.time() + delay
            level = logging.WARNING if self._failures <= 3 or self._failures % 20 == 0 \
                else logging.DEBUG
            log.log(level, "%s: reading history at offset %d from %s failed (attempt %d, "
                    "retrying in %.1fs): %s", self.tier.name, offset,
                    tiered.objstore.describe(), self._failures, delay, exc)
            loop.call_later(delay, self._wake)
            return
        self._failures = 0
        tiered.stats["history_reads"] += 1
        tiered.stats["history_messages"] += len(got)
        if self._closed:
            return
        buf = self._buf
        if buf and got and got[0][0] != self._buf_next:
            buf.clear()
        buf.extend(got)
        self._wake()

    def _wake(self) -> None:
        if not self._closed:
            self.on_ready()
