"""Robustness of the gRPC server's HTTP/2 layer against misbehaving peers, driven with raw
sockets and the `h2` state machine (frames parsed with hyperframe, not our codec)."""

import socket
import time
import uuid

import grpc
import h2.events
import h2.settings
import hpack
import hyperframe.frame
import pytest

from danube.rpc import RpcError, StatusCode
from danube.rpc.connection import TransportConfig

from rpc_fixtures import (GRPC_OPTIONS, P, PREFACE, FrameStream, RawH2Client, blob,
                          encode_request, goaways, grpc_message, h2_frame, raw_connection,
                          read_frames, split_grpc_messages)
from waiting import holds_for, wait_for

E_NO_ERROR, E_PROTOCOL_ERROR, E_FLOW_CONTROL_ERROR, E_FRAME_SIZE_ERROR = 0, 1, 3, 6
E_STREAM_CLOSED, E_REFUSED_STREAM, E_CANCEL = 5, 7, 8
DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4


@pytest.fixture
def client(rpc_server):
    c = RawH2Client(rpc_server.port)
    yield c
    c.close()

# A stop's grace, long enough that a stop which waits it out is told apart from one that
# does not, even on a slow machine.
GRACE = 60


def unique_key(prefix="k"):
    return f"{prefix}-{uuid.uuid4().hex}".encode()


def assert_echo_works(c: RawH2Client, payload=b"alive"):
    r = c.call(P + "Unary", [payload])
    assert r.grpc_status == 0, r.trailers
    assert r.messages == [payload]


def expect_goaway(sock, code, timeout=5.0):
    frames, eof = read_frames(sock, timeout)
    ga = goaways(frames)
    assert ga, f"no GOAWAY, got {[type(f).__name__ for f in frames]}"
    assert ga[-1].error_code == code, (ga[-1].error_code, ga[-1].additional_data)
    assert eof, "server did not close the connection after GOAWAY"
    return ga[-1]


# -- connection errors ---------------------------------------------------------------------

@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
    b"\x00" * 64,
])
def test_garbage_preface_gets_goaway(rpc_server, client, garbage):
    assert_echo_works(client, b"before")
    sock = socket.create_connection(("127.0.0.1", rpc_server.port), timeout=5)
    try:
        sock.sendall(garbage)
        expect_goaway(sock, E_PROTOCOL_ERROR)
    finally:
        sock.close()
    # The other connection, open the whole time, is unaffected.
    assert_echo_works(client, b"after")


def test_preface_split_across_reads_is_fine(rpc_server):
    sock = socket.create_connection(("127.0.0.1", rpc_server.port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for i in range(0, len(PREFACE), 5):
            sock.sendall(PREFACE[i:i + 5])
            time.sleep(0.002)
        sock.sendall(h2_frame(SETTINGS, 0, 0, b"") + h2_frame(PING, 0, 0, b"abcdefgh"))
        frames, _ = read_frames(sock, 0.3)
        pings = [f for f in frames if isinstance(f, hyperframe.frame.PingFrame)]
        assert [(p.opaque_data, "ACK" in p.flags) for p in pings] == [(b"abcdefgh", True)]
        assert not goaways(frames)
    finally:
        sock.close()


def test_frame_larger_than_max_frame_size(rpc_server, client):
    sock = raw_connection(rpc_server.port)
    try:
        # A DATA frame header announcing 16385 bytes; SETTINGS_MAX_FRAME_SIZE is 16384.
        sock.sendall((16385).to_bytes(3, "big") + bytes((DATA, 0)) + (1).to_bytes(4, "big"))
        expect_goaway(sock, E_FRAME_SIZE_ERROR)
    finally:
        sock.close()
    assert_echo_works(client)


def test_connection_window_update_of_zero(rpc_server, client):
    sock = raw_connection(rpc_server.port)
    try:
        sock.sendall(h2_frame(WINDOW_UPDATE, 0, 0, (0).to_bytes(4, "big")))
        expect_goaway(sock, E_PROTOCOL_ERROR)
    finally:
        sock.close()
    assert_echo_works(client)


def test_connection_window_overflow(rpc_server):
    sock = raw_connection(rpc_server.port)
    try:
        sock.sendall(h2_frame(WINDOW_UPDATE, 0, 0, (2**31 - 1).to_bytes(4, "big")))
        expect_goaway(sock, E_FLOW_CONTROL_ERROR)
    finally:
        sock.close()


def test_headers_on_even_stream(rpc_server, client):
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", P + "Unary"), (":authority", "x"),
                                    ("content-type", "application/grpc"), ("te", "trailers")])
    sock = raw_connection(rpc_server.port)
    try:
        sock.sendall(h2_frame(HEADERS, END_HEADERS, 2, block))
        ga = expect_goaway(sock, E_PROTOCOL_ERROR)
        assert ga.last_stream_id == 0
    finally:
        sock.close()
    assert_echo_works(client)


