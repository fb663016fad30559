"""WAL frame codec (danube.storage._walframes): encoding, reading, and the recovery scan over torn/bad data."""

import mmap
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from danube.codec.crc32c import crc32c
from danube.storage._walframes import (
    HEADER_SIZE, MAX_PAYLOAD, SCAN_CLEAN, SCAN_CORRUPT, SCAN_GAP, SCAN_TORN, FrameError,
    encode_frame, encode_frames_into, frame_size, read_frame, scan_frames,
)

HDR = struct.Struct("<QII")


def frame_crc(offset, payload):
    """The documented CRC: CRC-32C over the offset and length fields, then the payload."""
    return crc32c(payload, crc32c(struct.pack("<QI", offset, len(payload))))


def build(payloads, first_offset=1):
    """Frames built independently of the codec, from the documented layout."""
    out = bytearray()
    for i, p in enumerate(payloads):
        out += HDR.pack(first_offset + i, len(p), frame_crc(first_offset + i, p)) + p
    return bytes(out)


def positions_of(payloads, start=0):
    pos, res = start, []
    for p in payloads:
        res.append(pos)
        pos += HEADER_SIZE + len(p)
    return res


def check_scan(result, offsets, positions, valid_end, status):
    offs, poss, end, st_ = result
    assert offs.typecode == "Q" and poss.typecode == "Q"
    assert offs.tolist() == list(offsets)
    assert poss.tolist() == list(positions)
    assert (end, st_) == (valid_end, status)


PAYLOADS = [b"alpha", b"", b"gamma" * 50, bytes(range(256)), b"z"]


# ---------------------------------------------------------------- constants and encoding

def test_constants():
    assert HEADER_SIZE == 16
    assert MAX_PAYLOAD == (1 << 30) - 1
    assert (SCAN_CLEAN, SCAN_TORN, SCAN_CORRUPT, SCAN_GAP) == (0, 1, 2, 3)
    assert frame_size(0) == 16 and frame_size(100) == 116
    with pytest.raises(ValueError):
        frame_size(MAX_PAYLOAD + 1)
    with pytest.raises(ValueError):
        frame_size(-1)


def test_encode_frame_layout():
    f = encode_frame(0x0102030405060708, b"hello")
    assert isinstance(f, bytes)
    assert f[:8] == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert HDR.unpack_from(f) == (0x0102030405060708, 5, frame_crc(0x0102030405060708, b"hello"))
    assert f[16:] == b"hello"
    assert f == build([b"hello"], 0x0102030405060708)


@pytest.mark.parametrize("payload", [b"abc", bytearray(b"abc"), memoryview(b"xabcx")[1:4],
                                     np.frombuffer(b"abc", dtype=np.uint8)])
def test_encode_frame_buffer_types(payload):
    assert encode_frame(9, payload) == build([b"abc"], 9)


def test_encode_frame_max_offset_and_empty_payload():
    f = encode_frame(2**64 - 1, b"")
    assert HDR.unpack(f) == (2**64 - 1, 0, frame_crc(2**64 - 1, b""))
    assert read_frame(f, 0) == (2**64 - 1, b"", 16)
    assert encode_frame(0, b"x") == build([b"x"], 0)
    with pytest.raises(OverflowError):
        encode_frame(-1, b"x")
    with pytest.raises(OverflowError):
        encode_frame(2**64, b"x")


def test_empty_frame_at_offset_zero_is_not_end_of_data():
    # The CRC covers the header, so even offset 0 with an empty payload is never 16 zeros.
    frame = encode_frame(0, b"")
    assert frame != bytes(16)
    assert read_frame(frame, 0) == (0, b"", 16)
    assert scan_frames(frame + bytes(32))[0].tolist() == [0]
    assert encode_frames_into(bytearray(64), 0, 0, [b"x", b""]) == 33


