"""The WAL's per-message helpers in danube.storage._walframes: measure_frames, encode_frames_indexed,
encode_frames_packed, read_frames(_into), last_nonzero, TailCache."""

import random
from array import array

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from danube.storage._tailcache import TailCache
from danube.storage._walframes import (MAX_PAYLOAD, FrameError,
                                       encode_frames_indexed, encode_frames_into,
                                       encode_frames_packed, frame_size, last_nonzero,
                                       measure_frames, read_frames, read_frames_into,
                                       scan_frames)


def _pack(payloads):
    ends = array("Q")
    pos = 0
    for p in payloads:
        pos += len(p)
        ends.append(pos)
    return b"".join(payloads), ends


def test_measure_frames():
    ps = [b"a", b"bb", bytearray(b"ccc"), memoryview(b"dddd")]
    sizes = [frame_size(len(p)) for p in ps]
    assert measure_frames(ps, 10**9) == (sum(sizes), 4, False)
    assert measure_frames(ps[:2], 10**9) == (sum(sizes[:2]), 2, True)
    assert measure_frames((b"x",), 10) == (17, 0, True)
    assert measure_frames([], 0) == (0, 0, True)
    for room in range(sum(sizes) + 1):
        fit = sum(1 for k in range(1, 5) if sum(sizes[:k]) <= room)
        assert measure_frames(ps, room)[1] == fit
    with pytest.raises(ValueError, match="payload 1"):
        measure_frames([b"", np.zeros(MAX_PAYLOAD + 1, np.uint8)], 10)
    with pytest.raises(TypeError):
        measure_frames(["str"], 10)


def test_encode_frames_indexed_matches_encode_frames_into():
    rnd = random.Random(1)
    ps = [rnd.randbytes(rnd.randint(0, 300)) for _ in range(200)]
    total = measure_frames(ps, 0)[0]
    a, b = bytearray(total + 50), bytearray(total + 50)
    index = np.full(300, 7, dtype=np.uint64)
    end = encode_frames_indexed(a, 50, 1000, ps, index, 10)
    assert end == encode_frames_into(b, 50, 1000, ps) == total + 50
    assert a == b
    offs, poss, valid_end, status = scan_frames(a, 50, -1, 1000)
    assert (valid_end, status) == (end, 0)
    assert np.array_equal(index[10:210], poss)
    assert (index[:10] == 7).all() and (index[210:] == 7).all()


def test_encode_frames_indexed_errors():
    buf = bytearray(1000)
    with pytest.raises(ValueError, match="room for 2"):
        encode_frames_indexed(buf, 0, 0, [b"a"] * 3, np.zeros(5, np.uint64), 3)
    with pytest.raises(ValueError, match="out of range"):
        encode_frames_indexed(buf, 0, 0, [b"a"], np.zeros(5, np.uint64), 6)
    for bad in (np.zeros(5, np.int64), np.zeros(5, np.uint32), np.zeros((2, 2), np.uint64)):
        with pytest.raises(TypeError):
            encode_frames_indexed(buf, 0, 0, [b"a"], bad, 0)
    with pytest.raises(ValueError, match="need"):
        encode_frames_indexed(buf, 990, 0, [b"a"], np.zeros(5, np.uint64), 0)
    assert buf == bytearray(1000)       # nothing written on any error


def test_encode_frames_indexed_index_base():
    ps = [b"x" * i for i in range(5)]
    total = measure_frames(ps, 0)[0]
    buf = bytearray(total + 8)
    index = np.zeros(5, np.uint64)
    assert encode_frames_indexed(buf, 8, 3, ps, index, 0, 4096) == total + 8
    _, positions, _, _ = scan_frames(buf, 8, -1, 3)
    assert index.tolist() == [4096 + int(p) - 8 for p in positions]


@settings(max_examples=150, deadline=None)
@given(payloads=st.lists(st.binary(max_size=300), max_size=40),
       first=st.integers(0, 2**63), pos=st.integers(0, 64), at=st.integers(0, 5),
       base=st.one_of(st.just(-1), st.integers(0, 2**40)))