def test_stream_ids_must_increase(rpc_server):
    enc = hpack.Encoder()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", P + "Unary"),
               (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
    sock = raw_connection(rpc_server.port)
    try:
        sock.sendall(h2_frame(HEADERS, END_HEADERS, 5, enc.encode(headers))
                     + h2_frame(DATA, END_STREAM, 5, grpc_message(b"x"))
                     + h2_frame(HEADERS, END_HEADERS, 3, enc.encode(headers)))
        frames, eof = read_frames(sock, 5)
        ga = goaways(frames)
        assert ga and eof
        # Stream 3 was implicitly closed by opening 5 (RFC 9113 5.1.1).
        assert ga[-1].error_code in (E_PROTOCOL_ERROR, E_STREAM_CLOSED)
        assert ga[-1].last_stream_id == 5
    finally:
        sock.close()


def test_ping_ack_echoes_payload(client):
    for payload in (b"\x00" * 8, b"12345678", bytes(range(248, 256))):
        client.conn.ping(payload)
        client.flush()
        assert client.wait(lambda: any(isinstance(e, h2.events.PingAckReceived)
                                       and e.ping_data == payload for e in client.events))
    assert_echo_works(client)


def test_header_block_split_over_continuation(rpc_server):
    """A request header block bigger than one frame arrives as HEADERS + CONTINUATIONs."""
    enc = hpack.Encoder()
    big = "v" * 40000
    block = enc.encode([(":method", "POST"), (":scheme", "http"), (":path", P + "Metadata"),
                        (":authority", "x"), ("content-type", "application/grpc"),
                        ("te", "trailers"), ("x-big", big)])
    assert len(block) > 2 * 16384
    frames = [h2_frame(HEADERS, 0, 1, block[:16384]),
              h2_frame(CONTINUATION, 0, 1, block[16384:32768]),
              h2_frame(CONTINUATION, END_HEADERS, 1, block[32768:]),
              h2_frame(DATA, END_STREAM, 1, grpc_message(b""))]
    sock = raw_connection(rpc_server.port)
    try:
        sock.sendall(b"".join(frames))
        got, _ = read_frames(sock, 0.5)
        headers = [f for f in got if isinstance(f, (hyperframe.frame.HeadersFrame,
                                                    hyperframe.frame.ContinuationFrame))]
        assert not goaways(got)
        dec = hpack.Decoder(max_header_list_size=1 << 20)
        blocks, current = [], b""
        for f in headers:
            current += f.data
            if "END_HEADERS" in f.flags:
                blocks.append(dict(dec.decode(current)))
                current = b""
        assert len(blocks) == 2
        assert blocks[0][":status"] == "200"
        assert blocks[0]["x-big"] == big          # echoed as initial metadata
        assert blocks[1]["grpc-status"] == "0"
        assert blocks[1]["x-big"] == big          # and as trailing metadata
    finally:
        sock.close()


def test_interleaved_frame_inside_header_block(rpc_server):
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"),
                                    (":path", P + "Unary"), (":authority", "x"),
                                    ("content-type", "application/grpc")])
    sock = raw_connection(rpc_server.port)
    try:
        sock.sendall(h2_frame(HEADERS, 0, 1, block[:5]) + h2_frame(PING, 0, 0, b"12345678"))
        expect_goaway(sock, E_PROTOCOL_ERROR)
    finally:
        sock.close()


# -- stream errors -------------------------------------------------------------------------

def test_truncated_length_prefix(client):
    sid = client.start_call(P + "Unary", end=False)
    client.conn.send_data(sid, b"\x00\x00\x00", end_stream=True)
    client.flush()
    assert client.wait(lambda: client.streams[sid].done)
    assert client.streams[sid].grpc_status == 13  # INTERNAL
    assert client.terminated is None
    assert_echo_works(client)