def test_payload_too_large():
    big = np.zeros(MAX_PAYLOAD + 1, dtype=np.uint8)   # calloc'd: not touched
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        encode_frame(1, big)
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        encode_frames_into(bytearray(64), 0, 1, [b"a", big])


@pytest.mark.parametrize("bad", ["text", 5, None])
def test_encode_bad_payload_type(bad):
    with pytest.raises(TypeError):
        encode_frame(1, bad)
    with pytest.raises(TypeError):
        encode_frames_into(bytearray(64), 0, 1, [b"ok", bad])


def test_large_frame_round_trip():
    payload = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    f = encode_frame(42, payload)
    assert read_frame(f, 0) == (42, payload, len(f))
    buf = bytearray(2 * len(f) + 10)
    end = encode_frames_into(buf, 10, 42, [payload, memoryview(payload)])
    assert end == 10 + 2 * len(f)
    check_scan(scan_frames(buf, 10), [42, 43], [10, 10 + len(f)], end, SCAN_CLEAN)


# ---------------------------------------------------------------- encode_frames_into

def test_encode_frames_into_matches_encode_frame():
    buf = bytearray(1000)
    end = encode_frames_into(buf, 7, 100, PAYLOADS)
    expected = b"".join(encode_frame(100 + i, p) for i, p in enumerate(PAYLOADS))
    assert end == 7 + len(expected)
    assert bytes(buf[7:end]) == expected == build(PAYLOADS, 100)
    assert buf[:7] == bytes(7) and buf[end:] == bytes(1000 - end)


def test_encode_frames_into_mixed_payload_types_and_sequences():
    payloads = [b"a", bytearray(b"bb"), memoryview(b"ccc"), np.arange(4, dtype=np.uint8)]
    expect = build([b"a", b"bb", b"ccc", bytes(range(4))], 5)
    for seq in (payloads, tuple(payloads)):
        buf = bytearray(len(expect))
        assert encode_frames_into(buf, 0, 5, seq) == len(expect)
        assert bytes(buf) == expect


def test_encode_frames_into_exact_fit_and_empty_list():
    need = sum(frame_size(len(p)) for p in PAYLOADS)
    buf = bytearray(need)
    assert encode_frames_into(buf, 0, 1, PAYLOADS) == need
    assert encode_frames_into(buf, need, 1, []) == need
    assert encode_frames_into(bytearray(), 0, 1, []) == 0


def test_encode_frames_into_does_not_fit_writes_nothing():
    need = sum(frame_size(len(p)) for p in PAYLOADS)
    buf = bytearray(b"\xee" * (need + 3))
    with pytest.raises(ValueError, match="need"):
        encode_frames_into(buf, 4, 1, PAYLOADS)
    assert buf == bytearray(b"\xee" * (need + 3))


def test_encode_frames_into_bad_position():
    for pos in (-1, 11):
        with pytest.raises(ValueError, match="out of range"):
            encode_frames_into(bytearray(10), pos, 1, [b"x"])


def test_encode_frames_into_readonly_target():
    with pytest.raises(BufferError):
        encode_frames_into(bytes(100), 0, 1, [b"x"])
    with pytest.raises(BufferError):
        encode_frames_into(memoryview(bytes(100)), 0, 1, [b"x"])


def test_encode_frames_into_offset_overflow():
    with pytest.raises(ValueError, match="overflow"):
        encode_frames_into(bytearray(100), 0, 2**64 - 1, [b"a", b"b"])
    assert encode_frames_into(bytearray(100), 0, 2**64 - 2, [b"a", b"b"]) == 34


def test_encode_frames_into_releases_payload_buffers_on_error():
    ba = bytearray(b"resizable")
    with pytest.raises(ValueError):
        encode_frames_into(bytearray(10), 0, 1, [ba, b"more"])
    with pytest.raises(TypeError):
        encode_frames_into(bytearray(100), 0, 1, [ba, "bad"])
    ba.extend(b"!")     # BufferError if an export leaked


