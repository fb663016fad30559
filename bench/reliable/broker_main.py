"""The broker for bench.reliable: `python -m danube broker ...` unchanged, except that the
WAL's fdatasync (danube.storage.wal.group_commit._fdatasync, the one syscall a group commit
makes per segment) is wrapped to count the calls and the time spent in them. The totals are
kept in a 16-byte file the orchestrator maps: <u64 calls><u64 ns in fdatasync>, updated after
every call. Run only by bench.reliable.runner:

    python -P -m bench.reliable.broker_main COUNTER_FILE broker --mode standalone ...
"""

import mmap
import os
import struct
import sys
import threading
import time

#: Upper bounds (ms) of the duration histogram's buckets; the last bucket is open.
BUCKETS_MS = (0.5, 1, 2, 5, 10, 20)
COUNTER = struct.Struct(f"<QQ{len(BUCKETS_MS) + 1}Q")


def read_counter(path):
    """(fdatasync calls, seconds spent in them, [calls per duration bucket]) from a counter
    file; None if unreadable."""
    try:
        with open(path, "rb") as f:
            prev = None
            for _ in range(5):          # written without a lock: read until stable
                f.seek(0)
                cur = f.read(COUNTER.size)
                if cur == prev:
                    break
                prev = cur
    except OSError:
        return None
    if len(prev) != COUNTER.size:
        return None
    calls, ns, *hist = COUNTER.unpack(prev)
    return calls, ns / 1e9, hist


def install(path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.ftruncate(fd, COUNTER.size)
    mm = mmap.mmap(fd, COUNTER.size)
    os.close(fd)

    from danube.storage.wal import group_commit as wal

    real = wal._fdatasync
    lock = threading.Lock()
    state = [0] * (2 + len(BUCKETS_MS) + 1)
    bounds = [int(b * 1e6) for b in BUCKETS_MS]
    clock = time.perf_counter_ns
    pack_into = COUNTER.pack_into

    def counted_fdatasync(fd):
        t = clock()
        try:
            real(fd)
        finally:
            dt = clock() - t
            bucket = 0
            while bucket < len(bounds) and dt >= bounds[bucket]:
                bucket += 1
            with lock:
                state[0] += 1
                state[1] += dt
                state[2 + bucket] += 1
                pack_into(mm, 0, *state)

    wal._fdatasync = counted_fdatasync


def main():
    install(sys.argv[1])
    from danube.cli.main import main as danube_main
    return danube_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