def test_truncated_message_body(client):
    sid = client.start_call(P + "Unary", end=False)
    client.conn.send_data(sid, b"\x00\x00\x00\x00\x0aabc", end_stream=True)
    client.flush()
    assert client.wait(lambda: client.streams[sid].done)
    assert client.streams[sid].grpc_status == 13
    assert_echo_works(client)


def test_oversize_length_prefix(client):
    sid = client.start_call(P + "Unary", end=False)
    client.conn.send_data(sid, b"\x00" + (17 << 20).to_bytes(4, "big") + b"partial",
                          end_stream=False)
    client.flush()
    assert client.wait(lambda: client.streams[sid].done)
    assert client.streams[sid].grpc_status == 8  # RESOURCE_EXHAUSTED
    assert client.terminated is None
    assert_echo_works(client)


def test_method_request_limit_refuses_from_the_prefix(server_factory):
    """Server.limit_requests: a method's own limit is checked on the length prefix and
    refused the method's way, with the message's first bytes for the refusal to use; above
    a limit larger than the transport's cap, the cap (RESOURCE_EXHAUSTED) still holds."""
    srv = server_factory(config=TransportConfig(max_message_size=1 << 20))
    seen = []

    def refuse(size, head):
        seen.append((size, head))
        return RpcError(StatusCode.INVALID_ARGUMENT, f"{size} is over 1000")
    srv.server.limit_requests(P + "Unary", 1000, refuse)
    srv.server.limit_requests(P + "Inspect", 4 << 20, refuse)
    c = RawH2Client(srv.port)
    try:
        c.wait(lambda: c.settings_received)
        sid = c.start_call(P + "Unary", end=False)
        c.conn.send_data(sid, b"\x00" + (5000).to_bytes(4, "big") + b"head", end_stream=False)
        c.flush()
        assert c.wait(lambda: c.streams[sid].done)
        assert c.streams[sid].grpc_status == 3
        assert c.streams[sid].header(b"grpc-message") == b"5000 is over 1000"
        assert c.wait(lambda: c.streams[sid].reset is not None)
        assert c.streams[sid].reset == E_NO_ERROR
        assert seen == [(5000, b"head")]
        assert_echo_works(c, b"x" * 1000)
        sid = c.start_call(P + "Inspect", end=False)
        c.conn.send_data(sid, b"\x00" + ((1 << 20) + 1).to_bytes(4, "big"), end_stream=False)
        c.flush()
        assert c.wait(lambda: c.streams[sid].done)
        assert c.streams[sid].grpc_status == 8  # RESOURCE_EXHAUSTED
        assert len(seen) == 1
        assert c.terminated is None
        assert_echo_works(c)
    finally:
        c.close()


def test_invalid_compressed_flag(client):
    sid = client.start_call(P + "Unary", end=False)
    client.conn.send_data(sid, b"\x07\x00\x00\x00\x01x", end_stream=True)
    client.flush()
    assert client.wait(lambda: client.streams[sid].done)
    assert client.streams[sid].grpc_status == 13
    assert_echo_works(client)


def test_two_messages_on_unary_call(client):
    r = client.call(P + "Unary", [b"one", b"two"])
    # INTERNAL, as grpc-go and grpc-java answer, as soon as the second message arrives.
    assert r.grpc_status == 13
    r = client.call(P + "Unary", [])
    assert r.grpc_status == 13
    assert_echo_works(client)


def test_non_grpc_requests_get_http_errors(client):
    sid = client.conn.get_next_available_stream_id()
    client.conn.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"http"),
                                   (b":path", b"/"), (b":authority", b"x")], end_stream=True)
    client.flush()
    assert client.wait(lambda: client.streams[sid].done)
    assert dict(client.streams[sid].headers)[b":status"] == b"405"
    sid = client.start_call(P + "Unary", [b"x"],
                            extra_headers=())  # valid call in between
    assert client.wait(lambda: client.streams[sid].done)
    sid = client.conn.get_next_available_stream_id()
    client.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                   (b":path", P.encode() + b"Unary"), (b":authority", b"x"),
                                   (b"content-type", b"text/plain")], end_stream=True)
    client.flush()
    assert client.wait(lambda: client.streams[sid].done)
    assert dict(client.streams[sid].headers)[b":status"] == b"415"
    assert_echo_works(client)