def test_encode_frames_into_mmap(tmp_path):
    path = tmp_path / "seg"
    path.write_bytes(bytes(4096))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        end = encode_frames_into(m, 0, 1, PAYLOADS)
        m.flush()
    data = path.read_bytes()
    assert data[:end] == build(PAYLOADS, 1)
    check_scan(scan_frames(data), range(1, 6), positions_of(PAYLOADS), end, SCAN_CLEAN)


# ---------------------------------------------------------------- read_frame

def test_read_frame_walk():
    data = build(PAYLOADS, 10)
    pos, seen = 0, []
    while pos < len(data):
        off, payload, pos = read_frame(data, pos)
        seen.append((off, payload))
    assert seen == [(10 + i, p) for i, p in enumerate(PAYLOADS)]
    assert pos == len(data)
    assert isinstance(seen[0][1], bytes)


def test_read_frame_errors():
    data = bytearray(build(PAYLOADS, 1))
    with pytest.raises(FrameError, match="truncated frame header"):
        read_frame(data, len(data))
    with pytest.raises(FrameError, match="truncated frame header"):
        read_frame(data[:10], 0)
    with pytest.raises(FrameError, match=r"truncated frame at position 0 \(offset 1\)"):
        read_frame(data[:20], 0)
    with pytest.raises(ValueError, match="out of range"):
        read_frame(data, -1)
    with pytest.raises(ValueError, match="out of range"):
        read_frame(data, len(data) + 1)
    with pytest.raises(FrameError, match="all-zero header"):
        read_frame(bytes(32), 0)
    bad = bytearray(data)
    bad[17] ^= 0x40
    with pytest.raises(FrameError, match=r"CRC mismatch in frame at position 0 \(offset 1\)"):
        read_frame(bad, 0)
    bad = bytearray(data)
    struct.pack_into("<I", bad, 8, MAX_PAYLOAD + 1)
    with pytest.raises(FrameError, match="exceeds MAX_PAYLOAD"):
        read_frame(bad, 0)
    assert issubclass(FrameError, ValueError)


# ---------------------------------------------------------------- scan_frames

def test_scan_clean_end():
    data = build(PAYLOADS, 1)
    check_scan(scan_frames(data), [1, 2, 3, 4, 5], positions_of(PAYLOADS), len(data), SCAN_CLEAN)


def test_scan_empty_and_all_zero():
    check_scan(scan_frames(b""), [], [], 0, SCAN_CLEAN)
    check_scan(scan_frames(bytes(4096)), [], [], 0, SCAN_CLEAN)
    check_scan(scan_frames(bytes(5)), [], [], 0, SCAN_CLEAN)


@pytest.mark.parametrize("pad", [1, 15, 16, 17, 4096])
def test_scan_zero_padded_end(pad):
    data = build(PAYLOADS, 1) + bytes(pad)
    check_scan(scan_frames(data), [1, 2, 3, 4, 5], positions_of(PAYLOADS), len(data) - pad,
               SCAN_CLEAN)


def test_scan_buffer_types(tmp_path):
    data = build(PAYLOADS, 1) + bytes(100)
    n = len(data) - 100
    for buf in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        check_scan(scan_frames(buf), range(1, 6), positions_of(PAYLOADS), n, SCAN_CLEAN)
    path = tmp_path / "seg"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        result = scan_frames(m)
    check_scan(result, range(1, 6), positions_of(PAYLOADS), n, SCAN_CLEAN)


def test_scan_torn_header():
    data = build(PAYLOADS, 1)
    last = positions_of(PAYLOADS)[-1]
    for cut in (last + 1, last + 8, last + 15):
        check_scan(scan_frames(data[:cut]), [1, 2, 3, 4], positions_of(PAYLOADS)[:4], last,
                   SCAN_TORN)


