"""The storage-layer half of bench.tiered: the same history read back sequentially from the
local WAL (``WAL.read(offset, READ_BATCH)`` loops) and from each object store, through the
broker's own reader of durable history: a ``HistoryCursor`` over the descriptors
``upload_segment`` returned for the same sealed segments, asked for ``READ_BATCH`` messages
at a time as a dispatcher does, its GETs run in a 4-thread pool as ``TieredStorage.run``
runs them. Runs in the orchestrator's process, while no broker runs; the object-store
servers are the ones the orchestrator started."""

import asyncio
import concurrent.futures
import struct
import time

from danube.storage import WAL, WALConfig
from danube.storage.tiered.catalog import Catalog
from danube.storage.tiered.history import MAX_IN_FLIGHT, HistoryCursor
from danube.storage.tiered.segments import READ_CHUNK, upload_segment

SEQ = struct.Struct("<Q")
TOPIC = "/default/bench-tiered-storage"
READ_BATCH = 1024          # messages per WAL.read / HistoryCursor.read call, for both rows


def make_payloads(first, n, size):
    pad = bytes((i * 7) & 0xFF for i in range(max(0, size - SEQ.size)))
    return [SEQ.pack(i) + pad for i in range(first, first + n)]


def _check(chunk, expect):
    """Raise unless `chunk` holds offsets expect, expect+1, ... with their sequence numbers."""
    for i, (off, payload) in enumerate(chunk):
        if off != expect + i or SEQ.unpack_from(payload)[0] != off:
            raise RuntimeError(f"history mismatch at offset {expect + i}: got offset {off}")


def read_wal(wal, first, last, verify=False):
    """Every message first..last through WAL.read(offset, READ_BATCH); returns the count."""
    off = first
    n = 0
    read = wal.read
    while off <= last:
        got = read(off, READ_BATCH)
        if not got:
            raise RuntimeError(f"WAL.read({off}) returned nothing before offset {last}")
        if verify:
            _check(got, off)
        n += len(got)
        off = got[-1][0] + 1
    return n


class BenchTier:
    """What a HistoryCursor uses of a topic's TopicTier: the catalogue, and the
    TieredStorage's object store, counters and thread pool (``run``, as TieredStorage.run:
    run_in_executor on a pool of its default 4 threads)."""

    def __init__(self, store, descs):
        self.name = TOPIC
        self.catalog = Catalog(descs)
        self.tiered = self

        self.objstore = store
        self.stats = {"read_failures": 0, "history_reads": 0, "history_messages": 0}
        self.executor = concurrent.futures.ThreadPoolExecutor(
            4, thread_name_prefix="bench-tiered")

    async def run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def close(self):
        self.executor.shutdown(wait=True)


async def read_store(tier, verify=False):
    """Every message of the uploaded segments through a fresh HistoryCursor, READ_BATCH at a
    time, from the first offset to the end (the dispatcher's loop: read; on None wait for
    the cursor's wake-up). Returns (messages, GETs)."""
    cat = tier.catalog
    first, end = cat.first_offset, cat.end_offset + 1
    ready = asyncio.Event()
    cursor = HistoryCursor(tier, ready.set)
    gets0, fails0 = tier.stats["history_reads"], tier.stats["read_failures"]
    off = first
    n = 0
    try:
        while off < end:
            got = cursor.read(off, READ_BATCH, end)
            if got is None:
                await ready.wait()
                ready.clear()
                continue
            if verify:
                _check(got, off)
            n += len(got)
            off = got[-1][0] + 1
    finally:
        cursor.close()
    if tier.stats["read_failures"] != fails0:
        raise RuntimeError(f"{tier.stats['read_failures'] - fails0} history reads failed")
    return n, tier.stats["history_reads"] - gets0


def get_only(store, descs):
    """The same bytes fetched with plain ranged GETs of READ_CHUNK, one after another,
    nothing decoded: the transfer alone. Returns the bytes fetched."""
    total = 0
    for desc in descs:
        for pos in range(0, desc.size, READ_CHUNK):
            total += len(store.get(desc.object_key, pos, min(desc.size, pos + READ_CHUNK)))
    return total


def timed(fn, repeats):
    """Seconds of each of `repeats` runs of fn() (after one untimed, verifying run)."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


async def timed_async(fn, repeats):
    """timed() for a coroutine function."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def build_wal(directory, n, size, segment_bytes):
    """A WAL holding n messages of `size` bytes in sealed segments of about segment_bytes."""
    wal = await WAL.open(directory, WALConfig(durability="none",
                                               segment_max_bytes=segment_bytes))
    batch = 1000
    for first in range(0, n, batch):
        wal.append(make_payloads(first, min(batch, n - first), size))
    await wal.rotate()
    await wal.sync_to()
    return wal


