"""Warm reads: a reader behind the local WAL reads from the write buffer's stream, where it
still holds the offsets (the last ``max_cached_closed_segments`` uploaded segments, or, with
no durable tier, everything), before the durable tier. Like the durable tier's reads, the
stream is read in the background: ``read`` returns None while entries are on their way and
the reader's ``on_ready`` follows."""

from __future__ import annotations

import asyncio
import logging

from danube.storage.writebuffer.recovery import read_tail

log = logging.getLogger("danube.storage.writebuffer")

#: ``WarmCursor.read``'s answer when the stream does not hold the offset.
MISS = object()
#: Messages one fetch keeps at most (several XRANGE chunks).
FETCH_MESSAGES = 4096


class WarmCursor:
    def __init__(self, buffer, on_ready):
        self._buf = buffer
        self._on_ready = on_ready
        self._rows: list = []              # (offset, payload), contiguous
        self._missing_below = -1           # offsets below this are not in the stream
        self._task: asyncio.Task | None = None

    def read(self, offset: int, max_messages: int, stop: int):
        """Up to ``max_messages`` from ``offset`` on, below ``stop``; None while fetching;
        MISS when the stream does not hold ``offset``."""
        if offset < self._missing_below or self._buf.detached:
            return MISS
        rows = self._rows
        if rows and rows[0][0] <= offset <= rows[-1][0]:
            i = offset - rows[0][0]
            out = rows[i:i + max_messages]
            return [r for r in out if r[0] < stop]
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._fetch(offset, stop), name=f"warm-read {self._buf.name}")
        return None

    async def _fetch(self, offset: int, stop: int) -> None:
        rows: list = []
        held_from = offset + 1
        try:
            async for batch in read_tail(self._buf.reader, self._buf.key, offset):
                if not rows and batch and batch[0][0] > offset:
                    held_from = batch[0][0]      # the stream starts later: all below is not
                for row in batch:
                    if row[0] >= stop or row[0] != offset + len(rows):
                        break
                    rows.append((row[0], bytes(row[1])))
                else:
                    if len(rows) < FETCH_MESSAGES:
                        continue
                break
        except Exception as exc:  # noqa: BLE001 - the durable tier serves it instead
            log.warning("%s: warm read from the write buffer failed (%r); reading from the "
                        "durable tier", self._buf.name, exc)
            rows = []
        finally:
            self._task = None
        if rows:
            self._rows = rows
            self._buf.warm_reads += len(rows)
        else:
            self._missing_below = max(self._missing_below, held_from)
        self._on_ready()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