def test_scan_torn_header_of_zeros_is_padding():
    # Offset 256: the first byte of the header is zero; a 1-byte remnant looks like padding.
    data = build([b"a", b"b"], 255)
    cut = frame_size(1) + 1
    check_scan(scan_frames(data[:cut]), [255], [0], frame_size(1), SCAN_CLEAN)
    check_scan(scan_frames(data[:cut + 1]), [255], [0], frame_size(1), SCAN_TORN)


def test_scan_torn_payload():
    data = build(PAYLOADS, 1)
    pos = positions_of(PAYLOADS)
    # Frame 2 (250-byte payload) cut in the middle, and the last frame cut right after header.
    check_scan(scan_frames(data[:pos[2] + 16 + 100]), [1, 2], pos[:2], pos[2], SCAN_TORN)
    check_scan(scan_frames(data[:pos[4] + 16]), [1, 2, 3, 4], pos[:4], pos[4], SCAN_TORN)
    # Same tears with the `end` argument instead of slicing.
    check_scan(scan_frames(data, 0, pos[2] + 16 + 100), [1, 2], pos[:2], pos[2], SCAN_TORN)


def test_scan_torn_payload_then_zero_padding():
    # A frame whose header reached the file but whose payload did not (zeros instead).
    data = bytearray(build(PAYLOADS, 1) + bytes(64))
    pos = positions_of(PAYLOADS)
    data[pos[3] + 16:pos[4]] = bytes(256)
    check_scan(scan_frames(data), [1, 2, 3], pos[:3], pos[3], SCAN_CORRUPT)


def test_scan_corrupted_payload_byte():
    data = bytearray(build(PAYLOADS, 1))
    pos = positions_of(PAYLOADS)
    data[pos[2] + 16 + 123] ^= 0x01
    check_scan(scan_frames(data), [1, 2], pos[:2], pos[2], SCAN_CORRUPT)


def test_scan_corrupted_crc_field():
    data = bytearray(build(PAYLOADS, 1))
    pos = positions_of(PAYLOADS)
    data[pos[1] + 12] ^= 0x80
    check_scan(scan_frames(data), [1], pos[:1], pos[1], SCAN_CORRUPT)


def test_scan_corrupted_length():
    pos = positions_of(PAYLOADS)
    base = build(PAYLOADS, 1)
    # Length above MAX_PAYLOAD: corrupt header.
    data = bytearray(base)
    struct.pack_into("<I", data, pos[3] + 8, 0xFFFFFFFF)
    check_scan(scan_frames(data), [1, 2, 3], pos[:3], pos[3], SCAN_CORRUPT)
    # Length running past the end: indistinguishable from a tear.
    data = bytearray(base)
    struct.pack_into("<I", data, pos[3] + 8, 100000)
    check_scan(scan_frames(data), [1, 2, 3], pos[:3], pos[3], SCAN_TORN)
    # Length shorter than the payload: CRC over the wrong span.
    data = bytearray(base)
    struct.pack_into("<I", data, pos[3] + 8, 255)
    check_scan(scan_frames(data), [1, 2, 3], pos[:3], pos[3], SCAN_CORRUPT)


def test_scan_offset_gap():
    pos = positions_of(PAYLOADS)
    data = bytearray(build(PAYLOADS, 1))
    struct.pack_into("<Q", data, pos[3], 5)
    check_scan(scan_frames(data), [1, 2, 3], pos[:3], pos[3], SCAN_GAP)
    # Frames that go backwards (a stale frame from an earlier generation of the file).
    data = build(PAYLOADS[:2], 1) + build(PAYLOADS[2:], 1)
    check_scan(scan_frames(data), [1, 2], pos[:2], pos[2], SCAN_GAP)


def test_scan_expect_offset():
    data = build(PAYLOADS, 7)
    pos = positions_of(PAYLOADS)
    check_scan(scan_frames(data, expect_offset=7), range(7, 12), pos, len(data), SCAN_CLEAN)
    check_scan(scan_frames(data, expect_offset=8), [], [], 0, SCAN_GAP)
    check_scan(scan_frames(data, expect_offset=0), [], [], 0, SCAN_GAP)
    check_scan(scan_frames(data, expect_offset=-1), range(7, 12), pos, len(data), SCAN_CLEAN)


