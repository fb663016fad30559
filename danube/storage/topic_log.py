"""A reliable topic's log: its WAL and, when storage is tiered, its durable tier, as one.

The broker sees one object per reliable topic. Messages are appended to the WAL (the same
calls, batch forms and costs as the WAL's own: ``append``, ``append_packed``, ``sync_to`` are
the WAL's bound methods), and read back from the hot-tail cache, then the WAL's segment files,
then the durable tier for offsets the local WAL no longer holds (``reader``). Opening the log
(``TopicLog.open``) reconciles the two: the WAL continues after what the durable tier holds,
and a local WAL older than that is set aside.

Reads come in two forms, because the tiers differ in kind. ``read`` is the local log:
synchronous, and it raises ``OffsetTruncatedError`` below the WAL's first offset. A
``TopicLogReader`` (one per subscription) reads every tier: history comes from object storage
through ranged GETs that stream ahead of the reader, so its ``read`` may return None while
bytes are on their way and calls ``on_ready`` when they land.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from typing import Callable

from danube.storage.errors import OffsetTruncatedError
from danube.storage.wal import ALWAYS, WAL, WALConfig
from danube.storage.writebuffer.warm import MISS as _MISS

log = logging.getLogger("danube.storage")

#: The durability mode that acknowledges a message once it is in the durable tier (the WAL
#: itself syncs as in ``always``): storage.wal.durability / topic_durability ``uploaded``.
UPLOADED = "uploaded"

#: How long closing a topic waits for its write buffer to confirm what it holds.
BUFFER_CLOSE_TIMEOUT = 5.0

#: upload_all's backoff between attempts (first, max), seconds.
UPLOAD_RETRY = (0.1, 2.0)


class TopicLog:
    """Open one with ``await TopicLog.open(...)``. ``wal`` is the local WAL; ``tier`` the
    topic's ``TopicTier`` (its catalogue and uploads) when storage is tiered, else None."""

    def __init__(self, name: str, wal: WAL, tier=None, buffer=None):
        self.name = name
        self.wal = wal
        self.tier = tier
        #: The topic's ``TopicBuffer`` when ``storage.write_buffer`` is set, else None.
        self.buffer = buffer
        self._uploads_stopped = False
        # Upstream's danube_wal_reader_create_total{mode} and
        # danube_handoff_durable_history_to_hot_total.
        self.readers_created = {"wal_only": 0, "durable_history_then_hot": 0}
        self.handoffs_to_hot = 0
        # The WAL's own bound methods: the publish path calls them with no extra frame.
        self.append = wal.append
        self.append_packed = wal.append_packed
        self.append_durable = wal.append_durable
        self.sync_to = wal.sync_to
        self.read = wal.read
        self.wait_for = wal.wait_for
        if buffer is not None:
            self.append = self._append_buffered
            self.append_packed = self._append_packed_buffered
            self.sync_to = self._sync_to_buffered
            self.append_durable = self._append_durable_waiting
            self._wal_syncs = wal.mode == ALWAYS
            if tier is not None:
                tier.on_upload = self._uploaded
        self.ack_after_upload = False
        #: Whether a publish waits for ``sync_to`` before its ack (and delivery for
        #: ``durable_offset``): durability ``always``, a write buffer, or ``uploaded``.
        self.ack_waits = wal.mode == ALWAYS or buffer is not None

    def _wait_for_upload(self) -> None:
        """Durability ``uploaded``: ``sync_to`` (so the ack) also waits until the durable
        tier holds the offset; the topic is exported as soon as anything waits."""
        self.ack_after_upload = True
        self.ack_waits = True
        self._sync_local = self.sync_to
        self.sync_to = self._sync_to_uploaded
        self.append_durable = self._append_durable_waiting

    async def _append_durable_waiting(self, payloads) -> tuple[int, int]:
        """``append``, then wait for what an ack needs (``sync_to``)."""
        first, last = self.append(payloads)
        if last >= first:
            await self.sync_to(last)
        return first, last

    async def _sync_to_uploaded(self, offset: int | None = None) -> int:
        if offset is None:
            offset = self.wal.next_offset - 1
        await self._sync_local(offset)
        await self.tier.wait_uploaded(offset)
        return self.durable_offset

    @classmethod
    async def open(cls, name: str, directory: str, config: WALConfig, *,
                   executor: concurrent.futures.Executor | None = None,
                   tiered=None, write_buffer=None,
                   ack_after_upload: bool = False, epoch: int | None = None) -> TopicLog:
        """Recover the topic's WAL in ``directory`` and, with ``tiered`` (the broker's
        ``TieredStorage``), load its durable catalogue and register it for uploads. With
        ``write_buffer`` (the broker's ``WriteBuffer``) the log continues from the durable
        tier and the buffer's tail (``danube.storage.writebuffer.rebuild``). With
        ``ack_after_upload`` (durability ``uploaded``), ``sync_to`` waits for the upload.

        A WAL that is missing (a lost disk, a topic that moved here) continues right after
        the durable history. A WAL that ends before it (a restored backup, a stale disk)
        would give two messages one offset: it is moved aside to ``{directory}.stale-{time}``
        for inspection and a new one continues after the durable history."""
        if ack_after_upload and tiered is None:
            raise ValueError("durability uploaded needs a durable tier")
        log = await cls._open(name, directory, config, executor=executor, tiered=tiered,
                              write_buffer=write_buffer, epoch=epoch)
        if ack_after_upload:
            log._wait_for_upload()
        return log

    @classmethod
    async def _open(cls, name, directory, config, *, executor, tiered, write_buffer,
                    epoch=None):
        if write_buffer is not None:
            return await cls._open_buffered(name, directory, config, executor=executor,
                                            tiered=tiered, write_buffer=write_buffer,
                                            epoch=epoch)
        if tiered is None:
            return cls(name, await WAL.open(directory, config, executor=executor))
        from danube.storage.tiered.manager import wal_is_missing
        tier = await tiered.load_topic(name, wal_missing=wal_is_missing(directory),
                                       epoch=epoch)
        start = tier.uploaded_end + 1
        wal = await WAL.open(directory, config, start_offset=start, executor=executor)
        if wal.next_offset < start:
            await wal.close()
            aside = f"{directory}.stale-{int(time.time())}"
            await asyncio.get_running_loop().run_in_executor(executor, os.replace, directory,
                                                             aside)
            log.warning("%s: local WAL ends at offset %d but the durable tier holds up to %d; "
                        "moved the local WAL to %s and continuing at %d", name,
                        wal.next_offset - 1, start - 1, aside, start)
            wal = await WAL.open(directory, config, start_offset=start, executor=executor)
        if tier.uploaded_end >= 0 or wal.next_offset:
            log.info("%s: durable tier holds offsets up to %d, local WAL %d..%d", name,
                     tier.uploaded_end, wal.first_offset, wal.next_offset - 1)
        tier.wal = wal
        return cls(name, wal, tier)

    @classmethod
    async def _open_buffered(cls, name, directory, config, *, executor, tiered,
                             write_buffer, epoch=None) -> TopicLog:
        from danube.storage.tiered.manager import wal_is_missing
        from danube.storage.writebuffer.rebuild import open_wal

        if epoch is not None:
            # Before the stream is read: a previous owner still running (paused past its
            # lease) can add nothing to it from now on.
            await write_buffer.claim(name, epoch)
        missing = wal_is_missing(directory)
        tier = None if tiered is None else await tiered.load_topic(name, wal_missing=missing,
                                                                   epoch=epoch)
        wal = await open_wal(name, directory, config, executor=executor, tier=tier,
                             wb=write_buffer, wal_missing=missing)
        if tier is not None:
            tier.wal = wal
        return cls(name, wal, tier, write_buffer.topic(name, wal.next_offset, epoch))

    # -- the write buffer ----------------------------------------------------------------

    def _append_buffered(self, payloads) -> tuple[int, int]:
        """``WAL.append``, then the batch to the write buffer (checked for room first, so a
        refused append stores nothing)."""
        buf = self.buffer
        buf.check_room(sum(map(len, payloads)))
        first, last = self.wal.append(payloads)
        buf.add(first, payloads)
        return first, last

    def _append_packed_buffered(self, data, ends) -> tuple[int, int]:
        buf = self.buffer
        buf.check_room(len(data))
        first, last = self.wal.append_packed(data, ends)
        buf.add_packed(first, data, ends)
        return first, last

    async def _sync_to_buffered(self, offset: int | None = None) -> int:
        """Return once ``offset`` is in the write buffer (replicated as configured) and, in
        durability ``always``, synced in the WAL: the two run at once."""
        if offset is None:
            offset = self.wal.next_offset - 1
        if self._wal_syncs and offset > self.wal.durable_offset:
            await asyncio.gather(self.wal.sync_to(offset), self.buffer.wait(offset))
        else:
            await self.buffer.wait(offset)
        return self.durable_offset

    def _uploaded(self, catalog) -> None:
        """A segment reached the durable tier: drop the buffer's entries below the last
        ``max_cached_closed_segments`` uploaded segments (kept as a warm copy)."""
        buf = self.buffer
        keep = buf.cached_segments
        segments = catalog.segments
        if keep and len(segments) > keep:
            below = segments[-keep].start_offset
        elif keep:
            return
        else:
            below = catalog.end_offset + 1
        buf.request_trim(below)

    def _trim_local(self) -> None:
        """No durable tier: the stream keeps the active segment and the last
        ``max_cached_closed_segments`` closed ones (upstream's rule), so it stays bounded."""
        segments = self.wal.segments()
        keep = self.buffer.cached_segments
        if len(segments) > keep + 1:
            self.buffer.request_trim(segments[-(keep + 1)].first_offset)

    # -- offsets -------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets."""
        return self.wal.next_offset

    @property
    def latest(self) -> int:
        """The newest offset (-1 before any message)."""
        return self.wal.next_offset - 1

    @property
    def earliest(self) -> int:
        """The oldest offset a reader can get: the durable tier's first when it holds
        history, else the WAL's first (``next_offset`` when the log holds nothing)."""
        if self.tier is not None:
            first = self.tier.catalog.first_offset
            if first is not None:
                return min(first, self.wal.first_offset)
        return self.wal.first_offset

    @property
    def first_offset(self) -> int:
        """The oldest offset in the local WAL."""
        return self.wal.first_offset

    @property
    def durable_offset(self) -> int:
        """The newest offset a completed WAL sync covers; with a write buffer, also
        confirmed by it (in durability ``always``, both)."""
        buf = self.buffer
        if buf is None:
            durable = self.wal.durable_offset
        elif self._wal_syncs:
            durable = min(self.wal.durable_offset, buf.confirmed)
        else:
            durable = buf.confirmed
        if self.ack_after_upload:
            return min(durable, self.tier.uploaded_end)
        return durable

    @property
    def directory(self) -> str:
        return self.wal.directory

    @property
    def closed(self) -> bool:
        return self.wal.closed

    def stats(self) -> dict:
        """Where the log's messages are, for operators: offset ranges are [start, end), with
        the names of danube_ext.LogStats (the durable tier's all zero without one)."""
        segments = [] if self.wal.closed else self.wal.segments()
        stats = {"end_offset": self.wal.next_offset,
                 "synced_end_offset": self.wal.durable_offset + 1,
                 "wal_start_offset": self.wal.first_offset,
                 "wal_bytes": sum(s.size for s in segments), "wal_segments": len(segments),
                 "tiered": self.tier is not None}
        if self.tier is not None:
            catalog = self.tier.catalog
            first = catalog.first_offset
            stats.update(tier_start_offset=0 if first is None else first,
                         tier_end_offset=catalog.end_offset + 1,
                         tier_bytes=sum(d.size for d in catalog.segments),
                         tier_objects=len(catalog.segments))
        return stats

    # -- reading every tier --------------------------------------------------------------

    def reader(self, on_ready: Callable[[], None]) -> TopicLogReader:
        """A reader of every tier, for one consumer of the log (a subscription)."""
        self.readers_created["wal_only"] += 1
        return TopicLogReader(self, on_ready)

    # -- retention -----------------------------------------------------------------------

    async def retention(self, max_age_seconds: float | None = None,
                        max_bytes: int | None = None, keep_from_offset: int | None = None,
                        *, force: bool = False, durable_ends: dict[str, int] | None = None):
        """Delete the oldest local WAL segments past the limits (see ``WAL.retention``).

        With a durable tier, readers behind the local WAL read from it, so what is uploaded
        (and recorded for good: ``durable_ends``, from ``TieredStorage.durable_ends``) may
        go and the rest stays, whatever ``keep_from_offset`` and ``force`` say; a topic
        missing from ``durable_ends`` keeps its WAL this time. Returns what was deleted."""
        if self.tier is None and self.buffer is not None:
            self._trim_local()
        if self.tier is not None:
            end = (durable_ends or {}).get(self.name)
            if end is None:
                return []
            keep_from_offset, force = end + 1, False
        return await self.wal.retention(max_age_seconds=max_age_seconds, max_bytes=max_bytes,
                                        keep_from_offset=keep_from_offset, force=force)

    # -- closing -------------------------------------------------------------------------

    async def upload_all(self, timeout: float) -> bool:
        """A graceful move: seal the active segment and upload every offset appended so far
        to the durable tier, where the next owner continues from (its own WAL does not have
        them). A failed upload is tried again, with backoff, until ``timeout``: handing the
        topic over with acknowledged messages missing from the tier would let the next owner
        give their offsets to new messages. True once the tier holds everything (always,
        without a tier); the caller must have stopped appends first."""
        tier = self.tier
        if tier is None:
            return True
        deadline = time.monotonic() + timeout
        delay = UPLOAD_RETRY[0]
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await tier.export()
            except (TimeoutError, asyncio.TimeoutError):
                pass
            except Exception as exc:  # noqa: BLE001 - tried again until the deadline
                log.warning("%s: uploading its last segments failed (%s); retrying", self.name,
                            exc)
            if tier.uploaded_end >= self.wal.last_offset:
                return True
            if self.wal.closed or tier.closed or time.monotonic() + delay > deadline:
                log.error("%s: offsets %d..%d are not in the durable tier after %.0fs; the "
                          "next owner continues without them", self.name,
                          tier.uploaded_end + 1, self.wal.last_offset, timeout)
                return False
            await asyncio.sleep(delay)
            delay = min(UPLOAD_RETRY[1], delay * 2)

    def stop_uploads(self) -> None:
        """The topic is leaving this broker: no upload of it starts from now on (the log
        stays readable and writable until ``close``)."""
        if self.tier is not None and not self._uploads_stopped:
            self._uploads_stopped = True
            self.tier.tiered.forget(self.name)

    async def close(self) -> None:
        """Stop uploads, let the write buffer confirm what it holds (a few seconds at most),
        and close the WAL (a last sync and checkpoint). Idempotent."""
        self.stop_uploads()
        if self.buffer is not None and not self.buffer.detached:
            if not await self.buffer.flush(BUFFER_CLOSE_TIMEOUT):
                log.warning("%s: the write buffer did not confirm offsets %d..%d before the "
                            "topic closed; they are in the local WAL", self.name,
                            self.buffer.confirmed + 1, self.buffer.appended)
            self.buffer.detach()
        await self.wal.close()

    def __repr__(self) -> str:
        tier = "" if self.tier is None else f" durable up to {self.tier.uploaded_end}"
        return f"<TopicLog {self.name} {self.wal!r}{tier}>"


