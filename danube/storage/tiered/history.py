"""A subscription's reader of durable history: what a dispatcher uses for offsets the local
WAL no longer holds.

Reads are asynchronous (ranged GETs in the tiered threads) while the dispatcher's pass is
synchronous, so ``read`` either returns messages already fetched or starts fetching and
returns None; the dispatcher is woken (``on_ready``) when bytes land. The history streams:
up to ``MAX_IN_FLIGHT`` GETs are kept in flight (and about ``READ_AHEAD`` bytes fetched
ahead) while the dispatcher consumes what has arrived, running on from one uploaded segment
into the next. Fetched bytes are not decoded up front: each ``read`` decodes and CRC-checks
only the frames it returns (``segments.HistoryChunk``).

A failed fetch, or damage found while decoding, is retried with backoff; the subscription
waits (at-least-once never skips data that exists). An offset the durable tier does not
have either raises ``OffsetTruncatedError`` with where history resumes, as the WAL does.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from danube.storage.errors import OffsetTruncatedError
from danube.storage.tiered.segments import READ_CHUNK, SegmentReader, SegmentUploadError

log = logging.getLogger("danube.tiered")

RETRY_FIRST = 0.5
RETRY_MAX = 10.0
MAX_IN_FLIGHT = 2                # ranged GETs (of READ_CHUNK bytes) in flight per cursor
READ_AHEAD = 2 * READ_CHUNK      # at most this many bytes fetched or in flight but not read


class _Fetch:
    __slots__ = ("reader", "start", "end", "future", "stale")

    def __init__(self, reader: SegmentReader, start: int, end: int, future):
        self.reader = reader
        self.start = start
        self.end = end
        self.future = future             # concurrent.futures.Future of the GET; dropped
        #                                  once used (it and its callback would otherwise
        #                                  keep the bytes alive in a reference cycle)
        self.stale = False               # dropped by a reset before it was chunked


class HistoryCursor:
    def __init__(self, tier, on_ready):
        self.tier = tier
        self.on_ready = on_ready
        self._chunks: collections.deque = collections.deque()   # HistoryChunk, contiguous
        self._fetches: collections.deque = collections.deque()  # _Fetch, in request order
        self._planner: SegmentReader | None = None   # the segment whose ranges are requested
        self._local_first = 0
        self._missing: tuple[int, int] | None = None         # (offset, resume_at)
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False

    def close(self) -> None:
        self._closed = True
        self._reset()

    def read(self, offset: int, max_messages: int, local_first: int):
        """Up to ``max_messages`` messages from ``offset`` (below ``local_first``, the
        WAL's first offset), or None while they are being fetched."""
        if self._missing is not None and self._missing[0] == offset:
            resume = self._missing[1]
            self._missing = None
            raise OffsetTruncatedError(offset, min(resume, local_first))
        if max_messages <= 0:
            return []
        self._local_first = local_first
        if self._fetches and self._fetches[0].future.done():
            self._collect()
        chunks = self._chunks
        while chunks:
            chunk = chunks[0]
            try:
                if not chunk.skip_to(offset):
                    if offset < chunk.next_offset:
                        self._reset()            # a step back: start over from there
                        break
                    chunks.popleft()
                    continue
                out = chunk.read(max_messages)
            except SegmentUploadError as exc:
                self._failed(offset, exc)
                return None
            if out:
                self._failures = 0
                self.tier.tiered.stats["history_messages"] += len(out)
                self._pump()
                return out
            chunks.popleft()                     # used up
        # What comes next is on its way (or about to be requested): wait for it.
        head = self._fetches[0].reader if self._fetches else self._planner
        if head is not None and head.next_offset == offset:
            self._pump()
            if self._fetches:
                return None
        self._reset()
        loop = asyncio.get_running_loop()
        if self._closed or loop.time() < self._retry_at:
            return None                          # a wake-up is scheduled for the retry
        catalog = self.tier.catalog
        desc = catalog.locate(offset)
        if desc is None:
            resume = catalog.next_start_after(offset)
            self._missing = (offset, local_first if resume is None else resume)
            loop.call_soon(self._wake)
            return None
        self._planner = SegmentReader(self.tier.tiered.objstore.describe(), desc, offset,
                                      READ_CHUNK)
        self.tier.counts["segments_read"] += 1
        self._pump()
        return None

    # -- fetching ---------------------------------------------------------------------------

    def _pump(self) -> None:
        """Keep GETs in flight: up to MAX_IN_FLIGHT, while less than READ_AHEAD bytes are
        fetched or on their way but not yet read. GETs go straight to the tiered thread pool
        (not through a task), so they start even while the loop is busy delivering."""
        fetches = self._fetches
        if self._closed or len(fetches) >= MAX_IN_FLIGHT or self._planner is None:
            return
        ahead = sum(c.pending for c in self._chunks) + sum(f.end - f.start for f in fetches)
        tiered = self.tier.tiered
        loop = asyncio.get_running_loop()
        while len(fetches) < MAX_IN_FLIGHT and ahead < READ_AHEAD:
            planner = self._planner
            rng = planner.next_range()
            if rng is None:
                # This segment is all requested: go on with the next one if it continues
                # the history (and holds offsets the WAL does not).
                self._planner = None
                if planner.broken:
                    return
                nxt = planner.desc.end_offset + 1
                desc = self.tier.catalog.locate(nxt) if nxt < self._local_first else None
                if desc is None or desc.start_offset != nxt:
                    return
                self._planner = SegmentReader(planner.where, desc, nxt, READ_CHUNK)
                self.tier.counts["segments_read"] += 1
                continue
            try:
                future = tiered.executor.submit(tiered.objstore.get, planner.desc.object_key,
                                                *rng)
            except RuntimeError as exc:          # the pool is shut down: the broker stops
                self._failed(planner.next_offset, exc)
                return
            fetch = _Fetch(planner, rng[0], rng[1], future)
            fetches.append(fetch)
            ahead += fetch.end - fetch.start
            future.add_done_callback(
                lambda _, f=fetch: loop.call_soon_threadsafe(self._landed, f))

    def _landed(self, fetch: _Fetch) -> None:
        """A GET finished (on the loop, soon after): chunk what arrived, wake the reader."""
        if fetch.stale:
            future, fetch.future = fetch.future, None
            if future is not None and not future.cancelled() and future.exception() is not None:
                self.tier.tiered.stats["read_failures"] += 1   # real, if no longer wanted
            return
        if self._collect():
            self._pump()
            self._wake()

    def _collect(self) -> bool:
        """Chunk the GETs that have finished, in request order (a frame may straddle two
        ranges). Returns True if anything changed (chunks added, or a failure)."""
        fetches = self._fetches
        stats = self.tier.tiered.stats
        changed = False
        while fetches and fetches[0].future.done():
            f = fetches.popleft()
            future, f.future = f.future, None
            exc = future.exception()
            if exc is not None:
                self._failed(f.reader.next_offset, exc,
                             f"bytes {f.start}..{f.end} of {f.reader.desc.object_key}")
                return True
            stats["history_reads"] += 1
            self.tier.counts["read_bytes"] += len(future.result())
            try:
                self._chunks.extend(f.reader.feed(f.start, f.end, future.result()))
            except Exception as err:  # noqa: BLE001 - a bug, but the subscription retries
                self._failed(f.reader.next_offset, err, reason="decode")
                return True
            changed = True
        return changed

    def _reset(self) -> None:
        """Drop everything fetched or being fetched."""
        self._chunks.clear()
        for f in self._fetches:
            f.stale = True
            f.future.cancel()
        self._fetches.clear()
        self._planner = None

    def _failed(self, offset: int, exc: BaseException, what: str | None = None,
                reason: str = "fetch") -> None:
        tiered = self.tier.tiered
        tiered.stats["read_failures"] += 1
        tiered.read_errors[reason] = tiered.read_errors.get(reason, 0) + 1
        self._failures += 1
        self._reset()
        delay = min(RETRY_MAX, RETRY_FIRST * 2 ** (self._failures - 1))
        loop = asyncio.get_running_loop()
        self._retry_at = loop.time() + delay
        level = logging.WARNING if self._failures <= 3 or self._failures % 20 == 0 \
            else logging.DEBUG
        log.log(level, "%s: reading history at offset %d%s from %s failed (attempt %d, "
                "retrying in %.1fs): %s", self.tier.name, offset,
                f" ({what})" if what else "", tiered.objstore.describe(), self._failures,
                delay, exc)
        loop.call_later(delay, self._wake)

    def _wake(self) -> None:
        if not self._closed:
            self.on_ready()