def test_bad_grpc_timeout_and_encoding(client):
    r = client.call(P + "Unary", [b"x"], extra_headers=[(b"grpc-timeout", b"12X")])
    assert r.grpc_status == 13
    r = client.call(P + "Unary", [b"x"], extra_headers=[(b"grpc-encoding", b"snappy")])
    assert r.grpc_status == 12
    assert_echo_works(client)


def test_stream_window_update_of_zero_resets_stream(rpc_server, client):
    key = unique_key("wu0")
    sid = client.start_call(P + "Hang", [key])
    svc = rpc_server.service
    assert rpc_server.wait_for(lambda: svc.hang_started[key] == 1)
    client.send_raw(h2_frame(WINDOW_UPDATE, 0, sid, (0).to_bytes(4, "big")))
    assert client.wait(lambda: client.streams[sid].reset is not None)
    assert client.streams[sid].reset == E_PROTOCOL_ERROR
    assert svc.hang_cancelled[key].wait(2)
    assert client.terminated is None
    assert_echo_works(client)


def test_client_trailers_after_server_reset_are_ignored(rpc_server):
    """The server fails a call early and resets the stream (RST_STREAM NO_ERROR) while the
    client's end of the request, a trailers HEADERS frame, is already in flight. RFC 9113
    5.1: frames received on a stream after sending RST_STREAM must be ignored; the
    connection and its other calls must not be torn down."""
    enc = hpack.Encoder()
    sock = raw_connection(rpc_server.port)
    fs = FrameStream(sock)
    try:
        sock.sendall(
            h2_frame(HEADERS, END_HEADERS, 1, encode_request(P + "Unary", rpc_server.port,
                                                             encoder=enc))
            + h2_frame(DATA, 0, 1, b"\x00" + (17 << 20).to_bytes(4, "big") + b"xx")
            + h2_frame(HEADERS, END_HEADERS | END_STREAM, 1,
                       enc.encode([("x-trailer", "late")])))
        _raw_call(sock, 3, P + "Unary", rpc_server.port, b"next", enc)
        assert fs.wait(lambda frames: fs.stream_ended(3) or fs.eof or goaways(frames), 3)
        assert not goaways(fs.frames), goaways(fs.frames)[0].additional_data
        assert _response(fs, 1)[0] == 8
        assert _response(fs, 3) == (0, [b"next"])
    finally:
        sock.close()


def test_deadline_before_request_body(client):
    """The client sends headers with a timeout but never the request: the server's own
    deadline fails the call (the handler never ran)."""
    sid = client.start_call(P + "Unary", end=False, extra_headers=[(b"grpc-timeout", b"100m")])
    # No upper bound on the time: without the server's deadline the call never ends, which
    # the wait's own limit (generous for a slow machine) catches.
    assert client.wait(lambda: client.streams[sid].done, 30)
    assert client.streams[sid].grpc_status == 4
    assert_echo_works(client)


def test_max_concurrent_streams_refuses_extra_streams(server_factory):
    srv = server_factory(config=TransportConfig(max_concurrent_streams=4))
    svc = srv.service
    key = unique_key("limit")
    sock = raw_connection(srv.port)
    fs = FrameStream(sock)
    enc = hpack.Encoder()
    try:
        assert fs.wait(lambda frames: any(isinstance(f, hyperframe.frame.SettingsFrame)
                                          and f.settings.get(3) == 4 for f in frames))
        for sid in (1, 3, 5, 7):
            _raw_call(sock, sid, P + "Hang", srv.port, key, enc)
        assert srv.wait_for(lambda: svc.hang_started[key] == 4)
        _raw_call(sock, 9, P + "Unary", srv.port, b"one too many", enc)
        assert fs.wait(lambda frames: fs.of_stream(9), 2)
        rst = fs.of_stream(9, hyperframe.frame.RstStreamFrame)
        assert rst and rst[0].error_code == E_REFUSED_STREAM
        srv.release(key)
        assert fs.wait(lambda frames: all(fs.stream_ended(s) for s in (1, 3, 5, 7)), 3)
        assert all(_response(fs, s) == (0, [b"released"]) for s in (1, 3, 5, 7))
        # Slots are free again.
        _raw_call(sock, 11, P + "Unary", srv.port, b"fits now", enc)
        assert fs.wait(lambda frames: fs.stream_ended(11), 2)
        assert _response(fs, 11) == (0, [b"fits now"])
        assert svc.calls["Unary"] == 1
    finally:
        sock.close()


