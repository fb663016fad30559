"""Unit tests of the Cython HTTP/2 + gRPC framing codec (danube.codec.http2, danube.codec.grpcframe) and of
danube.rpc.headers. Frames are built and parsed independently with hyperframe where that
makes the check stronger than a round trip through our own code."""

import base64
import math
import struct

import hpack
import hyperframe.frame as hf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.codec import http2 as _core
from danube.codec.grpcframe import (CompressedMessage, GrpcDeframer, GrpcMessageTooLarge,
                                    grpc_data_frame_pieces, grpc_frame, grpc_frame_many,
                                    unary_response)
from danube.codec.http2 import (FrameReader, H2ConnectionError, data_frames, header_frames,
                                hpack_table_neutral, parse_settings, parse_u32)
from danube.rpc import headers as H

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def raw(ftype, flags, sid, payload=b""):
    return (len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big")
            + payload)


def parse_all(data):
    """Frames parsed by hyperframe: list of (type, flags(set of names), sid, body bytes)."""
    out, pos = [], 0
    while pos < len(data):
        f, n = hf.Frame.parse_frame_header(memoryview(data[pos:pos + 9]))
        f.parse_body(memoryview(data[pos + 9:pos + 9 + n]))
        out.append(f)
        pos += 9 + n
    assert pos == len(data)
    return out


# -- FrameReader --------------------------------------------------------------------------

def sample_stream():
    """A client byte stream and the tuples FrameReader must return for it."""
    frames, expected = [], []

    def add(ftype, flags, sid, payload, out_payload=None, keep=True):
        frames.append(raw(ftype, flags, sid, payload))
        if keep:
            expected.append((ftype, flags, sid,
                             payload if out_payload is None else out_payload, len(payload)))

    settings_payload = struct.pack(">HIHI", 4, 1 << 20, 5, 32768)
    add(_core.SETTINGS, 0, 0, settings_payload)
    add(_core.WINDOW_UPDATE, 0, 0, (1 << 24).to_bytes(4, "big"))
    add(_core.HEADERS, _core.FLAG_END_HEADERS, 1, b"\x83\x86\x84")
    add(_core.DATA, 0, 1, b"\x00\x00\x00\x00\x03abc")
    # Padded DATA: pad length byte + data + 7 padding bytes; the padding costs flow control.
    add(_core.DATA, _core.FLAG_PADDED | _core.FLAG_END_STREAM, 1,
        b"\x07" + b"payload" + b"\x00" * 7, b"payload")
    # HEADERS with padding and priority: both stripped.
    add(_core.HEADERS, _core.FLAG_END_HEADERS | _core.FLAG_PADDED | _core.FLAG_PRIORITY, 3,
        b"\x03" + b"\x80\x00\x00\x01\x10" + b"\x82\x87" + b"\xff" * 3, b"\x82\x87")
    # HEADERS with priority only.
    add(_core.HEADERS, _core.FLAG_PRIORITY, 5, b"\x00\x00\x00\x03\x20" + b"\x82",
        b"\x82")
    add(_core.CONTINUATION, _core.FLAG_END_HEADERS, 5, b"\x84")
    add(_core.PRIORITY, 0, 7, b"\x00\x00\x00\x01\x05", keep=False)   # dropped
    add(0xEE, 0x3, 0, b"unknown extension frame", keep=False)         # dropped
    add(_core.PING, 0, 0, b"12345678")
    add(_core.PING, _core.FLAG_ACK, 0, b"abcdefgh")
    add(_core.RST_STREAM, 0, 3, (8).to_bytes(4, "big"))
    add(_core.DATA, 0, 9, b"")
    add(_core.SETTINGS, _core.FLAG_ACK, 0, b"")
    add(_core.GOAWAY, 0, 0, b"\x00\x00\x00\x05\x00\x00\x00\x00debug")
    add(_core.DATA, 0, 11, b"z" * 16384)  # exactly the max frame size
    return PREFACE + b"".join(frames), expected


