"""The disk's limit for durable appends, measured the plainest way: a Python loop that
appends the same bytes a batch of WAL frames takes (`count` frames of 16-byte header +
payload) to a file with os.write and calls os.fdatasync after each batch. Nothing else:
no framing work per batch (the batch is built once), no event loop, no threads. Run only by
bench.reliable.runner, in its own process:

    python -P -m bench.reliable.plainloop '<json config>'

Config: path, frame_bytes (one message's frame), count (frames per batch), warmup_s,
duration_s, keep (leave the file in place at the end; by default it is deleted). Prints one
JSON line: batches and bytes in the measured window, and the fdatasync latencies.
"""

import json
import os
import struct
import sys
import time
from array import array

from bench.e2e.common import percentiles

FRAME_HEADER = struct.Struct("<QIIQ")   # WAL frame header (offset, len, crc) + a seq stamp


def build_batch(frame_bytes, count):
    """`count` frames, each `frame_bytes` long: [u64 offset][u32 len][u32 crc][payload]."""
    payload_len = frame_bytes - 16
    pad = b"x" * max(0, payload_len - 8)
    return b"".join(FRAME_HEADER.pack(i, payload_len, 0, i) + pad for i in range(count))


def main():
    cfg = json.loads(sys.argv[1])
    batch = build_batch(cfg["frame_bytes"], cfg["count"])
    fd = os.open(cfg["path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    write, fdatasync = os.write, os.fdatasync
    clock = time.perf_counter_ns
    view = memoryview(batch)
    size = len(batch)
    lat = array("q")
    batches = 0
    syncs_ns = 0
    t0 = clock()
    ws = t0 + int(cfg["warmup_s"] * 1e9)
    we = ws + int(cfg["duration_s"] * 1e9)
    try:
        while True:
            t = clock()
            if t >= we:
                break
            done = 0
            while done < size:
                done += write(fd, view[done:])
            s = clock()
            fdatasync(fd)
            e = clock()
            if t >= ws:
                batches += 1
                syncs_ns += e - s
                lat.append(e - t)
        window = (clock() - ws) / 1e9
    finally:
        os.close(fd)
        if not cfg.get("keep"):
            try:
                os.unlink(cfg["path"])
            except OSError:
                pass
    print(json.dumps({
        "batch_bytes": size, "messages_per_batch": cfg["count"], "window_s": window,
        "batches": batches, "batches_per_s": batches / window,
        "msgs_per_s": batches * cfg["count"] / window,
        "mb_per_s": batches * size / window / 1e6,
        "fdatasync_busy": syncs_ns / 1e9 / window,
        "write_fdatasync_ms": percentiles(lat)}), flush=True)


if __name__ == "__main__":
    main()