# -- cancellation --------------------------------------------------------------------------

def test_rst_stream_cancels_handler(rpc_server, client):
    svc = rpc_server.service
    key = unique_key("rst")
    sid = client.start_call(P + "Hang", [key])
    assert rpc_server.wait_for(lambda: svc.hang_started[key] == 1)
    assert not svc.hang_cancelled[key].is_set()
    client.conn.reset_stream(sid, error_code=E_CANCEL)
    client.flush()
    assert svc.hang_cancelled[key].wait(2), "handler was not cancelled by RST_STREAM"
    assert rpc_server.wait_for(lambda: svc.hang_finished[key] == 1)
    assert_echo_works(client)
    # The server forgot the stream.
    conns = rpc_server.server.connections
    assert rpc_server.run_sync(lambda: sum(len(c.streams) for c in conns)) == 0


def test_disconnect_cancels_handler(rpc_server):
    svc = rpc_server.service
    key = unique_key("disc")
    c = RawH2Client(rpc_server.port)
    c.start_call(P + "Hang", [key])
    assert rpc_server.wait_for(lambda: svc.hang_started[key] == 1)
    c.close()
    assert svc.hang_cancelled[key].wait(2), "handler was not cancelled when the peer left"


def test_grpcio_cancel_cancels_handler(rpc_server):
    svc = rpc_server.service
    key = unique_key("grpcio-cancel")
    with grpc.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as ch:
        fut = ch.unary_unary(P + "Hang").future(key, timeout=30)
        assert rpc_server.wait_for(lambda: svc.hang_started[key] == 1)
        assert fut.cancel()
        assert svc.hang_cancelled[key].wait(2)


def test_server_deadline_cancels_handler(rpc_server, client):
    svc = rpc_server.service
    key = unique_key("deadline")
    start = time.monotonic()
    r = client.call(P + "Hang", [key], extra_headers=[(b"grpc-timeout", b"150m")])
    assert r.grpc_status == 4  # DEADLINE_EXCEEDED sent by the server itself
    # Hang never returns by itself: ending at all is the deadline's doing, not before it.
    assert 0.1 < time.monotonic() - start
    assert svc.hang_cancelled[key].wait(30)


# -- graceful shutdown -----------------------------------------------------------------------

def _raw_call(sock, sid, path, port, message, encoder, extra=()):
    sock.sendall(h2_frame(HEADERS, END_HEADERS, sid, encode_request(path, port, extra, encoder))
                 + h2_frame(DATA, END_STREAM, sid, grpc_message(message)))


def _response(fs: FrameStream, sid):
    """(grpc-status, messages) of a finished stream, from raw frames."""
    dec = hpack.Decoder()
    status = None
    for f in fs.of_stream(sid, hyperframe.frame.HeadersFrame):
        fields = dict(dec.decode(f.data))
        if "grpc-status" in fields:
            status = int(fields["grpc-status"])
    body = b"".join(f.data for f in fs.of_stream(sid, hyperframe.frame.DataFrame))
    return status, [m for _, m in split_grpc_messages(body)]


def _sync(sock, fs, opaque):
    """A PING round trip: the server has processed everything sent before it."""
    sock.sendall(h2_frame(PING, 0, 0, opaque))
    assert fs.wait(lambda frames: any(isinstance(f, hyperframe.frame.PingFrame)
                                      and f.opaque_data == opaque for f in frames))


def test_graceful_goaway_lets_inflight_call_finish(server_factory):
    srv = server_factory()
    sock = raw_connection(srv.port)
    fs = FrameStream(sock)
    try:
        # 3 s: still in flight while the checks below run, even on a slow machine.
        _raw_call(sock, 1, P + "Sleep", srv.port, b"3000", hpack.Encoder())
        _sync(sock, fs, b"synced!!")
        t0 = time.monotonic()
        stopping = srv.submit(srv.server.stop(GRACE))
        assert fs.wait(lambda frames: goaways(frames), 30), "no GOAWAY from server.stop()"
        ga = goaways(fs.frames)[0]
        assert (ga.error_code, ga.last_stream_id) == (E_NO_ERROR, 1)
        assert not fs.stream_ended(1)
        # New connections are refused while the in-flight call is still running.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=2).close()
        assert fs.wait(lambda frames: fs.stream_ended(1), 30), "in-flight call did not finish"
        assert _response(fs, 1) == (0, [b"3000"])
        stopping.result(GRACE)
        elapsed = time.monotonic() - t0
        # Relative to the grace: a stop that waited it out instead of ending with the last
        # call would take all of it.
        assert elapsed < GRACE / 2, f"stop() took {elapsed:.1f}s after the last call finished"
        assert fs.wait(lambda frames: fs.eof, 2), "connection not closed after the last call"
    finally:
        sock.close()