def test_frame_reader_whole():
    data, expected = sample_stream()
    reader = FrameReader(16384, True)
    assert reader.feed(data) == expected
    assert reader.buffered == 0


def test_frame_reader_split_at_every_byte_boundary():
    data, expected = sample_stream()
    for i in range(len(data) + 1):
        reader = FrameReader(16384, True)
        got = reader.feed(data[:i]) + reader.feed(data[i:])
        assert got == expected, f"split at {i}"
        assert reader.buffered == 0


def test_frame_reader_byte_by_byte():
    data, expected = sample_stream()
    reader = FrameReader(16384, True)
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i:i + 1])
    assert got == expected


def test_frame_reader_accepts_bytearray_and_memoryview():
    data, expected = sample_stream()
    assert FrameReader(16384, True).feed(bytearray(data)) == expected
    reader = FrameReader(16384, True)
    assert reader.feed(memoryview(data)[:100]) + reader.feed(memoryview(data)[100:]) == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_frame_reader_random_chunking(data):
    stream, expected = sample_stream()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    reader = FrameReader(16384, True)
    got, prev = [], 0
    for c in cuts + [len(stream)]:
        got += reader.feed(stream[prev:c])
        prev = c
    assert got == expected


def test_frame_reader_holds_partial_frame():
    reader = FrameReader(16384, False)
    frame = raw(_core.DATA, 0, 1, b"x" * 100)
    assert reader.feed(frame[:50]) == []
    assert reader.buffered == 50
    assert reader.feed(frame[50:]) == [(_core.DATA, 0, 1, b"x" * 100, 100)]
    assert reader.buffered == 0


def test_frame_reader_ignores_reserved_stream_bit():
    frame = bytearray(raw(_core.DATA, 0, 1, b"ab"))
    frame[5] |= 0x80
    assert FrameReader().feed(bytes(frame)) == [(_core.DATA, 0, 1, b"ab", 2)]


def test_oversize_frame_is_frame_size_error():
    reader = FrameReader(16384, False)
    with pytest.raises(H2ConnectionError) as exc:
        # Only the header is needed to judge it.
        reader.feed((16385).to_bytes(3, "big") + bytes((_core.DATA, 0)) + (1).to_bytes(4, "big"))
    assert exc.value.code == _core.E_FRAME_SIZE_ERROR
    # A larger advertised limit accepts it.
    big = FrameReader(1 << 20, False)
    assert big.feed(raw(_core.DATA, 0, 1, b"q" * 16385))[0][4] == 16385
    big.max_frame_size = 100
    with pytest.raises(H2ConnectionError):
        big.feed(raw(_core.DATA, 0, 1, b"q" * 101))


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\n\r\n" + b"x" * 20,
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
    b"\x16\x03\x01\x02\x00",       # a TLS ClientHello on a plain-text port
    b"PRJ",                          # judged before the whole preface is there
])
def test_bad_preface(data):
    with pytest.raises(H2ConnectionError) as exc:
        FrameReader(16384, True).feed(data)
    assert exc.value.code == _core.E_PROTOCOL_ERROR


def test_partial_good_preface_waits():
    reader = FrameReader(16384, True)
    assert reader.feed(PREFACE[:10]) == []
    assert reader.feed(PREFACE[10:] + raw(_core.PING, 0, 0, b"8bytes!!")) == [
        (_core.PING, 0, 0, b"8bytes!!", 8)]


