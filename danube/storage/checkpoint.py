"""The WAL checkpoint: a small JSON file that speeds up recovery and remembers what the
segment files alone cannot (the next offset once every segment is gone, segment ages, which
sealed segments were synced).

It is a hint, never trusted over the data: recovery validates every segment it serves with
``scan_frames``; a checkpoint that is missing, unreadable or fails its CRC is ignored with a
warning. It is replaced atomically (write ``wal.ckpt.tmp``, fsync it, rename over
``wal.ckpt``, fsync the directory), so a crash leaves either the old or the new one.

Layout (``version`` 1)::

    {"checkpoint": {
        "version": 1,
        "first_offset": 0,          # first offset retained locally
        "next_offset": 1234,        # offset the next append gets
        "durable_offset": 1233,     # last offset covered by a completed sync (-1: none)
        "segments": [               # sealed segments, oldest first
            {"name": "wal.00000000000000000000.log", "first_offset": 0, "last_offset": 999,
             "size": 116000, "created_at": 1.7e9, "sealed_at": 1.7e9, "synced": true}],
        "active": {"name": "wal.00000000000000001000.log", "first_offset": 1000,
                   "created_at": 1.7e9},
        "written_at": 1.7e9},
     "crc32": 123456789}           # zlib.crc32 of the canonical JSON of "checkpoint"
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from typing import Any

from danube.dirsync import fsync_dir  # noqa: F401 - the WAL's modules import it from here

CHECKPOINT_NAME = "wal.ckpt"
CHECKPOINT_TMP_NAME = "wal.ckpt.tmp"
VERSION = 1

log = logging.getLogger("danube.storage.wal")


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()




def write_checkpoint(directory: str, body: dict[str, Any], durable: bool = True) -> None:
    """Atomically replace the directory's checkpoint with ``body`` (blocking: run it off the
    event loop). ``durable`` False: without the fsyncs (a WAL under the journal, whose trim
    syncs the file system; a checkpoint lost or torn by a power cut is ignored, it is a
    hint)."""
    data = json.dumps({"checkpoint": body, "crc32": zlib.crc32(_canonical(body))},
                      indent=1).encode() + b"\n"
    tmp = os.path.join(directory, CHECKPOINT_TMP_NAME)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, CHECKPOINT_NAME))
    if durable:
        fsync_dir(directory)


def read_checkpoint(directory: str) -> dict[str, Any] | None:
    """The checkpoint's body, or None when there is none or it cannot be trusted."""
    path = os.path.join(directory, CHECKPOINT_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        body = doc["checkpoint"]
        if not isinstance(body, dict):
            raise ValueError("checkpoint body is not an object")
        if zlib.crc32(_canonical(body)) != doc["crc32"]:
            raise ValueError("CRC mismatch")
        if body.get("version") != VERSION:
            raise ValueError(f"unknown version {body.get('version')!r}")
        for key, low in (("first_offset", 0), ("next_offset", 0), ("durable_offset", -1)):
            value = body.get(key)
            if not isinstance(value, int):
                raise ValueError(f"{key} missing")
            # Offsets are signed 64-bit integers in the frame scanner (MAX_OFFSET of
            # segment_files, which imports this module).
            if not low <= value <= 2**63 - 1:
                raise ValueError(f"{key} {value} out of range")
        if not isinstance(body.get("segments"), list):
            raise ValueError("segments missing")
        # Recovery looks entries up by name: each must be an object with a string name.
        active = [body["active"]] if body.get("active") is not None else []
        for entry in [*body["segments"], *active]:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise ValueError(f"segment entry {str(entry)[:80]} is not an object with a "
                                 f"name")
        return body
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("WAL %s: ignoring checkpoint %s: %s", directory, path, exc)
        return None


def remove_stale_tmp(directory: str) -> None:
    """Drop a half-written checkpoint left by a crash."""
    try:
        os.unlink(os.path.join(directory, CHECKPOINT_TMP_NAME))
    except FileNotFoundError:
        pass


def build_checkpoint(segments, next_offset: int, durable_offset: int, now: float,
                     synced_now=()) -> dict[str, Any]:
    """The checkpoint body for ``segments`` (oldest first; the last one is active).
    ``synced_now`` are segments the job writing this checkpoint syncs first."""
    sealed, active = segments[:-1], segments[-1]
    return {
        "version": VERSION,
        "first_offset": segments[0].base,
        "next_offset": next_offset,
        "durable_offset": durable_offset,
        "segments": [{"name": s.name, "first_offset": s.base, "last_offset": s.last_offset,
                      "size": s.write_pos, "created_at": s.created_at,
                      "sealed_at": s.sealed_at,
                      "synced": s.synced_pos >= s.write_pos or s in synced_now}
                     for s in sealed],
        "active": {"name": active.name, "first_offset": active.base,
                   "created_at": active.created_at},
        "written_at": now,
    }
