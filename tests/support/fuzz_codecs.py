"""Fuzz targets of the pure codecs: HTTP/2 frames, HPACK blocks, gRPC length-prefix framing and
WAL frames. Each is `target(data: bytes)`: it returns for any input the codec handles as
documented (parsed, or refused with the codec's own error) and raises `Finding` (or lets an
unexpected exception through) otherwise.

Beyond "no unexpected exception", each checks what a codec promises about its output: the
same frames or messages whether the input arrives whole or in pieces, every input byte
accounted for, and (HPACK) that the cache in front of the decoder changes nothing.
"""

import hpack

from danube.codec import http2
from danube.codec.grpcframe import GrpcDeframer, GrpcMessageTooLarge, grpc_frame
from danube.codec.http2 import FrameReader, H2ConnectionError
from danube.rpc.headers import HeaderDecoder, encode_headers
from danube.storage import _walframes as wf


class Finding(AssertionError):
    """A fuzz input broke an invariant of its target."""


def check(condition, message):
    if not condition:
        raise Finding(message)


def _chunks(data, size):
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def _feed_all(feed, pieces):
    """Feed pieces in order; the outputs of all of them."""
    out = []
    for piece in pieces:
        out.extend(feed(piece))
    return out


# -- HTTP/2 frames -------------------------------------------------------------------------

_KEPT_TYPES = {http2.DATA, http2.HEADERS, http2.RST_STREAM, http2.SETTINGS, http2.PUSH_PROMISE,
               http2.PING, http2.GOAWAY, http2.WINDOW_UPDATE, http2.CONTINUATION}


def _read_frames(body, preface, max_frame, chunk):
    reader = FrameReader(max_frame, preface)
    try:
        frames = _feed_all(reader.feed, _chunks(body, chunk) if chunk else [body])
    except H2ConnectionError as exc:
        return None, (exc.code, str(exc))
    check(reader.buffered < 9 + max_frame + (24 if preface else 0),
          f"FrameReader holds {reader.buffered} bytes, more than one frame")
    return frames, reader.buffered