@pytest.mark.parametrize("frame,code", [
    (raw(_core.DATA, 0, 0, b"x"), _core.E_PROTOCOL_ERROR),
    (raw(_core.HEADERS, 4, 0, b"\x82"), _core.E_PROTOCOL_ERROR),
    (raw(_core.DATA, _core.FLAG_PADDED, 1, b""), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.DATA, _core.FLAG_PADDED, 1, b"\x05abc"), _core.E_PROTOCOL_ERROR),
    (raw(_core.HEADERS, _core.FLAG_PRIORITY, 1, b"\x00\x00"), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.CONTINUATION, 4, 0, b"\x82"), _core.E_PROTOCOL_ERROR),
    (raw(_core.SETTINGS, 0, 1, b""), _core.E_PROTOCOL_ERROR),
    (raw(_core.SETTINGS, 0, 0, b"\x00\x04\x00"), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.SETTINGS, _core.FLAG_ACK, 0, b"\x00\x04\x00\x00\x00\x01"),
     _core.E_FRAME_SIZE_ERROR),
    (raw(_core.PING, 0, 1, b"12345678"), _core.E_PROTOCOL_ERROR),
    (raw(_core.PING, 0, 0, b"1234567"), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.GOAWAY, 0, 3, b"\x00" * 8), _core.E_PROTOCOL_ERROR),
    (raw(_core.GOAWAY, 0, 0, b"\x00" * 7), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.RST_STREAM, 0, 0, b"\x00\x00\x00\x08"), _core.E_PROTOCOL_ERROR),
    (raw(_core.RST_STREAM, 0, 1, b"\x00\x00\x08"), _core.E_FRAME_SIZE_ERROR),
    (raw(_core.PRIORITY, 0, 0, b"\x00" * 5), _core.E_PROTOCOL_ERROR),
    (raw(_core.PRIORITY, 0, 1, b"\x00" * 4), _core.E_FRAME_SIZE_ERROR),
])
def test_frame_level_errors(frame, code):
    with pytest.raises(H2ConnectionError) as exc:
        FrameReader(16384, False).feed(frame)
    assert exc.value.code == code


def test_padding_may_fill_the_whole_frame():
    # Pad length equal to the rest of the payload leaves an empty body.
    got = FrameReader().feed(raw(_core.DATA, _core.FLAG_PADDED, 1, b"\x03\x00\x00\x00"))
    assert got == [(_core.DATA, _core.FLAG_PADDED, 1, b"", 4)]


def test_parse_settings_and_u32():
    payload = struct.pack(">HIHIHI", 1, 4096, 4, 2**31 - 1, 0xFF00, 7)
    assert parse_settings(payload) == [(1, 4096), (4, 2**31 - 1), (0xFF00, 7)]
    assert parse_settings(b"") == []
    assert parse_u32(b"\x80\x00\x00\x01") == 0x80000001
    assert parse_u32(b"\x00\x00\x00\x05\x00\x00\x00\x0b", 4) == 11
    with pytest.raises(ValueError):
        parse_u32(b"\x00\x00\x00", 0)


def test_control_frame_builders_parse_with_hyperframe():
    f, = parse_all(_core.settings_frame([(4, 1 << 20), (3, 100)]))
    assert isinstance(f, hf.SettingsFrame) and f.settings == {4: 1 << 20, 3: 100}
    f, = parse_all(_core.settings_frame((), ack=True))
    assert "ACK" in f.flags and f.settings == {}
    f, = parse_all(_core.window_update_frame(3, 12345))
    assert (f.stream_id, f.window_increment) == (3, 12345)
    f, = parse_all(_core.rst_stream_frame(5, _core.E_CANCEL))
    assert (f.stream_id, f.error_code) == (5, 8)
    f, = parse_all(_core.goaway_frame(7, _core.E_PROTOCOL_ERROR, b"why"))
    assert (f.last_stream_id, f.error_code, f.additional_data) == (7, 1, b"why")
    f, = parse_all(_core.ping_frame(b"12345678", ack=True))
    assert (f.opaque_data, "ACK" in f.flags) == (b"12345678", True)


# -- data_frames / header_frames -----------------------------------------------------------

@pytest.mark.parametrize("length,max_frame", [(0, 16384), (1, 16384), (16384, 16384),
                                              (16385, 16384), (100000, 16384), (10, 3),
                                              (9, 3), (70000, 1 << 20)])
