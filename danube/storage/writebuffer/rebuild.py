"""Opening a topic's WAL when a write buffer holds its tail (a new owner after a failover, or
a restart): the log continues from the exact last acknowledged offset.

Every acknowledged append is in the stream, and the stream is only trimmed below what the
durable tier holds, so the durable tier's end followed by the stream's tail is the whole
acknowledged log. The local WAL is kept when it ends exactly where that log ends and holds
the same last message there (a restart of the same owner, the common case); otherwise it is
moved aside (it can hold appends that were never acknowledged, or a past ownership's
offsets that another owner has since given to other messages), and a new WAL is written from
the stream's tail, then synced, before the topic is served.

Without a durable tier (``storage.mode: local``) the local WAL is the history: it is kept
when it reaches at least the stream's end, and extended from the stream when it stops
short of it; a missing WAL starts at the stream's first offset.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from danube.storage.wal import WAL
from danube.storage.writebuffer.entries import (ENDS, PAYLOAD, first_of, stream_key,
                                                unpack_ends)
from danube.storage.writebuffer.recovery import read_tail

log = logging.getLogger("danube.storage.writebuffer")


async def _stream_bounds(reader, key):
    """(first offset, last offset, last payload) of the stream, or None when empty."""
    rows = await reader.xrevrange(key, "+", "-", count=1)
    if not rows:
        return None
    rid, fields = rows[0]
    ends = unpack_ends(fields[ENDS])
    first_row = await reader.xrange(key, "-", "+", count=1)
    last = first_of(rid) + len(ends) - 1
    start = ends[-2] if len(ends) > 1 else 0
    return first_of(first_row[0][0]), last, bytes(fields[PAYLOAD][start:ends[-1]])


def _same_at(wal: WAL, offset: int, payload: bytes) -> bool:
    try:
        got = wal.read(offset, 1)
    except Exception:  # noqa: BLE001 - an unreadable local copy is not the same
        return False
    return bool(got) and got[0][0] == offset and bytes(got[0][1]) == payload


async def _set_aside(name, directory, wal, executor, why):
    await wal.close()
    aside = f"{directory}.stale-{int(time.time() * 1000)}"
    await asyncio.get_running_loop().run_in_executor(executor, os.replace, directory, aside)
    log.warning("%s: %s; moved the local WAL to %s", name, why, aside)


async def _replay(name, wal: WAL, reader, key, until: int) -> int:
    """Append the stream's messages from ``wal.next_offset`` to ``until`` and sync; returns
    how many. Stops at a hole in the stream (logged: those offsets cannot be rebuilt)."""
    start = wal.next_offset
    done = 0
    async for batch in read_tail(reader, key, start):
        expected = wal.next_offset
        payloads = []
        for offset, payload in batch:
            if offset > until:
                break
            if offset != expected + len(payloads):
                log.error("%s: the write buffer has no offset %d (its next entry is %d); "
                          "the log continues without what follows", name,
                          expected + len(payloads), offset)
                until = -1
                break
            payloads.append(payload)
        if payloads:
            wal.append(payloads)
            done += len(payloads)
        if wal.next_offset > until:
            break
    if done:
        await wal.sync_to()
    return done


async def open_wal(name: str, directory: str, config, *, executor, tier, wb,
                   wal_missing: bool) -> WAL:
    reader = wb.reader
    key = stream_key(name)
    bounds = await _stream_bounds(reader, key)
    base = tier.uploaded_end + 1 if tier is not None else None
    if base is not None:
        end = base - 1 if bounds is None else max(bounds[1], base - 1)
        if bounds is not None and bounds[0] > base and bounds[1] >= base:
            log.error("%s: the durable tier ends at offset %d but the write buffer starts at "
                      "%d: offsets %d..%d were acknowledged before the buffer held them and "
                      "are lost with the previous owner's disk", name, base - 1, bounds[0],
                      base, bounds[0] - 1)
            base = bounds[0]
    start = base if base is not None else (bounds[0] if bounds is not None else 0)
    if not wal_missing:
        wal = await WAL.open(directory, config, start_offset=start, executor=executor)
        last = wal.next_offset - 1
        if base is not None:
            if last == end and (bounds is None or end < bounds[0]
                                or _same_at(wal, end, bounds[2])):
                return wal
            await _set_aside(name, directory, wal, executor,
                             f"the local WAL ends at offset {last}, the acknowledged log (durable "
                             f"tier and write buffer) at {end}, or differs there")
        else:
            if bounds is None or last >= bounds[1]:
                if bounds is not None and last > bounds[1]:
                    # The stream stops short of the WAL (a buffer added to a running
                    # topic): it restarts at the WAL's end, so it never has a hole.
                    await reader.delete(key)
                return wal
            if wal.next_offset >= bounds[0]:
                n = await _replay(name, wal, reader, key, bounds[1])
                log.info("%s: %d message(s) recovered from the write buffer (offsets %d..%d)",
                         name, n, last + 1, wal.next_offset - 1)
                return wal
            await _set_aside(name, directory, wal, executor,
                             f"the local WAL ends at offset {last}, before the write buffer's "
                             f"first offset {bounds[0]}")
    wal = await WAL.open(directory, config, start_offset=start, executor=executor)
    if bounds is not None and bounds[1] >= wal.next_offset:
        t0 = time.monotonic()
        first = wal.next_offset
        n = await _replay(name, wal, reader, key, bounds[1])
        log.info("%s: rebuilt the log from the write buffer: %d message(s), offsets %d..%d, in "
                 "%.2fs", name, n, first, wal.next_offset - 1, time.monotonic() - t0)
    return wal