def h2_frames(data: bytes):
    """HTTP/2 FrameReader. Byte 0 picks the options: bit 0 expects the client preface (bit 1
    then prepends it), bits 2-7 the size of the pieces the rest is fed in."""
    if not data:
        return
    opts, body = data[0], data[1:]
    preface = bool(opts & 1)
    if preface and opts & 2:
        body = http2.CLIENT_PREFACE + body
    max_frame = 16384
    whole, whole_left = _read_frames(body, preface, max_frame, 0)
    pieces, pieces_left = _read_frames(body, preface, max_frame, (opts >> 2) + 1)
    if whole is None or pieces is None:
        # An error fed in pieces may come earlier (a bad preface is seen in its first byte),
        # but a stream that fails whole must fail in pieces too, and with the same verdict.
        check(whole is None and pieces is None,
              f"whole input gave {whole_left!r}, the same in pieces {pieces_left!r}")
        return
    check(whole == pieces, "frames differ when the input arrives in pieces")
    check(whole_left == pieces_left, "left-over bytes differ when fed in pieces")
    for ftype, flags, sid, payload, flow_len in whole:
        check(ftype in _KEPT_TYPES, f"frame type {ftype} should have been dropped")
        check(len(payload) <= flow_len <= max_frame, "payload longer than the frame")
        check(sid < 2**31, "stream id with the reserved bit")
        if ftype == http2.SETTINGS:
            check(len(http2.parse_settings(payload)) == len(payload) // 6, "SETTINGS count")
        elif ftype in (http2.WINDOW_UPDATE, http2.RST_STREAM):
            http2.parse_u32(payload)
        elif ftype == http2.HEADERS:
            http2.hpack_table_neutral(payload)


def h2_seeds():
    block = encode_headers([(b":method", b"POST"), (b":path", b"/test.Echo/Unary"),
                            (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    frames = (http2.settings_frame([(4, 1 << 20), (5, 16384)])
              + http2.header_frames(1, block, 8, False)
              + http2.data_frames(1, grpc_frame(b"hello"), 0, 10, 4, True)
              + http2.window_update_frame(0, 1000) + http2.ping_frame(b"12345678")
              + http2.rst_stream_frame(1, 8) + http2.goaway_frame(1, 0, b"bye")
              + http2.frame(http2.PRIORITY, 0, 3, b"\x00\x00\x00\x01\x10")
              + http2.frame(0x20, 0, 0, b"unknown type")
              + http2.frame(http2.DATA, http2.FLAG_PADDED, 1, b"\x02ab\x00\x00")
              + http2.frame(http2.HEADERS, http2.FLAG_PRIORITY, 5, b"\x00\x00\x00\x00\x01"
                            + block))
    return [bytes((opts,)) + frames for opts in (0, 3, 4 * 7 + 3, 4 * 63)]


# -- HPACK ---------------------------------------------------------------------------------

HPACK_ERRORS = (hpack.HPACKError,)


def _split_blocks(data):
    """Up to four header blocks: byte 0 says where the cuts are; each block is decoded twice
    (the second time a table-neutral one comes from the cache)."""
    if not data:
        return []
    cuts, body = data[0], data[1:]
    n = (cuts & 3) + 1
    size = max(1, len(body) // n)
    blocks = [body[i * size:(i + 1) * size] for i in range(n - 1)] + [body[(n - 1) * size:]]
    return [b for b in blocks for _ in (0, 1)]


def hpack_block(data: bytes):
    """HeaderDecoder (with its cache of table-neutral blocks) against a plain hpack.Decoder
    fed the same blocks: the same fields or an error from both, block by block, and a block
    hpack_table_neutral calls neutral leaves the dynamic table as it was."""
    cached = HeaderDecoder(4096)
    plain = hpack.Decoder(max_header_list_size=4096)
    for block in _split_blocks(data):
        table_before = list(plain.header_table.dynamic_entries)
        try:
            expected = plain.decode(block, raw=True)
        except HPACK_ERRORS:
            expected = None
        try:
            got = cached.decode(block)
        except HPACK_ERRORS:
            got = None
        check(got == expected, f"cached decoder gave {got!r}, hpack gave {expected!r}")
        if expected is None:
            return
        if http2.hpack_table_neutral(block):
            check(list(plain.header_table.dynamic_entries) == table_before,
                  f"a block called table-neutral changed the dynamic table: {block!r}")


def hpack_seeds():
    enc = hpack.Encoder()
    fields = [(b":method", b"POST"), (b":path", b"/danube.ProducerService/SendMessage"),
              (b"content-type", b"application/grpc"), (b"x-custom", b"v" * 40)]
    indexed = enc.encode(fields)
    return [b"\x01" + indexed + enc.encode(fields),
            b"\x00" + encode_headers(fields),
            b"\x02" + bytes.fromhex("3fe11f") + indexed + b"\x82\x84",
            b"\x03" + enc.encode([(b"a" * 100, b"b" * 300)], huffman=True)]


# -- gRPC length-prefix framing ------------------------------------------------------------

GRPC_MAX = 1 << 17


def _deframe(body, chunk):
    deframer = GrpcDeframer(GRPC_MAX)
    try:
        out = _feed_all(deframer.feed, _chunks(body, chunk) if chunk else [body])
    except GrpcMessageTooLarge as exc:
        check(exc.size > exc.limit == GRPC_MAX and len(exc.head) <= 256, "bad refusal")
        return None, "too large"
    except ValueError as exc:
        check(str(exc).startswith("invalid gRPC compressed flag"), f"ValueError {exc}")
        return None, "flag"
    consumed = sum(5 + len(m) for m in out)
    check(consumed + deframer.pending == len(body),
          f"{consumed} bytes in messages + {deframer.pending} pending != {len(body)} fed")
    check(deframer.reserved <= max(deframer.pending, 5 + GRPC_MAX),
          f"reserved {deframer.reserved} bytes for {deframer.pending} pending")
    return [(type(m).__name__, bytes(m)) for m in out], deframer.pending


def grpc_frames(data: bytes):
    """GrpcDeframer, fed whole and in pieces of the size byte 0 picks: the same messages (and
    compressed flags) either way, or the same refusal."""
    if not data:
        return
    opts, body = data[0], data[1:]
    whole = _deframe(body, 0)
    pieces = _deframe(body, opts * 37 + 1)
    if whole[0] is None or pieces[0] is None:
        check(whole[0] is None and pieces[0] is None and whole[1] == pieces[1],
              f"whole input: {whole[1]}, in pieces: {pieces[1]}")
        return
    check(whole == pieces, "messages differ when the input arrives in pieces")


def grpc_seeds():
    big = grpc_frame(bytes(range(256)) * 300)
    small = grpc_frame(b"hello") + grpc_frame(b"", True) + grpc_frame(b"x" * 300, True)
    return [b"\x00" + small, b"\x03" + small + big, b"\xff" + big + small[:7]]


# -- WAL frames ----------------------------------------------------------------------------

def wal_frames(data: bytes):
    """scan_frames, read_frame, read_frames and walk_frames over one buffer must agree on
    which frames are good, and refuse the rest with FrameError."""
    offsets, positions, valid_end, status = wf.scan_frames(data)
    check(0 <= valid_end <= len(data) and status in (0, 1, 2, 3), "scan result out of range")
    check(list(offsets) == list(range(offsets[0], offsets[0] + len(offsets)))
          if len(offsets) else True, "scanned offsets not contiguous")
    pos = 0
    for off, at in zip(offsets, positions):
        check(at == pos, f"frame at {at}, expected {pos}")
        got_off, payload, pos = wf.read_frame(data, at)
        check(got_off == off, "read_frame disagrees with scan_frames")
    check(pos == valid_end, f"frames end at {pos}, scan says {valid_end}")
    if len(offsets):
        read = wf.read_frames(data, 0, valid_end, offsets[0], len(offsets) + 1, -1, True)
        check([o for o, _ in read] == list(offsets), "read_frames disagrees with scan_frames")
        count, end, _ = wf.walk_frames(data, 0, len(data), offsets[0])
        check(count >= len(offsets) and end >= valid_end, "walk_frames stopped early")
    if status in (wf.SCAN_TORN, wf.SCAN_CORRUPT):
        try:
            wf.read_frame(data, valid_end)
        except wf.FrameError:
            pass
        else:
            raise Finding(f"read_frame accepts the frame scan_frames called bad at {valid_end}")
    elif status == wf.SCAN_CLEAN:
        # Clean means the data stops at the end or at a zero header (what follows a zero
        # hole is recovery's business: it reports it as stray bytes).
        check(not any(data[valid_end:valid_end + wf.HEADER_SIZE]),
              "clean scan stopped at a non-zero header")
    check(wf.walk_frames(data, 0, len(data), 0, 3)[0] <= 3, "walk_frames ignored max_frames")


def wal_seeds():
    frames = b"".join(wf.encode_frame(5 + i, bytes([i + 1]) * (i * 13)) for i in range(6))
    return [frames, frames + bytes(40), wf.encode_frame(0, b"") + wf.encode_frame(1, b"x"),
            frames[:-3]]


# -- MQTT (the edge) ----------------------------------------------------------------------

def mqtt_packets(data: bytes):
    """The edge's MQTT decoder (danube/mqtt/codec.py, runs of PUBLISH packets found in
    C by danube/codec/mqtt.pyx), at 3.1.1 and 5.0, whole and in 7-byte pieces: packets, or
    ProtocolError. Every Run encodes (encode_run) into exactly its count of StreamMessages
    that protobuf parses, carrying the payloads the general decoder reads from the same
    bytes, and acks for exactly its QoS 1 packets."""
    from danube.codec.mqtt import encode_run
    from danube.mqtt import codec as mc
    from danube.proto import DanubeApi_pb2 as pb

    prefix = pb.StreamMessage(msg_id=pb.MsgID(topic_name="/e/t")).SerializeToString()
    suffix = pb.StreamMessage(producer_name="p").SerializeToString()
    for level in (4, 5):
        for size in (len(data) or 1, 7):
            d = mc.Decoder(1 << 12, 64)
            d.level = level
            out = []
            try:
                for piece in _chunks(data, size):
                    out += d.feed(piece)
            except mc.ProtocolError as exc:
                check(0x80 <= exc.reason <= 0xA2, f"reason code {exc.reason:#x}")
                continue
            for packet in out:
                if type(packet) is not mc.Run:
                    continue
                at_level = _run_level(out, packet, level)
                raw, ends, acks = encode_run(packet.raw, 0, packet.count, at_level == 5,
                                             prefix, suffix, 7)
                check(len(ends) == packet.count and len(acks) == 4 * packet.qos1,
                      "encode_run count or acks wrong")
                slow = mc.Decoder(1 << 13, 1 << 13)
                slow.level = at_level
                slow.runs = False
                pubs = slow.feed(packet.raw)
                check(len(pubs) == packet.count and all(p.topic == packet.topic for p in pubs),
                      "a Run the general decoder reads otherwise")
                starts = [0, *ends[:-1]]
                for p, a, b in zip(pubs, starts, ends):
                    msg = pb.StreamMessage.FromString(raw[a:b])
                    check(msg.payload == p.payload and msg.publish_time == 7,
                          "encode_run payload differs")


def _run_level(out, run, level):
    """The protocol level a Run was read at: the last CONNECT's before it, else ``level``."""
    from danube.mqtt import codec as mc
    for packet in out:
        if packet is run:
            break
        if type(packet) is mc.Connect:
            level = packet.level
    return level


def mqtt_seeds():
    import struct

    def s(text):
        raw = text.encode()
        return struct.pack(">H", len(raw)) + raw

    def pkt(first, body):
        n, out = len(body), bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                break
        return bytes([first]) + bytes(out) + body

    def connect(level):
        return pkt(0x10, s("MQTT") + bytes([level, 2, 0, 60]) + (b"\x00" if level == 5 else b"")
                   + s("dev"))

    def pub(topic, payload, qos, pid, level):
        body = s(topic) + (struct.pack(">H", pid) if qos else b"")
        return pkt(0x30 | qos << 1, body + (b"\x00" if level == 5 else b"") + payload)
    v4 = connect(4) + b"".join(pub("a/b", b"p%d" % i, i % 2, i + 1, 4) for i in range(6))
    v5 = connect(5) + b"".join(pub("a/b", b"q%d" % i, 1, i + 1, 5) for i in range(4)) + \
        pub("c", b"x", 2, 9, 5) + b"\xc0\x00" + pkt(0x62, b"\x00\x09") + b"\xe0\x00"
    return [v4, v5, v4[:-3], pkt(0x82, b"\x00\x01" + s("t/#") + b"\x01")]