def test_scan_start_end():
    data = b"\xaa" * 5 + build(PAYLOADS, 1) + bytes(20)
    pos = positions_of(PAYLOADS, 5)
    check_scan(scan_frames(data, 5), range(1, 6), pos, pos[-1] + 17, SCAN_CLEAN)
    check_scan(scan_frames(data, pos[2]), [3, 4, 5], pos[2:], pos[-1] + 17, SCAN_CLEAN)
    check_scan(scan_frames(data, pos[2], expect_offset=3), [3, 4, 5], pos[2:], pos[-1] + 17,
               SCAN_CLEAN)
    check_scan(scan_frames(data, 5, pos[3]), [1, 2, 3], pos[:3], pos[3], SCAN_CLEAN)
    check_scan(scan_frames(data, pos[1], pos[1]), [], [], pos[1], SCAN_CLEAN)
    # Not a frame boundary: garbage header.
    assert scan_frames(data, 0)[3] != SCAN_CLEAN


def test_scan_bad_range():
    data = build(PAYLOADS, 1)
    for start, end in ((-1, -1), (10, 5), (0, len(data) + 1), (len(data) + 1, -1)):
        with pytest.raises(ValueError, match="bad range"):
            scan_frames(data, start, end)


def test_scan_bad_type():
    with pytest.raises(TypeError):
        scan_frames("not bytes")


def test_scan_many_frames_grows_index():
    payloads = [i.to_bytes(4, "little") for i in range(20000)]
    buf = bytearray(sum(frame_size(4) for _ in payloads) + 1000)
    end = encode_frames_into(buf, 0, 1, payloads)
    offs, poss, valid_end, status = scan_frames(buf)
    assert (valid_end, status) == (end, SCAN_CLEAN)
    assert np.array_equal(offs, np.arange(1, 20001, dtype=np.uint64))
    assert np.array_equal(poss, np.arange(0, end, 20, dtype=np.uint64))


# ---------------------------------------------------------------- properties

