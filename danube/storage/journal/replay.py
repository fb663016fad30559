"""Opening the journal at start: replay what it holds into the topics' WALs, then start it
empty.

Replay reads every journal file in order and, per WAL directory, applies its ``FRAMES``
records (those after its last ``FORGET``) to the directory's WAL, opened as a plain
``always`` WAL: the frames the segment file lacks (a power cut lost its unsynced tail, or
the directory itself) are appended and synced; what it holds already is skipped (a process
crash keeps the page cache, so usually everything is there). A record past a gap in a
topic's offsets cannot have been acknowledged (a WAL's records are committed in order and a
group is acknowledged only whole) and is not applied; that is logged.

Then one ``syncfs`` makes durable whatever else the previous process left in the page
cache (so a WAL opened later need not sync what it recovers: see recovery.py), the sequence
number to continue from is written into the lock file, and the old files go.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from danube.dirsync import sync_filesystem
from danube.storage._walframes import read_frames_into
from danube.storage.journal.journal import (DIRECTORY, Journal, journal_files, lock_journal,
                                            read_next_seq, recycle, write_next_seq)
from danube.storage.journal.records import FORGET, read_records

log = logging.getLogger("danube.storage.journal")


async def open_journal(root: str, *, file_bytes: int, executor,
                       config_for: Callable[[str], object],
                       max_open_segments: int = 1000) -> Journal:
    """Lock the WAL root's journal, replay it (``config_for(key)``: the ``WALConfig`` of the
    WAL directory ``key``, relative to ``root``, for the replay) and start it."""
    loop = asyncio.get_running_loop()
    directory = os.path.join(root, DIRECTORY)
    lock_fd = await loop.run_in_executor(executor, lock_journal, directory)
    try:
        files = await loop.run_in_executor(executor, journal_files, directory)
        if files:
            await replay(root, files, executor, config_for)
        next_seq = max(read_next_seq(lock_fd), files[-1][0] + 1 if files else 1)
        await loop.run_in_executor(executor, _restart_files, root, directory, files, lock_fd,
                                   next_seq)
        journal = Journal(root, lock_fd, file_bytes=file_bytes, first_seq=next_seq,
                          max_open_segments=max_open_segments)
        await loop.run_in_executor(executor, journal.start)
    except BaseException:
        os.close(lock_fd)
        raise
    return journal


def _restart_files(root: str, directory: str, files: list, lock_fd: int,
                   next_seq: int) -> None:
    if files:
        sync_filesystem(root)
    write_next_seq(lock_fd, next_seq)
    recycle(directory, [path for _, path in files])


def _valid_key(key: str) -> bool:
    parts = key.split("/")
    return (bool(key) and not os.path.isabs(key)
            and all(p and p not in (".", "..") for p in parts) and not key.startswith("."))


async def replay(root: str, files: list, executor, config_for) -> dict:
    """Apply the journal ``files`` to the WALs under ``root`` (see the module docstring)."""
    from danube.storage.wal import WAL       # the WAL imports the journal's records

    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    per_key: dict[str, list] = {}
    count = 0
    for seq, path in files:
        records = await loop.run_in_executor(executor, _read_file, path, seq)
        for r in records:
            count += 1
            if not _valid_key(r.key):
                log.warning("WAL journal: ignoring a record for %r (not a WAL directory)",
                            r.key)
            elif r.kind == FORGET:
                per_key.pop(r.key, None)
            else:
                per_key.setdefault(r.key, []).append(r)
    applied = topics = 0
    for key, records in per_key.items():
        directory = os.path.join(root, key)
        wal = await WAL.open(directory, config_for(key), start_offset=records[0].first_offset,
                             executor=executor)
        try:
            added = _apply(wal, key, records)
            if added:
                await wal.sync_to()
                topics += 1
                applied += added
        finally:
            await wal.close()
    report = {"files": len(files), "records": count, "topics": topics, "messages": applied,
              "seconds": round(time.perf_counter() - started, 3)}
    log.info("WAL journal replayed: %s", report)
    return report


def _read_file(path: str, seq: int) -> list:
    with open(path, "rb") as f:
        data = f.read()
    return read_records(data, seq)[0]


def _apply(wal, key: str, records: list) -> int:
    added = 0
    for r in records:
        have = wal.next_offset
        if r.first_offset + r.count <= have:
            continue
        if r.first_offset > have:
            log.error("WAL journal: %s ends at offset %d but the journal's next record starts "
                      "at %d; the records after the gap were never acknowledged and are not "
                      "replayed", key, have - 1, r.first_offset)
            break
        frames: list = []
        try:
            read_frames_into(frames, r.body, 0, len(r.body), r.first_offset, r.count, -1, True)
        except ValueError as exc:
            log.error("WAL journal: a record of %s does not decode (%s); replaying up to it",
                      key, exc)
            break
        if len(frames) != r.count:
            log.error("WAL journal: a record of %s holds %d of its %d frames; replaying up to "
                      "it", key, len(frames), r.count)
            break
        payloads = [p for off, p in frames if off >= have]
        wal.append(payloads)
        added += len(payloads)
    return added