def test_encode_frames_packed_matches_encode_frames_indexed(payloads, first, pos, at, base):
    data, ends = _pack(payloads)
    total = measure_frames(payloads, 0)[0]
    a, b = bytearray(pos + total + 3), bytearray(pos + total + 3)
    ia = np.full(len(payloads) + at + 2, 9, np.uint64)
    ib = ia.copy()
    end = encode_frames_packed(a, pos, first, data, ends, ia, at, base)
    assert end == encode_frames_indexed(b, pos, first, payloads, ib, at, base) == pos + total
    assert a == b and np.array_equal(ia, ib)
    # A numpy array of ends works as well as array('Q').
    c = bytearray(len(a))
    encode_frames_packed(c, pos, first, data, np.frombuffer(ends, np.uint64) if ends else
                         np.zeros(0, np.uint64), ia, at, base)
    assert c == a


def test_encode_frames_packed_errors():
    data, ends = _pack([b"ab", b"c", b"def"])
    buf = bytearray(100)
    index = np.zeros(10, np.uint64)
    with pytest.raises(ValueError, match="need"):
        encode_frames_packed(buf, 60, 0, data, ends, index, 0)        # 54 bytes, 40 free
    with pytest.raises(ValueError, match="room for 2"):
        encode_frames_packed(buf, 0, 0, data, ends, index, 8)
    with pytest.raises(ValueError, match="out of order"):
        encode_frames_packed(buf, 0, 0, data, array("Q", [3, 2, 6]), index, 0)
    with pytest.raises(ValueError, match="past the data"):
        encode_frames_packed(buf, 0, 0, data, array("Q", [2, 3, 7]), index, 0)
    with pytest.raises(ValueError, match="position"):
        encode_frames_packed(buf, 101, 0, data, ends, index, 0)
    with pytest.raises(ValueError, match="overflow"):
        encode_frames_packed(buf, 0, 2**64 - 2, data, ends, index, 0)
    for bad in (array("q", [2, 3, 6]), array("I", [2, 3, 6]), [2, 3, 6]):
        with pytest.raises(TypeError):
            encode_frames_packed(buf, 0, 0, data, bad, index, 0)
    assert buf == bytearray(100)       # nothing written on any error
    assert encode_frames_packed(buf, 5, 0, b"", array("Q"), index, 0) == 5


def _log(n, first=5):
    rnd = random.Random(n)
    ps = [rnd.randbytes(rnd.randint(0, 50)) for _ in range(n)]
    buf = bytearray(measure_frames(ps, 0)[0] + 64)
    index = np.zeros(n, np.uint64)
    end = encode_frames_indexed(buf, 0, first, ps, index, 0)
    return ps, buf, index, end


def test_read_frames():
    ps, buf, index, end = _log(100)
    assert read_frames(buf, 0, end, 5, 1000) == [(5 + i, p) for i, p in enumerate(ps)]
    assert read_frames(buf, int(index[40]), end, 45, 3, -1, True) == [
        (45, ps[40]), (46, ps[41]), (47, ps[42])]
    # max_bytes: the first message is always returned, later ones only within the budget.
    big = [b"x" * 100] * 5
    buf2 = bytearray(measure_frames(big, 0)[0])
    e2 = encode_frames_into(buf2, 0, 0, big)
    assert len(read_frames(buf2, 0, e2, 0, 10, 0)) == 1
    assert len(read_frames(buf2, 0, e2, 0, 10, 250)) == 2
    assert len(read_frames(buf2, 0, e2, 0, 10, 300)) == 3
    out = [(0, b"prior")]
    assert read_frames_into(out, buf2, 0, e2, 0, 10, 50) == 0 and len(out) == 1
    assert read_frames_into(out, buf2, 0, e2, 0, 10, 200) == 200 and len(out) == 3
    # Stops at end; empty range.
    assert read_frames(buf, 0, int(index[3]), 5, 100) == [(5, ps[0]), (6, ps[1]), (7, ps[2])]
    assert read_frames(buf, 0, 0, 5, 100) == []


def test_read_frames_errors():
    ps, buf, index, end = _log(10)
    with pytest.raises(FrameError, match="expected 6"):
        read_frames(buf, 0, end, 6, 10)
    with pytest.raises(FrameError, match="all-zero"):
        read_frames(buf, end, end + 32, 15, 10)
    with pytest.raises(FrameError, match="truncated"):
        read_frames(buf, 0, end - 1, 5, 100)
    with pytest.raises(ValueError, match="bad range"):
        read_frames(buf, 10, 5, 5, 1)
    bad = bytearray(buf)
    bad[int(index[2]) + 12] ^= 1                                # the stored CRC
    assert len(read_frames(bad, 0, end, 5, 100)) == 10            # not verified
    with pytest.raises(FrameError, match="CRC"):
        read_frames(bad, 0, end, 5, 100, -1, True)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), start=st.integers(0, 200))