class TopicLogReader:
    """Reads a topic's log from any offset on: the local WAL where it holds the offset, else
    the durable tier, handing over from one to the other as the reader moves on."""

    def __init__(self, topic_log: TopicLog, on_ready: Callable[[], None]):
        self._log = topic_log
        self._on_ready = on_ready
        self._history = None             # HistoryCursor, once history is read
        self._in_history = False         # the last read was served by the durable tier
        self._warm = None                # WarmCursor, once the write buffer is read

    def read(self, offset: int, max_messages: int) -> list | None:
        """Up to ``max_messages`` ``(offset, payload)`` from ``offset`` on; empty at the head
        of the log; None while history is being fetched (``on_ready`` follows). Raises
        ``OffsetTruncatedError`` (with where the log resumes) for offsets no tier holds."""
        wal = self._log.wal
        first = wal.first_offset
        if offset >= first or offset < 0 or wal.closed:
            if self._in_history:
                self._in_history = False
                self._log.handoffs_to_hot += 1
            return wal.read(offset, max_messages)
        if self._log.buffer is not None:
            got = self._read_warm(offset, max_messages, first)
            if got is not _MISS:
                return got
        tier = self._log.tier
        if tier is None:
            raise OffsetTruncatedError(offset, first)
        if self._history is None:
            from danube.storage.tiered.history import HistoryCursor
            self._history = HistoryCursor(tier, self._on_ready)
            self._log.readers_created["durable_history_then_hot"] += 1
        self._in_history = True
        return self._history.read(offset, max_messages, first)

    def _read_warm(self, offset, max_messages, first):
        if self._warm is None:
            from danube.storage.writebuffer.warm import WarmCursor
            self._warm = WarmCursor(self._log.buffer, self._on_ready)
        return self._warm.read(offset, max_messages, first)

    def close(self) -> None:
        if self._history is not None:
            self._history.close()
        if self._warm is not None:
            self._warm.close()