def test_streams_opened_after_goaway_are_refused(server_factory):
    srv = server_factory()
    sock = raw_connection(srv.port)
    fs = FrameStream(sock)
    enc = hpack.Encoder()
    try:
        _raw_call(sock, 1, P + "Sleep", srv.port, b"400", enc)
        _sync(sock, fs, b"synced!!")
        stopping = srv.submit(srv.server.stop(5))
        assert fs.wait(lambda frames: goaways(frames), 2)
        # A stream the client opened before it saw the GOAWAY: refused, not processed.
        _raw_call(sock, 3, P + "Unary", srv.port, b"late", enc)
        assert fs.wait(lambda frames: fs.of_stream(3), 2)
        rst = fs.of_stream(3, hyperframe.frame.RstStreamFrame)
        assert rst and rst[0].error_code == E_REFUSED_STREAM
        assert fs.wait(lambda frames: fs.stream_ended(1), 5)
        assert _response(fs, 1) == (0, [b"400"])
        stopping.result(5)
        assert srv.service.calls["Unary"] == 0
    finally:
        sock.close()


def test_graceful_shutdown_with_grpcio(server_factory):
    srv = server_factory()
    with grpc.insecure_channel(srv.target, options=GRPC_OPTIONS) as ch:
        assert ch.unary_unary(P + "Unary")(b"warm", timeout=5) == b"warm"
        fut = ch.unary_unary(P + "Sleep").future(b"500", timeout=10)
        wait_for(lambda: srv.service.calls["Sleep"] == 1, what="the call in its handler")
        srv.call(srv.server.stop(5))
        assert fut.result() == b"500"
        with pytest.raises(grpc.RpcError) as exc:
            ch.unary_unary(P + "Unary")(b"x", timeout=2)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE


def test_stop_grace_expiry_cancels_handlers(server_factory):
    srv = server_factory()
    svc = srv.service
    key = unique_key("grace")
    sock = raw_connection(srv.port)
    fs = FrameStream(sock)
    try:
        _raw_call(sock, 1, P + "Hang", srv.port, key, hpack.Encoder())
        assert srv.wait_for(lambda: svc.hang_started[key] == 1)
        t0 = time.monotonic()
        # Hang never returns: the stop ends only because the grace ran out.
        srv.call(srv.server.stop(0.3), timeout=60)
        assert 0.25 < time.monotonic() - t0
        assert svc.hang_cancelled[key].is_set()
        assert fs.wait(lambda frames: fs.eof, 2), "connection left open after stop()"
        # The cancelled call was told why before the connection closed.
        assert _response(fs, 1) == (14, [])  # UNAVAILABLE
    finally:
        sock.close()


# -- flow control ------------------------------------------------------------------------------

def test_tiny_stream_window_opened_slowly(rpc_server):
    size = 3 << 20
    c = RawH2Client(rpc_server.port, initial_window=1024, connection_window=64 << 20,
                    auto_ack=False)
    try:
        sid = c.start_call(P + "Blob", [b"%d" % size])
        granted = 1024
        received = 0
        max_frame = 0
        step = 4096
        while not c.streams[sid].done:
            assert c.pump(5), "server stopped sending"
            for e in c.events:
                if isinstance(e, h2.events.DataReceived):
                    received += e.flow_controlled_length
                    max_frame = max(max_frame, e.flow_controlled_length)
            c.events.clear()
            assert received <= granted, "server overran the stream window"
            if received == granted:
                # Window shut: open it a little, only now.
                c.conn.increment_flow_control_window(step, stream_id=sid)
                c.flush()
                granted += step
        r = c.streams[sid]
        assert r.grpc_status == 0
        assert r.messages == [blob(size)]
        assert max_frame <= step
    finally:
        c.close()