@pytest.mark.parametrize("end_stream", [False, True])
def test_data_frames_split(length, max_frame, end_stream):
    data = bytes(i % 251 for i in range(length + 20))
    out = data_frames(7, data, 10, length, max_frame, end_stream)
    frames = parse_all(out)
    assert all(isinstance(f, hf.DataFrame) and f.stream_id == 7 for f in frames)
    assert len(frames) == max(1, math.ceil(length / max_frame))
    assert all(len(f.data) <= max_frame for f in frames)
    assert b"".join(f.data for f in frames) == data[10:10 + length]
    ends = ["END_STREAM" in f.flags for f in frames]
    assert ends == [False] * (len(frames) - 1) + [end_stream]


@pytest.mark.parametrize("length,max_frame", [(0, 16384), (1, 16384), (16379, 16384),
                                              (16380, 16384), (16381, 16384), (100000, 16384),
                                              (20, 16), (11, 16), (70000, 1 << 20)])
@pytest.mark.parametrize("end_stream", [False, True])
def test_grpc_data_frame_pieces_equal_the_copied_frames(length, max_frame, end_stream):
    message = bytes(i % 251 for i in range(length))
    pieces = grpc_data_frame_pieces(7, message, max_frame, end_stream)
    assert b"".join(pieces) == data_frames(7, grpc_frame(message), 0, length + 5, max_frame,
                                           end_stream)
    assert any(isinstance(p, memoryview) for p in pieces) == (length > 0)
    with pytest.raises(ValueError):
        grpc_data_frame_pieces(7, message, 15)


def test_data_frames_bounds():
    with pytest.raises(ValueError):
        data_frames(1, b"abc", 2, 2, 16384)
    with pytest.raises(ValueError):
        data_frames(1, b"abc", -1, 1, 16384)
    with pytest.raises(ValueError):
        data_frames(1, b"abc", 0, 3, 0)


@pytest.mark.parametrize("length,max_frame", [(0, 16384), (5, 16384), (16384, 16384),
                                              (16385, 16384), (50000, 16384), (7, 2)])
@pytest.mark.parametrize("end_stream", [False, True])
def test_header_frames_split(length, max_frame, end_stream):
    block = bytes(i % 256 for i in range(length))
    frames = parse_all(header_frames(3, block, max_frame, end_stream))
    assert isinstance(frames[0], hf.HeadersFrame)
    assert all(isinstance(f, hf.ContinuationFrame) for f in frames[1:])
    assert len(frames) == max(1, math.ceil(length / max_frame))
    assert b"".join(f.data for f in frames) == block
    assert ["END_HEADERS" in f.flags for f in frames] == [False] * (len(frames) - 1) + [True]
    assert ("END_STREAM" in frames[0].flags) == end_stream
    assert all(f.stream_id == 3 for f in frames)


def test_unary_response_layout():
    hdr = H.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
    trl = H.encode_headers([(b"grpc-status", b"0")])
    for size, max_frame in ((0, 16384), (10, 16384), (40000, 16384), (16379, 16384),
                            (16380, 16384), (100, 7)):
        message = bytes(i % 199 for i in range(size))
        frames = parse_all(unary_response(9, hdr, message, trl, max_frame))
        assert isinstance(frames[0], hf.HeadersFrame)
        assert "END_STREAM" not in frames[0].flags
        data = [f for f in frames if isinstance(f, hf.DataFrame)]
        assert all(len(f.data) <= max_frame for f in frames)
        assert all("END_STREAM" not in f.flags for f in data)
        assert b"".join(f.data for f in data) == grpc_frame(message)
        tail = [f for f in frames[frames.index(data[-1]) + 1:]]
        assert isinstance(tail[0], hf.HeadersFrame) and "END_STREAM" in tail[0].flags
        assert b"".join(f.data for f in tail) == trl
        block = b"".join(f.data for f in frames[:frames.index(data[0])])
        assert hpack.Decoder().decode(block, raw=True) == [(b":status", b"200"),
                                                           (b"content-type", b"application/grpc")]