def run(stores, directory, n, size, segment_bytes, repeats, progress):
    """`stores`: [(label, kind, ObjectStore)]. Returns the storage-layer results."""
    return asyncio.run(_run(stores, directory, n, size, segment_bytes, repeats, progress))


def _summary(label, kind, n, nbytes, times, extra=None):
    best = min(times)
    med = sorted(times)[len(times) // 2]
    out = {"label": label, "kind": kind, "messages": n, "segment_bytes": nbytes,
           "seconds": times, "best_s": best, "median_s": med,
           "msgs_per_s": n / best, "mb_per_s": nbytes / best / 1e6,
           "msgs_per_s_median": n / med}
    out.update(extra or {})
    return out


async def _run(stores, directory, n, size, segment_bytes, repeats, progress):
    wal = await build_wal(directory, n, size, segment_bytes)
    try:
        sealed = wal.segments()[:-1]
        first, last = sealed[0].first_offset, sealed[-1].last_offset
        nbytes = sum(s.size for s in sealed)
        if last - first + 1 != n:
            raise RuntimeError(f"WAL holds {last - first + 1} messages, expected {n}")
        progress(f"local WAL: {n:,} x {size} B in {len(sealed)} sealed segments, "
                 f"{nbytes / 1e6:.1f} MB ... ")
        if read_wal(wal, first, last, verify=True) != n:
            raise RuntimeError("the WAL read back a different count")
        times = timed(lambda: read_wal(wal, first, last), repeats)
        base = _summary(f"local WAL (WAL.read x {READ_BATCH})", "wal", n, nbytes, times,
                        {"segments": len(sealed), "read_batch": READ_BATCH})
        progress(f"{base['msgs_per_s']:,.0f} msgs/s\n")
        results = [base]
        # The same WAL reopened with verify_reads (every frame's CRC checked, as the history
        # reader does): how much of the difference is the checking rather than the store.
        directory = wal.directory
        await wal.close()
        wal = await WAL.open(directory, WALConfig(durability="none",
                                                   segment_max_bytes=segment_bytes,
                                                   verify_reads=True))
        progress("local WAL, verify_reads (CRC checked) ... ")
        read_wal(wal, first, last, verify=True)
        times = timed(lambda: read_wal(wal, first, last), repeats)
        r = _summary("local WAL, verify_reads", "wal_verify", n, nbytes, times,
                     {"segments": len(sealed)})
        r["vs_wal"] = r["msgs_per_s"] / base["msgs_per_s"]
        progress(f"{r['msgs_per_s']:,.0f} msgs/s\n")
        results.append(r)
        for label, kind, store in stores:
            progress(f"{label}: upload ... ")
            try:
                t0 = time.perf_counter()
                descs = [upload_segment(store, TOPIC, s.path, s.first_offset, s.last_offset,
                                        s.size) for s in sealed]
                up_s = time.perf_counter() - t0
                progress(f"{nbytes / up_s / 1e6:,.0f} MB/s; read ... ")
                tier = BenchTier(store, descs)
                try:
                    got, gets = await read_store(tier, verify=True)
                    if got != n:
                        raise RuntimeError(f"the HistoryCursor returned {got} messages, "
                                           f"expected {n}")
                    times = await timed_async(lambda: read_store(tier), repeats)
                finally:
                    tier.close()
                if get_only(store, descs) != nbytes:
                    raise RuntimeError("ranged GETs returned a different byte count")
                get_times = timed(lambda: get_only(store, descs), repeats)
                r = _summary(label, kind, n, nbytes, times,
                             {"segments": len(descs), "gets": gets,
                              "get_only_s": get_times,
                              "get_only_mb_per_s": nbytes / min(get_times) / 1e6,
                              "read_chunk_bytes": READ_CHUNK, "read_batch": READ_BATCH,
                              "max_in_flight": MAX_IN_FLIGHT,
                              "upload_s": up_s,
                              "upload_mb_per_s": nbytes / up_s / 1e6})
                r["vs_wal"] = r["msgs_per_s"] / base["msgs_per_s"]
                progress(f"{r['msgs_per_s']:,.0f} msgs/s ({r['vs_wal']:.2f} x WAL), GETs "
                         f"alone {r['get_only_mb_per_s']:,.0f} MB/s\n")
                results.append(r)
                for d in descs:
                    store.delete(d.object_key)
            except Exception as exc:  # noqa: BLE001 - reported, the other backends go on
                progress(f"ERROR {exc!r}\n")
                results.append({"label": label, "kind": kind, "error": repr(exc)})
        return results
    finally:
        await wal.close()