def test_settings_ack_precedes_data_using_a_larger_window(rpc_server):
    """When the client raises SETTINGS_INITIAL_WINDOW_SIZE while the server is blocked on
    the stream window, the server must ACK the SETTINGS before sending DATA that relies on
    the new value: the client (grpc-core, h2) applies its new window only once ACKed."""
    size = 2 << 20
    c = RawH2Client(rpc_server.port, connection_window=64 << 20, auto_ack=False)
    try:
        sid = c.start_call(P + "Blob", [b"%d" % size])
        assert c.wait(lambda: len(c.streams[sid].data) == 65535), "stream window not used up"
        c.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4 << 20})
        c.flush()
        # h2 raises FlowControlError if DATA beyond the old window precedes the ACK.
        assert c.wait(lambda: c.streams[sid].done, 10)
        assert c.streams[sid].grpc_status == 0
        assert c.streams[sid].messages == [blob(size)]
    finally:
        c.close()


def test_server_respects_peer_max_frame_size(rpc_server):
    c = RawH2Client(rpc_server.port, initial_window=2**31 - 1, connection_window=64 << 20,
                    max_frame_size=1 << 20)
    try:
        r = c.call(P + "Blob", [b"%d" % (3 << 20)], timeout=10)
        assert r.grpc_status == 0
        assert r.messages == [blob(3 << 20)]
        sizes = [e.flow_controlled_length for e in c.events
                 if isinstance(e, h2.events.DataReceived)]
        assert max(sizes) <= 1 << 20
        assert max(sizes) > 16384  # it did use the larger frames it was allowed
    finally:
        c.close()


def test_non_reading_client_blocks_writer_on_stream_window(rpc_server):
    svc = rpc_server.service
    key = unique_key("flood-window")
    msg = 16384
    c = RawH2Client(rpc_server.port, connection_window=64 << 20, auto_ack=False)
    try:
        sid = c.start_call(P + "Flood", [key + b",%d" % msg])
        assert rpc_server.wait_for(lambda: key in svc.flood_contexts)
        ctx = svc.flood_contexts[key]
        # Blocked: a write waits for window (what it could not send is pending).
        wait_for(lambda: rpc_server.run_sync(lambda: ctx.pending_bytes) > 0,
                 what="the handler to block on the shut window")
        writes = svc.flood_writes[key]
        # ... and stays blocked: watched for a bounded window.
        holds_for(lambda: svc.flood_writes[key] == writes, 0.3,
                  what="handler kept writing into a shut window")
        # 65535 bytes of window hold 3 whole messages; the 4th or 5th blocks in write().
        assert writes <= 5
        pending = rpc_server.run_sync(lambda: ctx.pending_bytes)
        assert 0 < pending <= msg + 5
        c.conn.reset_stream(sid, E_CANCEL)
        c.flush()
        assert svc.flood_cancelled[key].wait(2)
    finally:
        c.close()


def test_non_reading_socket_bounds_server_buffers(rpc_server):
    """With windows wide open but the socket unread, the writer must stop on the transport's
    write buffer (pause_writing), not queue the stream into memory."""
    svc = rpc_server.service
    key = unique_key("flood-socket")
    msg = 65536
    c = RawH2Client(rpc_server.port, initial_window=2**31 - 1, connection_window=2**31 - 1 - 65535,
                    auto_ack=False)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        c.start_call(P + "Flood", [key + b",%d" % msg])
        assert rpc_server.wait_for(lambda: key in svc.flood_contexts)
        ctx = svc.flood_contexts[key]
        # Wait for the writes to stall (the kernel buffers fill first).
        last, stable_since = -1, time.monotonic()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = svc.flood_writes[key]
            if now != last:
                last, stable_since = now, time.monotonic()
            elif time.monotonic() - stable_since > 0.4:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"handler never blocked ({svc.flood_writes[key]} writes)")

        def buffers():
            conn = ctx.conn
            return ctx.pending_bytes, conn._out_bytes, conn.transport.get_write_buffer_size()
        pending, out, transport = rpc_server.run_sync(buffers)
        assert pending <= msg + 5
        assert out <= 1 << 20
        high = rpc_server.server.config.write_buffer_high
        # At most one more flush (256 KiB of queued frames) lands after pause_writing().
        assert transport <= high + (256 << 10) + 2 * (msg + 64), (transport, high)
        # And the total bytes written stay within the buffers (nothing grows unbounded).
        assert last * msg < 64 << 20
    finally:
        c.close()
    assert svc.flood_cancelled[key].wait(2)
