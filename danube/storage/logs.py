"""LogManager: the one owner of the reliable topics' logs' lifecycle on a broker (as Kafka's
LogManager). It holds what the logs share: the threads that do blocking WAL work, the
tiered storage (uploads to the object store, when ``storage.durable`` is set), the write
buffer (``storage.write_buffer``) and the local retention loop. The broker core asks it for
a topic's ``TopicLog`` (``open``) and to delete one (``delete``); it never sees the tiers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import shutil
from typing import Callable, Iterable

from danube.storage.errors import TieredStartupError
from danube.storage.exhaustion import (STATE as EXHAUSTION, descriptor_limits, exhausted,
                                       free_bytes, mount_point)
from danube.storage.ownership import guard_shared_wal, write_epoch
from danube.storage.topic_log import UPLOADED, TopicLog
from danube.storage.wal import ALWAYS, WALConfig
from danube.tasks import TaskSet

log = logging.getLogger("danube.storage")

#: How long after a refusal for lack of descriptors the readiness check still reports it
#: (the descriptors come back as soon as the failed call closed what it had opened).
DESCRIPTOR_PROBLEM_SECONDS = 60.0

#: What retention asks its owner for: (topic name, its log, the lowest offset a
#: subscription still needs) for every open log.
RetainedLogs = Callable[[], Iterable[tuple]]


class LogManager:
    """``cfg``: the broker's configuration (the ``wal_*``, ``durability_for``, ``durable``,
    ``write_buffer`` and ``retention_*`` settings); ``metadata``: the metadata store (the
    durable tier's catalogue)."""

    def __init__(self, cfg, metadata):
        self.cfg = cfg
        self.metadata = metadata
        self.root = cfg.wal_root or os.path.join(cfg.data_dir, "wal")
        # Blocking WAL work (recovery, syncs) of every reliable topic shares these threads.
        self.executor = None
        self.tiered = None              # TieredStorage when storage.mode is not local
        self.write_buffer = None        # WriteBuffer when storage.write_buffer is set
        self.journal = None             # Journal: one group commit for every topic
        self._tasks = TaskSet("logs")      # the retention loop
        #: topic -> messages an earlier ownership's WAL held that the next owner never had
        #: (storage.failover lossy_local_wal; danube.storage.ownership), since start.
        self.orphaned: dict[str, int] = {}

    async def start(self) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="danube-wal")
        if self.uses_journal:
            await self._start_journal()
        if self.cfg.durable is not None:
            await self._start_tiered()
        if self.cfg.write_buffer is not None:
            await self._start_write_buffer()

    @property
    def uses_journal(self) -> bool:
        """Whether reliable topics in mode always share the broker's journal: unless it
        is turned off, or every broker's WALs are in one root (shared_wal_root: a topic's
        WAL must hold its own acknowledged data for the next owner)."""
        return (bool(getattr(self.cfg, "wal_journal", False))
                and getattr(self.cfg, "failover", None) != "shared_wal_root")

    async def _start_journal(self) -> None:
        from danube.storage.journal import open_journal

        def replay_config(key: str) -> WALConfig:
            return dataclasses.replace(self._wal_config("/" + key), durability=ALWAYS,
                                       journal=None)

        self.journal = await open_journal(
            self.root, file_bytes=self.cfg.wal_journal_file_mb << 20, executor=self.executor,
            config_for=replay_config,
            max_open_segments=getattr(self.cfg, "wal_journal_max_open_segments", 1000))

    async def _start_tiered(self) -> None:
        # Imported here: a broker without tiered storage never loads the cloud SDKs.
        from danube.storage.durable.config import open_object_store
        from danube.storage.tiered.manager import TieredStorage

        loop = asyncio.get_running_loop()
        try:
            objstore = await loop.run_in_executor(None, open_object_store, self.cfg.durable)
        except Exception as exc:  # noqa: BLE001 - SDK constructors raise many kinds
            raise TieredStartupError(f"storage.durable: {exc}") from exc
        tiered = TieredStorage(self.cfg.durable, objstore, self.metadata,
                               metadata_prefix=self.cfg.metadata_prefix)
        try:
            await tiered.check()
        except BaseException:
            await tiered.close()
            raise
        self.tiered = tiered
        tiered.start()
        log.info("tiered storage (%s): sealed WAL segments go to %s every %gs",
                 self.cfg.storage_mode, objstore.describe(), tiered.interval)

    async def _start_write_buffer(self) -> None:
        # Imported here: a broker without a write buffer never loads the Redis client.
        from danube.storage.writebuffer import WriteBuffer

        buffer = WriteBuffer(self.cfg.write_buffer)
        await buffer.start()
        self.write_buffer = buffer

    def directory(self, name: str) -> str:
        """Where topic ``/ns/topic``'s WAL lives."""
        ns, short = name.lstrip("/").split("/", 1)
        return os.path.join(self.root, ns, short)

    async def open(self, name: str, epoch: int | None = None,
                   taken_over: bool = False) -> TopicLog:
        """Open (recover) the log of reliable topic ``name``, with its durability from the
        configuration (storage.wal.durability, topic_durability). ``epoch``: this broker's
        ownership epoch of the topic in a cluster (its writes to the write buffer carry it,
        and a later owner's epoch makes the buffer refuse them). ``taken_over``: another
        broker opened the topic since this one last did, so a local WAL here is a past
        ownership's (set aside, see danube.storage.ownership), unless every broker shares the
        WAL root."""
        durability = self.cfg.durability_for(name)
        wal_cfg = self._wal_config(name)
        directory = self.directory(name)
        if taken_over:
            await self.set_aside_past_ownership(name)
        try:
            topic_log = await TopicLog.open(name, directory, wal_cfg,
                                            executor=self.executor, tiered=self.tiered,
                                            write_buffer=self.write_buffer,
                                            ack_after_upload=durability == UPLOADED,
                                            epoch=epoch)
        except OSError as exc:
            # A full disk or the descriptor limit (the WAL's directory, lock, segment and
            # checkpoint files): a typed error naming the volume or the limit.
            err = exhausted(exc, directory, f"open the log of {name}",
                            wal_cfg.segment_initial_bytes)
            if err is None:
                raise
            raise err from exc
        topic_log.durability = durability
        if epoch is not None:
            write_epoch(directory, epoch)
            if self.cfg.failover == "shared_wal_root":
                guard_shared_wal(topic_log, directory, epoch)
        return topic_log

    def _wal_config(self, name: str) -> WALConfig:
        cfg = self.cfg
        durability = cfg.durability_for(name)
        hours = cfg.wal_segment_max_hours
        return WALConfig(durability=ALWAYS if durability == UPLOADED else durability,
                         sync_interval_ms=cfg.wal_sync_interval_ms,
                         segment_max_bytes=cfg.wal_segment_max_bytes,
                         max_age_seconds=hours * 3600 if hours else None,
                         cache_capacity=cfg.wal_cache_capacity,
                         journal=self.journal)

    def local_topics(self) -> list[str]:
        """The topics whose WAL directory is under this broker's WAL root."""
        out = []
        try:
            namespaces = os.listdir(self.root)
        except FileNotFoundError:
            return out
        for ns in namespaces:
            if ns.startswith("."):      # the journal's directory
                continue
            try:
                entries = os.listdir(os.path.join(self.root, ns))
            except (NotADirectoryError, FileNotFoundError):
                continue
            out.extend(f"/{ns}/{e}" for e in entries if ".stale-" not in e
                       and os.path.isdir(os.path.join(self.root, ns, e)))
        return sorted(out)

    async def set_aside_past_ownership(self, name: str) -> dict | None:
        """A local WAL of ``name`` from an ownership another broker has ended: moved aside,
        never continued; in lossy_local_wal what it held that the next owner never had is
        named (a warning, ``orphaned``, ``orphaned.json``). Nothing when every broker shares
        the WAL root (the WAL is the next owner's too) or there is no local WAL."""
        from danube.storage.ownership import set_aside
        from danube.storage.tiered.manager import wal_is_missing

        directory = self.directory(name)
        if self.cfg.failover == "shared_wal_root" or wal_is_missing(directory):
            return None
        if self.journal is not None:
            await self.journal.forget(directory)
        orphaned = await set_aside(name, directory, self._wal_config(name),
                                   executor=self.executor, tiered=self.tiered,
                                   report=self.cfg.failover_is_lossy)
        if orphaned is not None:
            self.orphaned[name] = self.orphaned.get(name, 0) + orphaned["count"]
        return orphaned

    async def discard(self, name: str) -> None:
        """A topic created a moment ago is taken back: its local WAL and buffered entries go
        (nothing of it reached the durable tier yet)."""
        await self._remove_local(name)
        if self.write_buffer is not None:
            await self.write_buffer.delete_topic(name)

    async def delete(self, name: str) -> None:
        """A deleted topic: its WAL, its durable tier's objects and its buffered entries."""
        await self._remove_local(name)
        if self.tiered is not None:
            await self.tiered.delete_topic(name)
        if self.write_buffer is not None:
            await self.write_buffer.delete_topic(name)

    async def delete_released(self, name: str) -> None:
        """A topic deleted while this broker was letting it go (a cluster's move): its WAL
        and its durable tier's objects."""
        await self._remove_local(name)
        if self.tiered is not None:
            await self.tiered.delete_topic(name)

    async def _remove_local(self, name: str) -> None:
        if self.journal is not None:
            await self.journal.forget(self.directory(name))
        await asyncio.get_running_loop().run_in_executor(
            self.executor, shutil.rmtree, self.directory(name), True)

    @property
    def has_durable_tier(self) -> bool:
        return self.tiered is not None

    # -- running out of space or descriptors ---------------------------------------------

    def exhaustion(self) -> dict:
        """What the exporter and the readiness check say about the WAL volume and the
        descriptor limit (read from any thread): ``disk_full`` (the message of the refusal
        while the volume is full, else None), ``free_bytes`` and ``mount_point`` of the WAL
        root's volume, ``refused`` (appends and log openings refused, by reason:
        ``disk_full``, ``descriptor_limit``), ``descriptor_limit`` (the message of a refusal
        for descriptors in the last ``DESCRIPTOR_PROBLEM_SECONDS``, else None) and
        ``nofile_soft``/``nofile_hard`` (RLIMIT_NOFILE; None: unlimited)."""
        full = EXHAUSTION.disk_full_now()
        recent = EXHAUSTION.descriptors_recently(DESCRIPTOR_PROBLEM_SECONDS)
        soft, hard = descriptor_limits()
        return {"disk_full": None if full is None else str(full),
                "free_bytes": free_bytes(self.root), "mount_point": mount_point(self.root),
                "refused": dict(EXHAUSTION.refused),
                "descriptor_limit": None if recent is None else str(recent),
                "nofile_soft": soft, "nofile_hard": hard}

    def problems(self) -> dict:
        """Why the broker is not ready to take publishes, by name (empty: ready)."""
        state = self.exhaustion()
        problems = {}
        if state["disk_full"]:
            problems["disk_full"] = state["disk_full"]
        if state["descriptor_limit"]:
            problems["descriptor_limit"] = state["descriptor_limit"]
        return problems

    # -- retention -----------------------------------------------------------------------

    def start_retention(self, retained: RetainedLogs) -> None:
        """Run the local retention loop (storage.local_retention) over what ``retained``
        names, every retention_check_interval_minutes."""
        self._tasks.spawn(self._enforce_retention(retained), name="retention")

    async def _enforce_retention(self, retained: RetainedLogs) -> None:
        """Delete old sealed WAL segments by age and total size, but never one holding an
        offset a subscription still needs (from its ``keep_from`` on) unless
        ``delete_unconsumed`` is set. By default a stuck subscription therefore keeps its
        backlog on disk; with ``delete_unconsumed`` it loses what retention deleted and
        resumes at the oldest message left."""
        cfg = self.cfg
        while True:
            await asyncio.sleep(cfg.retention_check_interval_minutes * 60)
            uploaded = {}
            if self.tiered is not None:
                try:
                    uploaded = await self.tiered.durable_ends()
                except Exception:  # noqa: BLE001 - tiered topics keep their WAL this pass
                    log.exception("retention: cannot sync the segment catalogue")
            for name, topic_log, keep_from in retained():
                # A log with a durable tier keeps what is not uploaded instead (see
                # TopicLog.retention).
                try:
                    deleted = await topic_log.retention(
                        max_age_seconds=cfg.retention_time_minutes * 60,
                        max_bytes=cfg.retention_size_mb * 1024 * 1024,
                        keep_from_offset=keep_from, force=cfg.retention_delete_unconsumed,
                        durable_ends=uploaded)
                except Exception:  # noqa: BLE001 - retry on the next pass
                    log.exception("retention on %s failed", name)
                    continue
                if deleted:
                    log.info("retention deleted %d WAL segments of %s", len(deleted), name)

    # -- closing -------------------------------------------------------------------------

    async def stop_retention(self) -> None:
        await self._tasks.close()

    async def flush(self, timeout: float) -> bool:
        """Upload every sealed and active segment (a graceful shutdown); True when every
        reliable topic is in the durable tier. Without one, nothing to do."""
        if self.tiered is None:
            return False
        return await self.tiered.flush(timeout)

    async def close(self) -> None:
        """After every log is closed: the durable tier, the write buffer, the threads."""
        await self.stop_retention()
        if self.tiered is not None:
            await self.tiered.close()
        if self.write_buffer is not None:
            await self.write_buffer.close()
        if self.journal is not None:
            await self.journal.close()
            self.journal = None
        if self.executor is not None:
            self.executor.shutdown(wait=True)