# -- gRPC framing --------------------------------------------------------------------------

def test_grpc_frame():
    assert grpc_frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert grpc_frame(b"", True) == b"\x01\x00\x00\x00\x00"
    assert grpc_frame_many([b"a", b"", b"bc"]) == b"\x00\x00\x00\x00\x01a" \
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02bc"
    assert grpc_frame_many([]) == b""
    with pytest.raises(TypeError):
        grpc_frame_many([b"a", "not bytes"])


def test_deframer_several_in_one_feed():
    d = GrpcDeframer(1 << 20)
    msgs = [b"", b"a", b"hello", b"x" * 1000]
    assert d.feed(b"".join(grpc_frame(m) for m in msgs)) == msgs
    assert d.pending == 0


def test_deframer_split_at_every_byte_boundary():
    msgs = [b"first", b"", b"third message", b"\x00\x01\x02"]
    stream = b"".join(grpc_frame(m) for m in msgs)
    for i in range(len(stream) + 1):
        d = GrpcDeframer(1 << 20)
        got = d.feed(stream[:i])
        assert d.pending == i - sum(5 + len(m) for m in got)
        got += d.feed(stream[i:])
        assert got == msgs
        assert d.pending == 0


def test_deframer_byte_by_byte():
    msgs = [b"one", b"two" * 100, b""]
    stream = b"".join(grpc_frame(m) for m in msgs)
    d = GrpcDeframer(1 << 20)
    got = []
    for i in range(len(stream)):
        got += d.feed(stream[i:i + 1])
    assert got == msgs


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20), st.data())
def test_deframer_random_chunking(msgs, data):
    stream = b"".join(grpc_frame(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    d = GrpcDeframer(1 << 20)
    got, prev = [], 0
    for c in cuts + [len(stream)]:
        got += d.feed(stream[prev:c])
        prev = c
    assert got == msgs
    assert d.pending == 0


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 3, 70000, 65536, 200000]), min_size=1, max_size=5),
       data=st.data())
