"""pytest-benchmark for the HTTP/2 and gRPC framing hot paths, next to the pure-Python peers
they replace (hyperframe, which h2 uses, and hpack without our cache)."""

import hpack
import pytest

from danube.codec import grpcframe, http2
from danube.rpc.headers import HeaderDecoder, encode_headers

MESSAGES = [b"x" * 100] * 1000
FRAMED = grpcframe.grpc_frame_many(MESSAGES)
DATA_FRAMES = http2.data_frames(1, FRAMED, 0, len(FRAMED), 16384)
# 1000 small frames: what a busy unary connection looks like (one DATA frame per request).
SMALL_FRAMES = b"".join(http2.data_frames(2 * i + 1, grpcframe.grpc_frame(b"y" * 100), 0, 105,
                                          16384, True) for i in range(1000))
REQUEST_FIELDS = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/danube.ProducerService/SendMessage"),
                  (b":authority", b"127.0.0.1:6650"), (b"content-type", b"application/grpc"),
                  (b"te", b"trailers"), (b"user-agent", b"grpc-python/1.85")]


def test_frame_reader_1000_small_frames(benchmark):
    def parse():
        return http2.FrameReader(16384).feed(SMALL_FRAMES)
    assert len(benchmark(parse)) == 1000


def test_peer_hyperframe_1000_small_frames(benchmark):
    hyperframe = pytest.importorskip("hyperframe.frame")

    def parse():
        view = memoryview(SMALL_FRAMES)
        pos, out = 0, []
        while pos < len(view):
            frame, length = hyperframe.Frame.parse_frame_header(view[pos:pos + 9])
            frame.parse_body(view[pos + 9:pos + 9 + length])
            out.append(frame)
            pos += 9 + length
        return out
    assert len(benchmark(parse)) == 1000


def test_grpc_frame_many_1000(benchmark):
    assert len(benchmark(grpcframe.grpc_frame_many, MESSAGES)) == 105_000


def test_grpc_data_frames_many_1000(benchmark):
    frames, n = benchmark(grpcframe.grpc_data_frames_many, 1, MESSAGES, 16384)
    assert n == 105_000


def test_deframer_1000_messages(benchmark):
    def split():
        return grpcframe.GrpcDeframer(1 << 20).feed(FRAMED)
    assert len(benchmark(split)) == 1000


def test_unary_response(benchmark):
    headers = encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
    trailers = encode_headers([(b"grpc-status", b"0")])
    out = benchmark(grpcframe.unary_response, 1, headers, b"z" * 100, trailers, 16384)
    assert len(out) == 9 * 3 + len(headers) + 105 + len(trailers)


def _indexed_block():
    # What a client sends for a repeated call: every field indexed in the dynamic table.
    enc = hpack.Encoder()
    first = enc.encode(REQUEST_FIELDS)
    again = enc.encode(REQUEST_FIELDS)
    return first, again


def test_header_decode_cached(benchmark):
    first, again = _indexed_block()
    dec = HeaderDecoder(65536)
    dec.decode(first)
    dec.decode(again)
    assert len(benchmark(dec.decode, again)) == len(REQUEST_FIELDS)


def test_peer_hpack_decode_uncached(benchmark):
    first, again = _indexed_block()
    dec = hpack.Decoder()
    dec.decode(first)
    assert len(benchmark(dec.decode, again, True)) == len(REQUEST_FIELDS)