payload_lists = st.lists(st.binary(max_size=300), min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(payloads=payload_lists, first=st.integers(1, 2**62), data=st.data())
def test_round_trip_with_truncation(payloads, first, data):
    buf = bytearray(sum(frame_size(len(p)) for p in payloads))
    end = encode_frames_into(buf, 0, first, payloads)
    assert end == len(buf)
    assert bytes(buf) == build(payloads, first)
    pos = positions_of(payloads)
    ends = [p + frame_size(len(x)) for p, x in zip(pos, payloads)]

    cut = data.draw(st.integers(0, len(buf)), label="cut")
    keep = sum(1 for e in ends if e <= cut)
    valid_end = ends[keep - 1] if keep else 0
    offs, poss, got_end, status = scan_frames(memoryview(buf)[:cut])
    assert offs.tolist() == [first + i for i in range(keep)]
    assert poss.tolist() == pos[:keep]
    assert got_end == valid_end
    tail = bytes(buf[valid_end:cut])
    if not tail or (len(tail) < HEADER_SIZE and not any(tail)):
        assert status == SCAN_CLEAN
    else:
        assert status == SCAN_TORN
    # The same answer through `end`, and with an expected first offset.
    assert scan_frames(buf, 0, cut, first)[2:] == (got_end, status)
    for i in range(keep):
        assert read_frame(buf, pos[i]) == (first + i, payloads[i], ends[i])


@settings(max_examples=300, deadline=None)
@given(payloads=payload_lists, first=st.integers(1, 2**40), data=st.data())
def test_truncation_then_zero_padding(payloads, first, data):
    """A preallocated file where the write stopped at an arbitrary byte."""
    full = build(payloads, first)
    cut = data.draw(st.integers(0, len(full)), label="cut")
    pad = data.draw(st.integers(0, 400), label="pad")
    seg = full[:cut] + bytes(len(full) - cut + pad)
    pos = positions_of(payloads)
    ends = [p + frame_size(len(x)) for p, x in zip(pos, payloads)]
    keep = sum(1 for e in ends if e <= cut)
    # Recovery knows the segment's first offset; without it a torn first header could
    # decode to a different offset.
    offs, poss, got_end, status = scan_frames(seg, expect_offset=first)
    # The exact answer, from the documented layout: the frames complete before the cut, plus
    # the torn one only if its missing bytes happened to be zeros (byte-identical). The CRC
    # covers the header, so no other torn frame is accepted; what the scan reports at the
    # frame it stops on follows from that frame's header as it reads after the zero fill.
    n, expected_status = keep, SCAN_CLEAN
    if keep < len(payloads):
        torn = slice(pos[keep], ends[keep])
        if seg[torn] == full[torn]:
            n = keep + 1
        else:
            header = seg[pos[keep]:pos[keep] + HEADER_SIZE]
            offset, length, _ = HDR.unpack(header)
            # Zero fill only lowers the length field, so it never runs past the segment.
            assert length <= len(payloads[keep])
            if header == bytes(HEADER_SIZE):
                expected_status = SCAN_CLEAN          # nothing of it written: padding
            elif offset != first + keep:
                expected_status = SCAN_GAP            # offset field cut short
            else:
                expected_status = SCAN_CORRUPT        # length, CRC or payload cut short
    assert offs.tolist() == [first + i for i in range(n)]
    assert poss.tolist() == pos[:n]
    assert got_end == (ends[n - 1] if n else 0)
    assert status == expected_status


def test_torn_header_is_not_taken_for_an_empty_frame():
    """A header whose length and CRC fields never reached a zero-filled file must not decode
    as a valid empty frame: the CRC covers the header, so recovery stops before it."""
    full = build([b"first", b"second"], 1)
    cut = frame_size(5) + 8                      # offset field of frame 2 written, rest not
    seg = full[:cut] + bytes(64)
    offs, poss, valid_end, status = scan_frames(seg)
    assert offs.tolist() == [1]
    assert valid_end == frame_size(5)
    assert status == SCAN_CORRUPT
    with pytest.raises(ValueError, match="CRC mismatch"):
        read_frame(seg, frame_size(5))


@settings(max_examples=300, deadline=None)
@given(payloads=st.lists(st.binary(max_size=100), min_size=1, max_size=20),
       first=st.integers(1, 2**40), data=st.data())
def test_single_bit_flip_stops_at_damaged_frame(payloads, first, data):
    full = bytearray(build(payloads, first))
    k = data.draw(st.integers(0, len(payloads) - 1), label="frame")
    pos = positions_of(payloads)
    bit = data.draw(st.integers(0, frame_size(len(payloads[k])) * 8 - 1), label="bit")
    full[pos[k] + bit // 8] ^= 1 << (bit % 8)
    byte = bit // 8
    offs, poss, got_end, status = scan_frames(full, expect_offset=first)
    assert offs.tolist() == [first + i for i in range(k)]
    assert poss.tolist() == pos[:k]
    assert got_end == pos[k]
    if not any(full[pos[k]:pos[k] + HEADER_SIZE]):
        assert status == SCAN_CLEAN     # offset 1 -> 0 on an empty frame: a zero header
    elif byte < 8:
        assert status == SCAN_GAP
    elif byte < 12:
        assert status in (SCAN_TORN, SCAN_CORRUPT)
    else:
        assert status == SCAN_CORRUPT


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=20),
       first=st.integers(0, 1000))
def test_read_frame_inverts_encode_frame(payloads, first):
    for i, p in enumerate(payloads):
        f = encode_frame(first + i, p)
        assert read_frame(f, 0) == (first + i, p, len(f))