def test_deframer_assembles_large_messages_in_place(sizes, data):
    """Large messages (assembled in place as their parts arrive) among small ones, split
    anywhere, also inside a prefix; `pending` counts what is held back."""
    msgs = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    stream = b"".join(grpc_frame(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    d = GrpcDeframer(1 << 20)
    got, prev = [], 0
    for c in cuts + [len(stream)]:
        got += d.feed(memoryview(stream)[prev:c])
        prev = c
        done = sum(len(m) + 5 for m in got)
        assert d.pending == prev - done
    assert got == msgs and all(type(m) is bytes for m in got)
    assert d.pending == 0


def test_deframer_large_message_over_the_limit_is_refused_at_its_prefix():
    d = GrpcDeframer(100000)
    with pytest.raises(GrpcMessageTooLarge):
        d.feed(grpc_frame(b"x" * 100001)[:1000])


def test_deframer_compressed_flag():
    d = GrpcDeframer(1 << 20)
    out = d.feed(grpc_frame(b"plain") + grpc_frame(b"squeezed", True) + grpc_frame(b"p2"))
    assert out == [b"plain", b"squeezed", b"p2"]
    assert [type(m) for m in out] == [bytes, CompressedMessage, bytes]
    assert d.any_compressed


def test_deframer_too_large():
    d = GrpcDeframer(100)
    assert d.feed(grpc_frame(b"x" * 100)) == [b"x" * 100]
    with pytest.raises(GrpcMessageTooLarge) as exc:
        d.feed(b"\x00" + (101).to_bytes(4, "big"))  # judged from the prefix alone
    assert (exc.value.size, exc.value.limit) == (101, 100)
    with pytest.raises(GrpcMessageTooLarge):
        GrpcDeframer(1 << 20).feed(b"\x00\xff\xff\xff\xff")
    # A prefix split across feeds is judged once whole.
    d = GrpcDeframer(100)
    assert d.feed(b"\x00\x00") == []
    with pytest.raises(GrpcMessageTooLarge):
        d.feed(b"\x00\x01\x00")


def test_deframer_bad_flag():
    with pytest.raises(ValueError):
        GrpcDeframer(100).feed(b"\x02\x00\x00\x00\x00")


def test_deframer_truncated_prefix_is_pending():
    d = GrpcDeframer(100)
    assert d.feed(b"\x00\x00\x00") == []
    assert d.pending == 3


# -- HPACK helpers ---------------------------------------------------------------------------

def test_hpack_table_neutral_basic():
    assert not hpack_table_neutral(b"")
    assert hpack_table_neutral(b"\x82\x86\x84")                      # indexed
    assert hpack_table_neutral(b"\xff\x80\x01")                      # multi-byte index
    assert not hpack_table_neutral(b"\xff\x80")                      # truncated index
    assert hpack_table_neutral(b"\x04\x05/path")                     # literal w/o indexing
    assert hpack_table_neutral(b"\x10\x01k\x01v")                    # never indexed, new name
    assert not hpack_table_neutral(b"\x00\x01k\x05v")                # value overruns block
    assert not hpack_table_neutral(b"\x00\x01k")                     # value missing
    assert not hpack_table_neutral(b"\x44\x05/path")                 # incremental indexing
    assert not hpack_table_neutral(b"\x40\x01k\x01v")
    assert not hpack_table_neutral(b"\x3f\xe1\x1f")                  # table size update
    assert not hpack_table_neutral(b"\x82\x20")                      # size update at the end


def huffman(s: bytes) -> bytes:
    return hpack.Encoder().huffman_coder.encode(s)


def literal(name: bytes, value: bytes, never=False, huff=False, name_index=0):
    def string(s):
        if huff:
            enc = huffman(s)
            return H._hpack_int(len(enc), 7, 0x80) + enc
        return H._hpack_int(len(s), 7, 0x00) + s
    first = 0x10 if never else 0x00
    out = H._hpack_int(name_index, 4, first)
    if not name_index:
        out += string(name)
    return out + string(value)


field_names = st.from_regex(rb"\A[a-z][a-z0-9\-_.]{0,20}\Z")
field_values = st.binary(max_size=300).filter(lambda v: b"\x00" not in v)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(field_names, field_values, st.booleans(), st.booleans(),
                          st.sampled_from([0, 0, 1, 4, 31, 58])), min_size=1, max_size=8),
       st.lists(st.integers(1, 61), max_size=4))