def test_last_nonzero(data, start):
    start = min(start, len(data))
    stripped = len(data[start:].rstrip(b"\0"))
    assert last_nonzero(data, start) == start + stripped
    with pytest.raises(ValueError):
        last_nonzero(data, len(data) + 1)


def test_tail_cache():
    c = TailCache(4, 10)
    assert (c.first_offset, c.next_offset, len(c), c.capacity) == (10, 10, 0, 4)
    assert c.read(10, 5) == [] and c.read(9, 5) is None and c.read(11, 5) is None
    c.extend(10, [b"a", b"b", bytearray(b"c")])
    assert c.read(10, 5) == [(10, b"a"), (11, b"b"), (12, b"c")]
    assert type(c.read(12, 1)[0][1]) is bytes
    c.extend(13, [b"d", b"e"])
    assert (c.first_offset, len(c)) == (11, 4)
    assert c.read(10, 5) is None
    assert c.read(11, 2) == [(11, b"b"), (12, b"c")]
    assert c.read(11, 10, 1) == [(11, b"b")]
    assert c.read(11, 10, 2) == [(11, b"b"), (12, b"c")]
    c.extend(15, [bytes([i]) for i in range(10)])     # longer than the capacity
    assert c.read(21, 10) == [(21 + i, bytes([6 + i])) for i in range(4)]
    c.extend(100, [b"z"])                               # a jump restarts the cache
    assert (c.first_offset, c.next_offset) == (100, 101)
    c.reset(5)
    assert (c.first_offset, c.next_offset, len(c)) == (5, 5, 0)
    z = TailCache(0, 3)
    z.extend(3, [b"a"])
    assert (z.first_offset, z.next_offset) == (4, 4) and z.read(3, 1) is None
    with pytest.raises(ValueError):
        TailCache(-1)


def test_tail_cache_grows_from_a_few_slots_to_its_capacity():
    """A quiet log's cache holds a few slots; a busy one's grows to the capacity, keeping
    what it held (packed and plain payloads alike)."""
    import array
    c = TailCache(100, 0)
    c.extend(0, [b"p%d" % i for i in range(5)])
    c.extend_packed(5, b"abcdef", array.array("Q", [1, 3, 6]))
    c.extend(8, [b"q%d" % i for i in range(30)])        # past the first ring's 16
    assert (c.first_offset, c.next_offset) == (0, 38)
    assert c.read(0, 8) == [*[(i, b"p%d" % i) for i in range(5)],
                            (5, b"a"), (6, b"bc"), (7, b"def")]
    c.extend(38, [b"r%d" % i for i in range(200)])       # past the capacity
    assert (c.first_offset, c.next_offset, len(c)) == (138, 238, 100)
    assert c.read(137, 1) is None and c.read(237, 5) == [(237, b"r199")]


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.tuples(st.booleans(),
                                  st.lists(st.binary(max_size=20), max_size=8)), max_size=8),
       cap=st.integers(0, 10))
def test_tail_cache_packed_and_plain_batches(batches, cap):
    """extend_packed keeps references to the packed buffer and copies on read; mixed with
    extend, reads see every payload in order, as a plain list of the newest would."""
    c = TailCache(cap, 0)
    log = []
    for packed, payloads in batches:
        if packed:
            data, ends = _pack(payloads)
            c.extend_packed(len(log), data, ends)
        else:
            c.extend(len(log), payloads)
        log.extend(payloads)
        held = log[max(0, len(log) - cap):] if cap else []
        first = len(log) - len(held)
        assert (c.first_offset, c.next_offset) == (first, len(log))
        got = c.read(first, 100)
        assert got == list(enumerate(held, first))
        assert all(type(p) is bytes for _, p in got)
        if held:
            budget = len(held[0])               # the first always, then while within budget
            expect, total = [], 0
            for i, p in enumerate(held):
                if expect and total + len(p) > budget:
                    break
                expect.append((first + i, p))
                total += len(p)
            assert c.read(first, 100, budget) == expect


def test_tail_cache_extend_packed_checks_ends():
    c = TailCache(4, 0)
    with pytest.raises(ValueError):
        c.extend_packed(0, b"abc", array("Q", [2, 1]))
    with pytest.raises(ValueError):
        c.extend_packed(0, b"abc", array("Q", [4]))
    with pytest.raises(TypeError):
        c.extend_packed(0, bytearray(b"abc"), array("Q", [3]))
    assert (c.first_offset, c.next_offset) == (0, 0)
