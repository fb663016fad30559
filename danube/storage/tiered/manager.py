"""Tiered storage: sealed WAL segments go to object storage in the background, and history
older than the local WAL is read back from there.

One ``TieredStorage`` per broker owns the object store, a small thread pool for the blocking
SDK calls, and a ``TopicTier`` per reliable topic. Each topic is exported once per interval
(``upload_interval_seconds``), or when its backoff after a failure has run out.

The topics' exports are spread over the interval, each topic on a fixed phase of it (from a
hash of its name), instead of all falling due on the same tick. An export seals the topic's
active segment: syncs and file-system metadata work on the disk the WAL acknowledges from,
and the upload's first reads. With every topic sealed in the same millisecond, publishes
started then waited for all of it: in bench.tiered (two topics, uploads every second) sends
started in the 10 ms after an export were slow 15-25 times as often as on average; with the
exports spread, 5 times. The upload loop sleeps until the next topic falls due.

Export = seal the active segment if it holds data not yet uploaded, then upload every sealed
segment past the catalogue's end, oldest first, writing each descriptor (with the
catalogue's ``cur`` pointer, in one metadata transaction) right after its object. The
catalogue is therefore the resumable checkpoint: after a crash the uploader continues after
the last descriptor, and a segment whose object was put but whose descriptor was not is
detected by the conditional put and adopted, never uploaded twice.

A descriptor is written without an fsync of its own (``durable=False``) when its segment is
durable in the local WAL: a power cut can then lose the descriptor, but not the segment, so
the next export uploads the same segment under the same key, finds the object and adopts it.
(An fsync per descriptor measurably raised the publish p99, since it queues with the WAL's
``fdatasync`` calls on the same disk.) Two things keep that safe: a segment not yet durable
locally (``none`` mode) gets a durable descriptor, because after a power cut its offsets
could be handed out again and must be known to be taken; and local retention, the only thing
that deletes uploaded segments, goes by ``durable_ends()``, which syncs the metadata first.

Nothing on the publish path waits for any of this: appends and syncs touch only the WAL, and
uploads to cloud stores run in a child process (upload_worker) so their SDK work does not
compete with the event loop for the GIL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
from concurrent.futures.process import BrokenProcessPool
import logging
import math
import os
import time
import zlib

from danube.metering import Summary
from danube.storage.durable.base import ObjectStoreConfigError, ObjectStoreError
from danube.storage.errors import (OwnershipLostError, TieredStartupError, UploadFailedError,
                                   WALClosedError)
from danube.storage.segment_files import parse_segment_name
from danube.storage.tiered.catalog import (DEFAULT_METADATA_PREFIX, Catalog, CatalogKeys,
                                           SegmentDescriptor, object_epoch, parse_object_key,
                                           segment_id, topic_object_prefix)
from danube.storage.tiered.segments import SegmentUploadError, upload_segment
from danube.storage.tiered.upload_worker import IN_PROCESS_BACKENDS, ProcessUploader, run_idle
from danube.tasks import TaskSet, cancel_and_wait

log = logging.getLogger("danube.tiered")

TICK = 1.0
#: The upload loop's shortest sleep: topics falling due this close together go together.
MIN_SLEEP = 0.005
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


def export_phase(name: str, interval: float) -> float:
    """Where in each upload interval the topic's exports fall, in seconds: fixed per topic,
    and spread over the interval across topics (see the module docstring)."""
    return zlib.crc32(name.encode()) / 2 ** 32 * interval


class TopicTier:
    """A reliable topic's view of the durable tier."""

    def __init__(self, tiered: TieredStorage, name: str, catalog: Catalog,
                 epoch: int | None = None):
        self.tiered = tiered
        self.name = name
        self.catalog = catalog
        #: This broker's ownership epoch of the topic (a cluster), which its objects' names
        #: carry and its descriptors are written under; None: a single broker.
        self.epoch = epoch
        self.wal = None
        self.lock = asyncio.Lock()          # one export at a time per topic
        self.phase = export_phase(name, tiered.interval)
        self.next_export = 0.0
        self.failures = 0
        self.last_error: str | None = None
        self.closed = False
        # For upstream's danube_cloud_upload_* and danube_durable_history_* metrics.
        self.counts = {"uploaded": 0, "upload_failures": 0, "upload_bytes": 0,
                       "segments_read": 0, "read_bytes": 0}
        #: Called with the catalogue after each segment uploaded (the write buffer's trim).
        self.on_upload = None
        # Durability uploaded: acks waiting for an offset to be uploaded, (offset, seq, fut).
        self._upload_waiters: list = []
        self._waiter_seq = 0
        self.export_again = False

    async def wait_uploaded(self, offset: int) -> None:
        """Return once the catalogue holds ``offset``; the topic is exported at once (what
        is appended while an export runs goes in the next one, so exports are grouped as
        syncs are). Raises ``UploadFailedError`` if the export carrying it fails."""
        if offset <= self.uploaded_end:
            return
        if self.closed:
            raise WALClosedError(f"{self.name}: the topic is closed")
        fut = asyncio.get_running_loop().create_future()
        self._waiter_seq += 1
        heapq.heappush(self._upload_waiters, (offset, self._waiter_seq, fut))
        self.tiered.export_now(self)
        await fut

    @property
    def upload_waiting(self) -> bool:
        return bool(self._upload_waiters)

    def settle_waiters(self, exc: BaseException | None = None) -> None:
        waiters = self._upload_waiters
        while waiters and (exc is not None or waiters[0][0] <= self.uploaded_end):
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)

    @property
    def uploaded_end(self) -> int:
        return self.catalog.end_offset

    @property
    def backlog_segments(self) -> int:
        wal = self.wal
        if wal is None or wal.closed:
            return 0
        return sum(1 for s in wal.segments()[:-1] if s.last_offset > self.uploaded_end)

    def needs_export(self) -> bool:
        wal = self.wal
        return wal is not None and not wal.closed and wal.last_offset > self.uploaded_end

    async def _record(self, desc: SegmentDescriptor, durable: bool) -> None:
        """The descriptor and the `cur` pointer in one transaction (`cur` never names a
        descriptor that is not there); in a cluster only while the topic's ownership epoch
        is still this broker's, so an earlier owner that resumed after a pause cannot add to
        the catalogue the new owner continues from."""
        keys, metadata = self.tiered.keys, self.tiered.metadata
        items = {keys.segment(self.name, desc.start_offset): desc.to_json(),
                 keys.segments_cur(self.name): {"start": f"{desc.start_offset:020d}",
                                                "end_offset": desc.end_offset}}
        if self.epoch is None:
            await metadata.put_many(items, durable=durable)
        elif not await metadata.put_many_if(items, keys.owner_epoch(self.name), self.epoch,
                                            durable=durable):
            self.closed = True
            raise OwnershipLostError(
                f"{self.name}: another broker owns the topic now (its ownership epoch is no "
                f"longer {self.epoch}); segment {desc.start_offset}..{desc.end_offset} is not "
                f"recorded")

    async def export(self, *, seal: bool = True) -> int:
        """Upload every sealed segment not in the catalogue (sealing the active one first
        when ``seal``). Returns how many segments were uploaded; raises on the first
        failure (what was uploaded before it stays recorded)."""
        async with self.lock:
            wal = self.wal
            if wal is None or wal.closed:
                return 0
            if seal and wal.last_offset > self.uploaded_end:
                await wal.rotate()
            done = 0
            for seg in wal.segments()[:-1]:
                if self.closed:
                    break
                if seg.last_offset <= self.uploaded_end or seg.last_offset < seg.first_offset:
                    continue
                if seg.first_offset > self.uploaded_end + 1 and self.catalog.segments:
                    log.warning("%s: offsets %d..%d were never uploaded (deleted locally "
                                "before tiered storage was enabled); the durable history "
                                "has a gap there", self.name, self.uploaded_end + 1,
                                seg.first_offset - 1)
                started = time.perf_counter()
                desc = await self.tiered.upload(self.name, seg.path, seg.first_offset,
                                                seg.last_offset, seg.size, self.epoch)
                await self._record(desc, durable=desc.end_offset > wal.durable_offset)
                self.catalog.add(desc)
                # Upload and descriptor: upstream's "upload and finalize one segment".
                self.tiered.upload_latency_ms.observe((time.perf_counter() - started) * 1000)
                if self.on_upload is not None:
                    self.on_upload(self.catalog)
                self.tiered.stats["segments"] += 1
                self.tiered.stats["bytes"] += desc.size
                self.counts["uploaded"] += 1
                self.counts["upload_bytes"] += desc.size
                done += 1
            self.settle_waiters()
            return done