def test_hpack_table_neutral_agrees_with_hpack(fields, indexed):
    block = b"".join(H._hpack_int(i, 7, 0x80) for i in indexed)
    for name, value, never, huff, name_index in fields:
        block += literal(name, value, never, huff, name_index)
    assert hpack_table_neutral(block)
    dec = hpack.Decoder()
    before = list(dec.header_table.dynamic_entries)
    dec.decode(block, raw=True)
    assert list(dec.header_table.dynamic_entries) == before
    # Any truncation of a neutral block is not neutral (cannot be a whole block)...
    for cut in {len(block) - 1, len(block) // 2}:
        if 0 < cut < len(block):
            trunc = block[:cut]
            try:
                hpack.Decoder().decode(trunc, raw=True)
                decodable = True
            except Exception:  # noqa: BLE001
                decodable = False
            if not decodable:
                assert not hpack_table_neutral(trunc)
    # ...and one field with incremental indexing spoils it.
    assert not hpack_table_neutral(block + b"\x40\x01k\x01v")


def test_hpack_table_neutral_on_hpack_encoder_output():
    enc = hpack.Encoder()
    # A fresh encoder indexes new fields: not neutral; static hits are.
    assert hpack_table_neutral(enc.encode([(":method", "POST"), (":scheme", "http")]))
    assert not hpack_table_neutral(enc.encode([("x-custom", "1")]))
    # Now in the dynamic table: the same field is sent as an index, which is neutral.
    assert hpack_table_neutral(enc.encode([("x-custom", "1")]))
    assert hpack_table_neutral(enc.encode([hpack.NeverIndexedHeaderTuple("secret", "s")]))


def test_header_decoder_cache_follows_dynamic_table():
    enc = hpack.Encoder()
    dec = H.HeaderDecoder(65536)
    first = enc.encode([("x-k", "v1")])
    assert dec.decode(first) == [(b"x-k", b"v1")]
    indexed = enc.encode([("x-k", "v1")])
    assert indexed == b"\xbe"  # dynamic index 62
    assert dec.decode(indexed) == [(b"x-k", b"v1")]
    assert dec.decode(indexed) == [(b"x-k", b"v1")]
    # A block that inserts a new entry shifts index 62: the cached result must not be reused.
    dec.decode(hpack.Encoder().encode([("x-k", "v2")]))
    assert dec.decode(b"\xbe") == [(b"x-k", b"v2")]


def test_header_decoder_parse_result_is_cached():
    calls = []

    def parse(fields):
        calls.append(fields)
        return tuple(fields)
    dec = H.HeaderDecoder(65536, parse)
    block = H.encode_headers([(b":method", b"POST"), (b":path", b"/a/b")])
    assert dec.decode(block) is dec.decode(block)
    assert len(calls) == 1


# -- danube.rpc.headers -----------------------------------------------------------------------

@pytest.mark.parametrize("text,encoded", [
    ("", b""),
    ("plain text", b"plain text"),
    ("100%", b"100%25"),
    ("%41", b"%2541"),
    ("ünï", b"%C3%BCn%C3%AF"),
    ("tab\there", b"tab%09here"),
    ("line\n", b"line%0A"),
    ("~ !", b"~ !"),
    ("\x7f", b"%7F"),
])
def test_percent_encode_known(text, encoded):
    assert H.percent_encode(text) == encoded
    assert H.percent_decode(encoded) == text


@given(st.text())
def test_percent_roundtrip(text):
    encoded = H.percent_encode(text)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    expected = text.encode("utf-8", "replace").decode("utf-8", "replace")
    assert H.percent_decode(encoded) == expected


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_percent_encode_leaves_safe_ascii(text):
    assert H.percent_encode(text) == text.replace("%", "%25").encode()


def test_percent_decode_keeps_malformed_escapes():
    assert H.percent_decode(b"%zz") == "%zz"
    assert H.percent_decode(b"%4") == "%4"
    assert H.percent_decode(b"100%") == "100%"
    assert H.percent_decode(b"%41%4a%4A") == "AJJ"
    assert H.percent_decode(b"%FF") == "\ufffd"  # invalid UTF-8 is replaced, not an error


@pytest.mark.parametrize("value,seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"4m", 0.004), (b"5u", 5e-6),
    (b"6n", 6e-9), (b"0S", 0.0), (b"99999999S", 99999999.0), (b"00000010m", 0.01),
    (b"12345678n", 0.012345678),
])
def test_parse_timeout(value, seconds):
    assert H.parse_timeout(value) == pytest.approx(seconds, rel=1e-12, abs=0)


@pytest.mark.parametrize("value", [
    b"", b"S", b"1", b"1s", b"1h", b"1x", b"-1S", b"+1S", b" 1S", b"1 S", b"1.5S",
    b"123456789S", b"1SS", b"\xd9\xa1S", b"1\x00",
])
def test_parse_timeout_invalid(value):
    with pytest.raises(ValueError):
        H.parse_timeout(value)


@pytest.mark.parametrize("seconds,expected", [
    (0, b"0n"), (-5, b"0n"), (1e-9, b"1n"), (0.05, b"50000000n"), (0.1, b"100000u"),
    (1.0, b"1000000u"), (30, b"30000000u"), (3600, b"3600000m"), (1e9, b"16666667M"),
    (1e12, b"99999999H"),
])
def test_format_timeout_known(seconds, expected):
    assert H.format_timeout(seconds) == expected


