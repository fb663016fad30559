"""A topic's ownership as its local WAL records it: the owner's epoch in the WAL directory,
checked before each ack when every broker shares the WAL root; and a WAL left behind by an
ownership that ended, set aside, never continued, and in ``storage.failover:
lossy_local_wal`` what it held that the next owner does not is named.

In a cluster each broker that opens a reliable topic's log records itself as the topic's
owner (the placement) and writes its ownership epoch into the WAL directory (``owner_epoch``).
When a broker opens a topic another broker opened since its own last time (it was killed and
came back, or the topic moved away and back), its local WAL is a past ownership's: another
owner has since given other messages the offsets after what it continued from. Continuing
that WAL would put two messages at one offset, so it is moved aside to ``{dir}.stale-{ms}``.

With ``lossy_local_wal`` such a WAL can hold acknowledged messages the next owner never had:
those at or after the offset where the next owner continued (the start of the first segment
a later epoch uploaded, or the durable tier's end when it has uploaded nothing yet; 0
without a durable tier). Their range goes into ``orphaned.json`` beside the set-aside WAL,
a warning names the topic and the offsets, and ``danube admin topics republish-orphaned``
publishes them into the topic again (at least once, at new offsets).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from danube.storage.errors import OwnershipLostError
from danube.storage.tiered.catalog import SegmentDescriptor, object_epoch
from danube.storage.wal import WAL

log = logging.getLogger("danube.storage")

EPOCH_FILE = "owner_epoch"
ORPHANED_FILE = "orphaned.json"
REPUBLISHED_FILE = "republished.json"
STALE_MARK = ".stale-"


def read_epoch(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, EPOCH_FILE), encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def guard_shared_wal(topic_log, directory: str, epoch: int) -> None:
    """A shared WAL root (storage.failover shared_wal_root): the directory's flock keeps a
    second owner out, but a lock on a network file system can be lost (an NFS lease that
    ran out while its holder was paused). Each ack of this owner then reads the epoch file
    the directory holds, which a later owner rewrote when it opened the log, and refuses
    the ack (OwnershipLostError) when it is no longer this owner's. One small read per
    publish call, in this mode only."""
    inner = topic_log.sync_to

    async def sync_to(offset=None):
        result = await inner(offset)
        current = read_epoch(directory)
        if current is not None and current > epoch:
            raise OwnershipLostError(
                f"{topic_log.name}: the shared WAL root names a later owner (epoch "
                f"{current}; this broker's is {epoch}); not acknowledged")
        return result
    topic_log.sync_to = sync_to


def write_epoch(directory: str, epoch: int) -> None:
    """Written before the topic is served; not synced: lost to a power cut, the next opener
    falls back to the owner record alone (the set-aside still happens, its report names
    every offset of the WAL)."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, EPOCH_FILE + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{epoch}\n")
    os.replace(tmp, os.path.join(directory, EPOCH_FILE))


async def continued_from(name: str, tiered, epoch: int | None) -> int:
    """The first offset the next owner gave its own messages: where the first segment of a
    later ownership than ``epoch`` starts, else the durable tier's end + 1 (0 without a
    tier)."""
    if tiered is None:
        return 0
    starts, end = [], -1
    for _key, value in await tiered.metadata.scan(tiered.keys.segments_prefix(name)):
        desc = SegmentDescriptor.from_json(value) if isinstance(value, dict) else None
        if desc is None:
            continue            # the `cur` pointer
        end = max(end, desc.end_offset)
        if epoch is None or object_epoch(desc.object_key) > epoch:
            starts.append(desc.start_offset)
    return min(starts) if starts else end + 1


async def set_aside(name: str, directory: str, config, *, executor, tiered,
                    report: bool) -> dict | None:
    """Move a past ownership's WAL aside; with ``report`` (lossy_local_wal) name what it held
    at or after the next owner's start. Returns the orphaned range (``topic``, ``first``,
    ``last``, ``count``, ``epoch``, ``directory``) or None."""
    epoch = read_epoch(directory)
    wal = await WAL.open(directory, config, executor=executor)
    try:
        first, last = wal.first_offset, wal.next_offset - 1
    finally:
        await wal.close()
    aside = f"{directory}{STALE_MARK}{int(time.time() * 1000)}"
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(executor, os.replace, directory, aside)
    orphaned = None
    if report and last >= first:
        start = max(first, await continued_from(name, tiered, epoch))
        if last >= start:
            orphaned = {"topic": name, "first": start, "last": last,
                        "count": last - start + 1, "epoch": epoch, "directory": aside}
            with open(os.path.join(aside, ORPHANED_FILE), "w", encoding="utf-8") as f:
                json.dump(orphaned, f)
            log.warning("%s: this broker's WAL from an earlier ownership holds offsets "
                        "%d..%d (%d messages, acknowledged under storage.failover "
                        "lossy_local_wal) that the topic's next owner never had; kept in %s. "
                        "Publish them again with `danube admin topics republish-orphaned %s "
                        "--wal-root %s`", name, start, last, last - start + 1, aside, name,
                        os.path.dirname(os.path.dirname(aside)))
    if orphaned is None:
        log.info("%s: the local WAL (offsets %d..%d) is from an earlier ownership; another "
                 "broker owned the topic since: moved it to %s", name, first, last, aside)
    return orphaned


def find_orphaned(wal_root: str, topic: str | None = None) -> list[dict]:
    """The orphaned ranges recorded under ``wal_root`` (not yet republished), oldest
    first; only ``topic``'s when given."""
    found = []
    try:
        namespaces = sorted(os.listdir(wal_root))
    except FileNotFoundError:
        return found
    for ns in namespaces:
        ns_dir = os.path.join(wal_root, ns)
        if not os.path.isdir(ns_dir):
            continue
        for entry in sorted(os.listdir(ns_dir)):
            if STALE_MARK not in entry:
                continue
            path = os.path.join(ns_dir, entry, ORPHANED_FILE)
            try:
                with open(path, encoding="utf-8") as f:
                    record = json.load(f)
            except (OSError, ValueError):
                continue
            record["directory"] = os.path.join(ns_dir, entry)
            if topic is None or record.get("topic") == topic:
                found.append(record)
    return found
