"""CRC-32C (danube.codec.crc32c): known vectors, chaining, both C paths vs a Python reference."""

import array
import mmap
import platform
import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from danube.codec.crc32c import crc32c, crc32c_hardware_available, crc32c_software

POLY = 0x82F63B78


def crc32c_bitwise(data, crc=0):
    """The definition, one bit at a time (reflected Castagnoli polynomial)."""
    crc ^= 0xFFFFFFFF
    for b in bytes(data):
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (POLY if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _byte_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (POLY if c & 1 else 0)
        table.append(c)
    return table


_TABLE = _byte_table()


def crc32c_bytewise(data, crc=0):
    """Reference for long inputs: byte-at-a-time, table built here from the bitwise definition."""
    crc ^= 0xFFFFFFFF
    t = _TABLE
    for b in bytes(data):
        crc = (crc >> 8) ^ t[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


BOTH = pytest.mark.parametrize("fn", [crc32c, crc32c_software], ids=["dispatch", "software"])

# RFC 3720 (iSCSI) appendix B.4, the "check" value, and other published CRC-32C vectors.
VECTORS = [
    (b"", 0x00000000),
    (b"123456789", 0xE3069283),
    (b"a", 0xC1D04330),
    (b"abc", 0x364B3FB7),
    (b"The quick brown fox jumps over the lazy dog", 0x22620404),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (bytes.fromhex(
        "01c00000" "00000000" "00000000" "00000000" "14000000" "00000400" "00000014"
        "00000018" "28000000" "00000000" "02000000" "00000000"), 0xD9963A56),
]


@BOTH
@pytest.mark.parametrize("data,expected", VECTORS)
def test_known_vectors(fn, data, expected):
    assert fn(data) == expected
    assert crc32c_bitwise(data) == expected


def test_check_value():
    assert crc32c(b"123456789") == 0xE3069283


@BOTH
def test_empty_input_returns_value_unchanged(fn):
    assert fn(b"") == 0
    assert fn(b"", 0x12345678) == 0x12345678
    assert fn(memoryview(b"abc")[1:1]) == 0


@BOTH
def test_chaining(fn):
    data = bytes(range(256)) * 300
    whole = fn(data)
    for cut in (0, 1, 7, 8, 9, 4096, 24576, len(data) - 1, len(data)):
        assert fn(data[cut:], fn(data[:cut])) == whole
    # Many small pieces.
    crc = 0
    for i in range(0, len(data), 37):
        crc = fn(data[i:i + 37], crc)
    assert crc == whole


def test_value_range():
    with pytest.raises(OverflowError):
        crc32c(b"x", -1)
    with pytest.raises(OverflowError):
        crc32c(b"x", 1 << 32)
    assert crc32c(b"x", 0xFFFFFFFF) == crc32c_bitwise(b"x", 0xFFFFFFFF)


def test_result_is_unsigned_32bit():
    for i in range(200):
        v = crc32c(bytes([i]) * i)
        assert 0 <= v <= 0xFFFFFFFF


def test_hardware_path_on_x86():
    # Genuine platform skips, not a missing tool: elsewhere there is no SSE4.2 flag to compare
    # with (the software path is covered by the other tests).
    if platform.machine() not in ("x86_64", "AMD64", "i686", "i386"):
        pytest.skip("not x86")
    try:
        with open("/proc/cpuinfo") as f:
            has = " sse4_2" in f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    assert crc32c_hardware_available() == has


@BOTH
def test_buffer_types(fn, tmp_path):
    raw = bytes(range(256)) * 5
    expected = crc32c_bitwise(raw)
    assert fn(raw) == expected
    assert fn(bytearray(raw)) == expected
    assert fn(memoryview(raw)) == expected
    assert fn(memoryview(bytearray(raw))) == expected
    assert fn(memoryview(b"xx" + raw + b"yy")[2:-2]) == expected
    assert fn(np.frombuffer(raw, dtype=np.uint8)) == expected
    assert fn(np.frombuffer(raw, dtype=np.uint64).reshape(8, 20)) == expected   # raw bytes
    assert fn(array.array("I", raw)) == expected
    path = tmp_path / "blob"
    path.write_bytes(raw)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert fn(m) == expected


@BOTH
@pytest.mark.parametrize("bad", ["text", 123, None, [1, 2, 3], 1.5, object()])
def test_bad_type(fn, bad):
    with pytest.raises(TypeError):
        fn(bad)


@BOTH
def test_non_contiguous_buffer_rejected(fn):
    with pytest.raises(BufferError):
        fn(memoryview(bytes(100))[::2])
    with pytest.raises((BufferError, ValueError)):   # numpy reports it as ValueError
        fn(np.zeros((10, 10), dtype=np.uint8)[:, 1])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), start=st.integers(0, 15), value=st.integers(0, 2**32 - 1))
def test_paths_agree_with_bitwise_reference(data, start, value):
    buf = memoryview(bytes(start) + data)[start:]   # odd alignments
    expected = crc32c_bitwise(data, value)
    assert crc32c(buf, value) == expected
    assert crc32c_software(buf, value) == expected


# Lengths around the thresholds in the C code: 8-byte words, the 3 x 256 B and 3 x 8 KiB
# interleaved blocks of the hardware path, and the 64 KiB GIL release.
_EDGES = [0, 1, 7, 8, 9, 15, 16, 17, 255, 256, 767, 768, 769, 775, 1535, 1536, 2400, 4095,
          4096, 8192, 24575, 24576, 24577, 24583, 25343, 25344, 49152, 65536, 65537, 73729,
          200000]


@pytest.mark.parametrize("n", _EDGES)
@pytest.mark.parametrize("start", [0, 1, 3, 7])
def test_threshold_lengths(n, start):
    data = random.Random(n * 31 + start).randbytes(n + start)
    view = memoryview(data)[start:]
    expected = crc32c_bytewise(view)
    assert crc32c(view) == expected
    assert crc32c_software(view) == expected


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 120_000), start=st.integers(0, 9), seed=st.integers(0, 2**32),
       value=st.integers(0, 2**32 - 1))
def test_long_inputs_agree(n, start, seed, value):
    data = random.Random(seed).randbytes(n + start)
    view = memoryview(data)[start:]
    hw = crc32c(view, value)
    assert hw == crc32c_software(view, value)
    assert hw == crc32c_bytewise(view, value)


@settings(max_examples=50, deadline=None)
@given(data=st.binary(min_size=0, max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=5))
def test_chaining_property(data, cuts):
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    crc = 0
    for a, b in zip(points, points[1:]):
        crc = crc32c(memoryview(data)[a:b], crc)
    assert crc == crc32c(data) == crc32c_software(data)


def test_threads_with_gil_released():
    data = random.Random(1).randbytes(1 << 20)
    expected = crc32c_software(data)
    results = []

    def work():
        for _ in range(20):
            results.append(crc32c(data))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 80