@given(st.floats(min_value=0, max_value=3e11, allow_nan=False))
def test_format_timeout_roundtrip(seconds):
    encoded = H.format_timeout(seconds)
    assert 2 <= len(encoded) <= 9
    back = H.parse_timeout(encoded)
    # Never shorter than asked (rounded up), and precise to the chosen unit.
    assert back >= seconds * (1 - 1e-12) - 1e-9
    assert back <= seconds * (1 + 1e-5) + 1e-9


ENCODE_CASES = [
    [(b":status", b"200"), (b"content-type", b"application/grpc")],
    [(b":method", b"POST"), (b":scheme", b"http"), (b":scheme", b"https"),
     (b":path", b"/test.Echo/Unary"), (b":authority", b"127.0.0.1:5000"),
     (b"te", b"trailers"), (b"user-agent", b"x"), (b"accept-encoding", b"gzip")],
    [(b"grpc-status", b"13"), (b"grpc-message", b"100%25 %C3%BC")],
    [(b":status", b"404"), (b":status", b"500"), (b":status", b"204"), (b":status", b"400")],
    [(b"x-empty", b""), (b"x-long", b"v" * 5000), (b"n" * 200, b"long name")],
    [(b"content-type", b"text/plain"), (b":method", b"GET")],
]


@pytest.mark.parametrize("fields", ENCODE_CASES)
def test_encode_headers_decodes_with_hpack(fields):
    block = H.encode_headers(fields)
    dec = hpack.Decoder(max_header_list_size=1 << 20)
    assert [tuple(f) for f in dec.decode(block, raw=True)] == fields
    # Stateless: nothing entered the decoder's dynamic table, so it decodes again the same.
    assert list(dec.header_table.dynamic_entries) == []
    assert [tuple(f) for f in dec.decode(block, raw=True)] == fields
    assert hpack_table_neutral(block)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.one_of(field_names, st.sampled_from(
    [b":status", b":path", b":method", b":authority", b"content-type", b"te", b"user-agent",
     b"accept-encoding", b":scheme"])), st.binary(max_size=400)), max_size=12))
def test_encode_headers_decodes_with_hpack_random(fields):
    block = H.encode_headers(fields)
    dec = hpack.Decoder(max_header_list_size=1 << 22)
    assert [tuple(f) for f in dec.decode(block, raw=True)] == fields
    assert list(dec.header_table.dynamic_entries) == []


def test_metadata_roundtrip():
    md = [("x-a", "1"), ("x-b-bin", b"\x00\xff"), ("X-Upper", "v"), ("x-a", "2"),
          ("x-text-bin", "utf8 ✓")]
    fields = H.metadata_to_headers(md)
    assert (b"x-b-bin", base64.b64encode(b"\x00\xff").rstrip(b"=")) in fields
    assert (b"x-upper", b"v") in fields
    back = H.metadata_from_headers([(b":path", b"/p"), (b"content-type", b"application/grpc"),
                                    (b"grpc-timeout", b"1S"), (b"te", b"trailers"), *fields])
    assert back == (("x-a", "1"), ("x-b-bin", b"\x00\xff"), ("x-upper", "v"), ("x-a", "2"),
                    ("x-text-bin", "utf8 ✓".encode()))


@pytest.mark.parametrize("md", [
    [("bad key", "v")], [("x-ü", "v")], [("grpc-status", "0")], [("content-type", "x")],
    [("x-nl", "a\nb")], [("x-hi", "ü")], [("", "v")],
])
def test_metadata_to_headers_rejects(md):
    with pytest.raises(ValueError):
        H.metadata_to_headers(md)


def test_metadata_from_headers_padded_and_unpadded_bin():
    for value in (b"AAE", b"AAE="):
        assert H.metadata_from_headers([(b"x-bin", value)]) == (("x-bin", b"\x00\x01"),)
