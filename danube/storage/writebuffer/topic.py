"""One topic's part of the write buffer: the appends not yet confirmed, and the waiters.

An append is framed into the WAL first, then handed here (``add``/``add_packed``) as one
stream entry; the broker's worker (buffer.py) writes it and confirms it. ``wait(offset)``
returns once every entry up to ``offset`` is confirmed (written, and replicated as
``wait_replicas`` asks), or raises ``WriteBufferError`` if the pass carrying it failed. A
failed entry stays queued and is written again, so the stream never has a hole: the
entries are contiguous from the topic's first buffered offset on.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging

from danube.storage.errors import WALClosedError, WriteBufferFullError
from danube.storage.writebuffer.entries import (ENDS, entry_id, epoch_key, first_of,
                                                join_payloads, pack_ends, stream_key,
                                                unpack_ends)

log = logging.getLogger("danube.storage.writebuffer")


class _Entry:
    __slots__ = ("first", "last", "data", "ends", "nbytes")

    def __init__(self, first, last, data, ends):
        self.first = first
        self.last = last
        self.data = data
        self.ends = ends
        self.nbytes = len(data) + len(ends)


class TopicBuffer:
    def __init__(self, wb, name: str, next_offset: int, epoch: int | None = None):
        self._wb = wb
        self.name = name
        self.key = stream_key(name)
        #: This broker's ownership epoch of the topic (None: a single broker), and the key
        #: that holds the newest owner's; ``fenced``: the error a later owner's claim made
        #: of every append since.
        self.epoch = epoch
        self.epoch_key = epoch_key(name)
        self.fenced: BaseException | None = None
        self._unsent: collections.deque[_Entry] = collections.deque()
        self._unconfirmed: collections.deque[_Entry] = collections.deque()
        self.pending_bytes = 0
        self.appended = next_offset - 1     # the last offset handed over
        self.written = next_offset - 1      # ... in the primary
        self.confirmed = next_offset - 1    # ... and replicated as configured
        self._waiters: list = []
        self._seq = 0
        self.resync = False
        self.detached = False
        #: Called with the confirmed offset after each confirmation (wakes dispatchers).
        self.on_confirmed = None
        self.cached_segments = wb.cfg.max_cached_closed_segments
        self.warm_reads = 0                 # messages readers got from the stream
        self._trim_below = -1
        self._trimming: asyncio.Task | None = None

    # -- appends --------------------------------------------------------------------------

    def check_room(self, nbytes: int) -> None:
        """Refuse an append of ``nbytes`` while ``max_pending_bytes`` wait already (one
        append always fits when nothing waits)."""
        limit = self._wb.cfg.max_pending_bytes
        if self.pending_bytes and self.pending_bytes + nbytes > limit:
            raise WriteBufferFullError(
                f"{self.name}: {self.pending_bytes} bytes are waiting for the write buffer "
                f"{self._wb.endpoint} (storage.write_buffer.max_pending_bytes: {limit}); "
                f"publish again once it is reachable")

    def add(self, first: int, payloads) -> None:
        data, ends = join_payloads(payloads)
        self._push(_Entry(first, first + len(ends) - 1, data, pack_ends(ends)))

    def add_packed(self, first: int, data, ends) -> None:
        self._push(_Entry(first, first + len(ends) - 1, data, pack_ends(ends)))

    def _push(self, entry: _Entry) -> None:
        if entry.last < entry.first:
            return
        self._unsent.append(entry)
        self.pending_bytes += entry.nbytes
        self.appended = entry.last
        self._wb.wake(self)

    @property
    def reader(self):
        """The pooled client for reads (recovery, warm reads)."""
        return self._wb.reader

    # -- waiting --------------------------------------------------------------------------

    async def wait(self, offset: int) -> int:
        """Return once everything up to ``offset`` is confirmed; raises WriteBufferError
        if the pass carrying it fails, WALClosedError if the topic leaves first."""
        if offset <= self.confirmed:
            return self.confirmed
        if self.fenced is not None:
            raise self.fenced
        if self.detached:
            raise WALClosedError(f"{self.name}: the topic's write buffer is closed")
        fut = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._waiters, (offset, self._seq, fut))
        self._wb.wake(self)
        return await fut

    def fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)

    # -- the worker's side (buffer.py) ----------------------------------------------------

    def unsent(self, budget: int) -> list:
        """Entries to write in this pass: in order, at least one, about ``budget`` bytes."""
        out = []
        for entry in self._unsent:
            if out and budget <= 0:
                break
            out.append(entry)
            budget -= entry.nbytes
        return out

    def needs_confirmation(self) -> bool:
        return self.fenced is None and (bool(self._unsent) or self.written > self.confirmed)

    def fence(self, exc: BaseException) -> None:
        """A later owner claimed the stream: nothing unsent can be written there any more,
        and nothing waiting may be acknowledged."""
        if self.fenced is None:
            log.error("%s", exc)
        self.fenced = exc
        self.fail_waiters(exc)

    def mark_written(self, entry: _Entry) -> None:
        assert self._unsent and self._unsent[0] is entry
        self._unconfirmed.append(self._unsent.popleft())
        self.written = entry.last

    def confirm_written(self) -> None:
        if self.written <= self.confirmed:
            return
        while self._unconfirmed:
            self.pending_bytes -= self._unconfirmed.popleft().nbytes
        self.confirmed = self.written
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.confirmed:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(self.confirmed)
        if self.on_confirmed is not None:
            self.on_confirmed(self.confirmed)

    async def resync_from_stream(self) -> None:
        """After a failed write: read where the stream ends and go on from there (entries
        that landed are not written twice; entries the stream lost are written again)."""
        top = await self.stream_end()
        self.resync = False
        if top is None:
            top = -1
        while self._unsent and self._unsent[0].last <= top:
            self.mark_written(self._unsent[0])
        if top < self.written:
            # The stream lost entries this broker had written (a primary restarted without
            # its data): write them again from what is still held.
            back = [e for e in self._unconfirmed if e.last > top]
            for e in reversed(back):
                self._unsent.appendleft(e)
            self._unconfirmed = collections.deque(e for e in self._unconfirmed if e.last <= top)
            self.written = max(top, self.confirmed)
            if top < self.confirmed:
                log.error("%s: the write buffer %s ends at offset %d but offsets up to %d "
                          "were confirmed there: it lost acknowledged entries (restarted "
                          "without persistence?); they are still in this broker's WAL",
                          self.name, self._wb.endpoint, top, self.confirmed)

    async def stream_end(self) -> int | None:
        """The last offset the stream holds, or None when it is empty or missing."""
        rows = await self._wb.reader.xrevrange(self.key, "+", "-", count=1)
        if not rows:
            return None
        rid, fields = rows[0]
        return first_of(rid) + len(unpack_ends(fields[ENDS])) - 1

    # -- cleanup ----------------------------------------------------------------------------

    async def trim_below(self, offset: int) -> int:
        """Drop the entries wholly below ``offset`` (an entry holding ``offset`` stays).
        Returns how many were dropped."""
        rows = await self._wb.reader.xrevrange(self.key, entry_id(offset), "-", count=1)
        if not rows:
            return 0
        rid, fields = rows[0]
        first = first_of(rid)
        last = first + len(unpack_ends(fields[ENDS])) - 1
        min_id = rid if last >= offset else entry_id(offset)
        dropped = await self._wb.reader.xtrim(self.key, minid=min_id, approximate=False)
        self._wb.stats["trims"] += 1
        return dropped

    def request_trim(self, below: int) -> None:
        """Drop the entries below ``below`` in the background (one trim at a time; a
        failed one is retried with the next upload)."""
        if below <= self._trim_below or self.detached:
            return
        self._trim_below = below
        if self._trimming is None:
            self._trimming = asyncio.get_running_loop().create_task(
                self._trim_loop(), name=f"write-buffer-trim {self.name}")

    async def _trim_loop(self) -> None:
        done = -1
        try:
            while self._trim_below > done and not self.detached:
                target = self._trim_below
                await self.trim_below(target)
                done = target
        except Exception as exc:  # noqa: BLE001 - the next upload asks again
            log.warning("%s: could not trim the write buffer %s: %r", self.name,
                        self._wb.endpoint, exc)
            self._trim_below = done
        finally:
            self._trimming = None

    async def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until everything handed over is confirmed."""
        if self.appended <= self.confirmed:
            return True
        if self._wb.failing:
            return False
        try:
            async with asyncio.timeout(timeout):
                await self.wait(self.appended)
            return True
        except (TimeoutError, Exception):  # noqa: BLE001 - reported by the caller
            return False

    def detach(self) -> None:
        """The topic leaves this broker (or is reopened): no more waits."""
        if self.detached:
            return
        self.detached = True
        self.fail_waiters(WALClosedError(f"{self.name}: the topic's write buffer is closed"))
        self._wb.forget(self)
