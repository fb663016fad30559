"""pytest-benchmark for CRC-32C and the WAL frame codec.

CRC-32C runs on both C paths (SSE4.2 instruction and slicing-by-8), next to zlib.crc32 (CRC-32
IEEE, a different polynomial: a speed reference only) and, when installed, the PyPI `crc32c`
package. The WAL codec runs next to the obvious pure-Python struct loop it replaces.
Each benchmark stores its throughput in extra_info["GB/s"] (see --benchmark-json).

    PYTHONPATH=. .venv/bin/pytest bench/test_bench_codec_crc.py --benchmark-only
"""

import random
import struct
import zlib

import pytest

from danube.codec.crc32c import crc32c, crc32c_hardware_available, crc32c_software
from danube.storage._walframes import encode_frames_into, frame_size, scan_frames

SIZES = {"100B": 100, "4KiB": 4096, "1MiB": 1 << 20}
DATA = {name: random.Random(n).randbytes(n) for name, n in SIZES.items()}
HDR = struct.Struct("<QII")
LEN = struct.Struct("<QI")


def _throughput(benchmark, nbytes):
    if benchmark.stats is None:      # --benchmark-disable: ran once as a smoke test
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["GB/s"] = round(nbytes / mean / 1e9, 3)


def _crc_impls():
    def pypi_crc32c():
        return pytest.importorskip("crc32c").crc32c
    return {
        "danube-hw": lambda: (crc32c if crc32c_hardware_available()
                              else pytest.skip("no hardware CRC32C")),
        "danube-sw": lambda: crc32c_software,
        "zlib-crc32-ieee": lambda: zlib.crc32,
        "pypi-crc32c": pypi_crc32c,
    }


@pytest.mark.parametrize("impl", list(_crc_impls()))
@pytest.mark.parametrize("size", list(SIZES))
def test_crc(benchmark, size, impl):
    fn = _crc_impls()[impl]()
    data = DATA[size]
    benchmark.group = f"crc {size}"
    benchmark(fn, data)
    _throughput(benchmark, len(data))


# ---------------------------------------------------------------- WAL codec

PAYLOADS = [random.Random(i).randbytes(100) for i in range(1000)]
ENCODE_BUF = bytearray(sum(frame_size(len(p)) for p in PAYLOADS))


def test_encode_frames_into_1000x100B(benchmark):
    benchmark.group = "wal encode 1000 x 100 B"
    end = benchmark(encode_frames_into, ENCODE_BUF, 0, 1, PAYLOADS)
    assert end == len(ENCODE_BUF)
    _throughput(benchmark, end)


def test_peer_python_encode_1000x100B(benchmark):
    benchmark.group = "wal encode 1000 x 100 B"
    buf = bytearray(len(ENCODE_BUF))

    def encode():
        pos, off = 0, 1
        for p in PAYLOADS:
            HDR.pack_into(buf, pos, off, len(p), crc32c(p, crc32c(LEN.pack(off, len(p)))))
            buf[pos + 16:pos + 16 + len(p)] = p
            pos += 16 + len(p)
            off += 1
        return pos

    assert benchmark(encode) == len(buf)
    expected = bytearray(len(buf))      # not ENCODE_BUF: another worker may have its test
    encode_frames_into(expected, 0, 1, PAYLOADS)
    assert buf == expected
    _throughput(benchmark, len(buf))


SCAN_PAYLOADS = [random.Random(i).randbytes(100) for i in range(10_000)]
SCAN_BUF = bytearray(sum(frame_size(len(p)) for p in SCAN_PAYLOADS) + 4096)   # zero tail
SCAN_END = encode_frames_into(SCAN_BUF, 0, 1, SCAN_PAYLOADS)


def test_scan_frames_10000x100B(benchmark):
    benchmark.group = "wal scan 10,000 x 100 B"
    offsets, positions, valid_end, status = benchmark(scan_frames, SCAN_BUF)
    assert (len(offsets), valid_end, status) == (10_000, SCAN_END, 0)
    _throughput(benchmark, SCAN_END)


def test_peer_python_scan_10000x100B(benchmark):
    benchmark.group = "wal scan 10,000 x 100 B"
    view = memoryview(SCAN_BUF)

    def scan():
        pos, offsets, positions = 0, [], []
        while pos + 16 <= len(view):
            off, n, crc = HDR.unpack_from(view, pos)
            if off == 0 and n == 0 and crc == 0:
                break
            if crc32c(view[pos + 16:pos + 16 + n], crc32c(view[pos:pos + 12])) != crc:
                break
            offsets.append(off)
            positions.append(pos)
            pos += 16 + n
        return offsets, positions, pos

    offsets, positions, end = benchmark(scan)
    assert (len(offsets), end) == (10_000, SCAN_END)
    _throughput(benchmark, SCAN_END)