class TieredStorage:
    def __init__(self, durable_cfg, objstore, metadata, *,
                 metadata_prefix=DEFAULT_METADATA_PREFIX, threads=4):
        self.cfg = durable_cfg
        self.objstore = objstore
        self.metadata = metadata
        self.prefix = metadata_prefix
        self.keys = CatalogKeys(metadata_prefix)
        self.interval = float(durable_cfg.upload_interval_seconds)
        self.executor = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="danube-tiered")
        self.topics: dict[str, TopicTier] = {}
        self.stats = {"segments": 0, "bytes": 0, "failures": 0, "read_failures": 0,
                      "history_reads": 0, "history_messages": 0}
        self.upload_latency_ms = Summary()
        self.list_latency_ms = Summary()
        self.read_errors: dict[str, int] = {}     # reason ("fetch", "decode") -> failures
        self._uploader = (None if durable_cfg.backend in IN_PROCESS_BACKENDS
                          else ProcessUploader(durable_cfg))
        # In-process uploads (the memory store, or a test's wrapped store) run on a thread of
        # their own at idle CPU priority, like the upload child: reading and checking a
        # segment is GIL-free work that should only use a core the broker leaves idle.
        self._upload_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="danube-tiered-upload", initializer=run_idle)
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        # Exports and deletions of objects: cancelled and awaited by close().
        self._tasks = TaskSet("tiered storage")

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def list_objects(self, prefix: str):
        """The store's listing under ``prefix``, timed (upstream's danube_cloud_list_*)."""
        started = time.perf_counter()
        try:
            return await self.run(self.objstore.list, prefix)
        finally:
            self.list_latency_ms.observe((time.perf_counter() - started) * 1000)

    async def upload(self, topic, path, first_offset, last_offset, size, epoch=None):
        if self._uploader is None:
            return await asyncio.get_running_loop().run_in_executor(
                self._upload_thread, upload_segment, self.objstore, topic, path, first_offset,
                last_offset, size, epoch)
        try:
            return await asyncio.wrap_future(
                self._uploader.submit(topic, path, first_offset, last_offset, size, epoch))
        except BrokenProcessPool:
            self._uploader.broken()
            raise ObjectStoreError("the upload worker process died; it is restarted for the "
                                   "next attempt") from None

    # -- lifecycle ------------------------------------------------------------------------

    async def check(self) -> None:
        """Probe the store once at start-up so a wrong endpoint or credential is a clear
        start-up error rather than a stream of upload failures later."""
        try:
            await self.run(self.objstore.check)
        except ObjectStoreConfigError as exc:
            raise TieredStartupError(f"storage.durable: {exc}") from exc
        except ObjectStoreError as exc:
            # The store's messages already say which store and where.
            raise TieredStartupError(f"storage.durable: cannot reach {exc}") from exc

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="tiered-upload")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        await self._tasks.close()
        self.executor.shutdown(wait=True)
        self._upload_thread.shutdown(wait=True)
        if self._uploader is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._uploader.close)
        await asyncio.get_running_loop().run_in_executor(None, self.objstore.close)

    # -- topics ---------------------------------------------------------------------------

    async def load_topic(self, name: str, *, wal_missing: bool,
                         epoch: int | None = None) -> TopicTier:
        """The topic's catalogue from metadata. When metadata has none and the local WAL is
        gone as well (a lost disk), it is rebuilt from the object listing, so the history
        and the next offset survive even that."""
        catalog = Catalog()
        for key, value in await self.metadata.scan(self.keys.segments_prefix(name)):
            desc = SegmentDescriptor.from_json(value) if isinstance(value, dict) else None
            if desc is not None:
                try:
                    catalog.add(desc)
                except ValueError:
                    log.error("%s: ignoring overlapping descriptor %s", name, key)
        if not catalog.segments and wal_missing:
            catalog = await self._rebuild(name)
        tier = TopicTier(self, name, catalog, epoch)
        tier.next_export = self._next_slot(tier, time.monotonic())
        self.topics[name] = tier
        return tier

    async def _rebuild(self, name: str) -> Catalog:
        try:
            infos = await self.list_objects(topic_object_prefix(name))
        except ObjectStoreError as exc:
            log.error("%s: local WAL and catalogue are both missing and the durable store "
                      "cannot be listed (%s); the topic starts at offset 0", name, exc)
            return Catalog()
        catalog = Catalog()
        # Of two objects at one start (an earlier owner's beside the new owner's), the later
        # owner's is the topic's.
        infos = sorted(infos, key=lambda i: ((parse_object_key(i.key) or (-1,))[0],
                                             -object_epoch(i.key)))
        for info in infos:
            span = parse_object_key(info.key)
            if span is None or span[0] <= catalog.end_offset:
                continue
            desc = SegmentDescriptor(segment_id=segment_id(info.key),
                                     object_key=info.key, start_offset=span[0],
                                     end_offset=span[1], size=info.size, etag=info.etag,
                                     created_at=time.time())
            catalog.add(desc)
        # One transaction for the whole rebuilt catalogue.
        await self.metadata.put_many(
            {self.keys.segment(name, d.start_offset): d.to_json()
             for d in catalog.segments})
        if catalog.segments:
            log.warning("%s: rebuilt the durable catalogue from %d objects in %s (offsets "
                        "%d..%d)", name, len(catalog.segments), self.objstore.describe(),
                        catalog.first_offset, catalog.end_offset)
        return catalog

    def forget(self, name: str) -> None:
        tier = self.topics.pop(name, None)
        if tier is not None:
            tier.closed = True
            tier.wal = None
            tier.settle_waiters(WALClosedError(f"{name}: the topic left this broker"))

    async def delete_topic(self, name: str) -> None:
        """A deleted topic's catalogue and objects go too (objects in the background: a
        slow store must not hold up the admin call)."""
        self.forget(name)
        await self.metadata.delete_prefix(self.keys.topic_prefix(name))
        self._tasks.spawn(self._delete_objects(name), name=f"tiered-delete {name}")

    async def _delete_objects(self, name: str) -> None:
        try:
            infos = await self.list_objects(topic_object_prefix(name))
            for info in infos:
                await self.run(self.objstore.delete, info.key)
        except ObjectStoreError as exc:
            log.warning("%s: could not delete its durable objects: %s", name, exc)

    # -- uploading ------------------------------------------------------------------------

    async def _loop(self) -> None:
        if self._uploader is not None:
            try:
                await self.run(self._uploader.warm)
            except Exception as exc:  # noqa: BLE001 - the first upload starts it again
                log.warning("the upload worker process did not start: %r", exc)
                self._uploader.broken()
        while True:
            due = min((t.next_export for t in self.topics.values()), default=math.inf)
            try:
                async with asyncio.timeout(
                        min(TICK, max(MIN_SLEEP, due - time.monotonic()))):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            for tier in list(self.topics.values()):
                if tier.next_export > now:
                    continue
                if not tier.lock.locked() and tier.needs_export():
                    self._tasks.spawn(self._export(tier), name=f"tiered-export {tier.name}")
                    # Not due again before the export has settled its schedule.
                    tier.next_export = math.inf
                else:
                    tier.next_export = self._next_slot(tier, now)

    def export_now(self, tier: TopicTier) -> None:
        """Export ``tier`` now (durability uploaded), or right after the export under way."""
        if tier.lock.locked() or tier.next_export == math.inf:
            tier.export_again = True
            return
        if tier.failures:
            return          # its backoff runs; the retry settles the waiters
        tier.next_export = math.inf
        self._tasks.spawn(self._export(tier), name=f"tiered-export {tier.name}")

    def _next_slot(self, tier: TopicTier, now: float) -> float:
        """The topic's next export time after ``now``: the next point of its own grid,
        ``phase + k * interval``, so its exports stay spread from the other topics' however
        long each one takes."""
        k = math.floor((now - tier.phase) / self.interval) + 1
        return tier.phase + k * self.interval

    async def _export(self, tier: TopicTier) -> None:
        tier.export_again = False
        try:
            n = await tier.export()
        except asyncio.CancelledError:
            raise
        except OwnershipLostError as exc:
            # Not retried: another broker owns the topic; this one is letting it go.
            log.error("%s", exc)
            tier.settle_waiters(exc)
            return
        except Exception as exc:  # noqa: BLE001 - every failure is retried with backoff
            self._failed(tier, exc)
            err = UploadFailedError(f"{tier.name}: upload to {self.objstore.describe()} "
                                    f"failed: {exc}")
            tier.settle_waiters(err)
            return
        tier.settle_waiters()
        if tier.failures:
            log.info("%s: uploads to %s work again after %d failed attempts", tier.name,
                     self.objstore.describe(), tier.failures)
        tier.failures = 0
        tier.last_error = None
        tier.next_export = self._next_slot(tier, time.monotonic())
        if (tier.export_again or tier.upload_waiting) and not tier.closed:
            self.export_now(tier)
        if n:
            log.debug("%s: uploaded %d segment(s), durable up to offset %d", tier.name, n,
                      tier.uploaded_end)

    def _failed(self, tier: TopicTier, exc: BaseException) -> None:
        self.stats["failures"] += 1
        tier.counts["upload_failures"] += 1
        tier.failures += 1
        tier.last_error = f"{type(exc).__name__}: {exc}"
        # Capped lower when uploads are frequent, so a store back from an outage is caught
        # up with soon after.
        cap = min(BACKOFF_MAX, max(5.0, self.interval))
        delay = min(cap, BACKOFF_FIRST * 2 ** (tier.failures - 1))
        tier.next_export = time.monotonic() + delay
        level = logging.WARNING if tier.failures <= 3 or tier.failures % 20 == 0 else \
            logging.DEBUG
        log.log(level, "%s: upload to %s failed (attempt %d, retrying in %.0fs, %d segment(s) "
                "waiting): %s", tier.name, self.objstore.describe(), tier.failures, delay,
                tier.backlog_segments, tier.last_error)

    async def flush(self, timeout: float) -> bool:
        """Seal and upload everything (graceful shutdown). Returns True when every reliable
        topic's data is in the durable store; what could not be uploaded stays in the local
        WAL and goes up after the next start."""
        tiers = [t for t in self.topics.values() if t.needs_export()]
        if not tiers:
            return True
        results = []
        try:
            async with asyncio.timeout(timeout):
                results = await asyncio.gather(*(t.export() for t in tiers),
                                               return_exceptions=True)
        except TimeoutError:
            log.error("shutdown: uploads to %s did not finish within %.0fs",
                      self.objstore.describe(), timeout)
            return False
        ok = True
        for tier, result in zip(tiers, results):
            if isinstance(result, BaseException):
                ok = False
                log.error("shutdown: %s could not be uploaded to %s (%s); it stays in the "
                          "local WAL and is uploaded after the next start", tier.name,
                          self.objstore.describe(), result)
        return ok

    async def durable_ends(self) -> dict[str, int]:
        """Each topic's uploaded end whose descriptors are durable in metadata: what local
        retention may delete up to. Raises ``MetadataError`` if the metadata cannot sync."""
        ends = {name: tier.uploaded_end for name, tier in self.topics.items()}
        await self.metadata.sync()
        return ends

    def backlog(self) -> int:
        return sum(t.backlog_segments for t in self.topics.values())


def wal_is_missing(directory: str) -> bool:
    """True when a topic's WAL directory holds no segment (lost disk, or a topic that moved
    here)."""
    try:
        return not any(parse_segment_name(n) is not None for n in os.listdir(directory))
    except FileNotFoundError:
        return True


__all__ = ["TieredStorage", "TopicTier", "TieredStartupError", "SegmentUploadError",
           "wal_is_missing"]
