"""Our gRPC client (danube.rpc.client.Channel) against our server running on a background
uvloop thread; the tests themselves run in pytest-asyncio's loop."""

import asyncio
import json
import socket
import struct
import time
import uuid

import pytest

from rpc_fixtures import ERROR_DETAILS, P, ServerThread, blob, stream_message
from waiting import async_holds_for, async_wait_for

from danube.rpc import RpcError, StatusCode
from danube.rpc.client import Channel, client_ssl_context
from danube.rpc.connection import TransportConfig


@pytest.fixture
async def ch(rpc_server):
    c = Channel(rpc_server.target)
    yield c
    await c.close()


async def echo_ok(c, payload=b"alive"):
    assert await c.unary_unary(P + "Unary")(payload, timeout=5) == payload


# -- unary -------------------------------------------------------------------------------

async def test_unary(ch):
    assert await ch.unary_unary(P + "Unary")(b"hello", timeout=5) == b"hello"
    assert await ch.unary_unary(P + "Unary")(b"") == b""
    responses = await asyncio.gather(*[ch.unary_unary(P + "Unary")(b"%d" % i, timeout=5)
                                       for i in range(300)])
    assert responses == [b"%d" % i for i in range(300)]


async def test_serializers(ch):
    method = ch.unary_unary(P + "Unary", lambda s: s.encode(), lambda b: b.decode())
    assert await method("tëxt", timeout=5) == "tëxt"


async def test_large_messages(ch):
    big = blob(3 << 20)
    assert await ch.unary_unary(P + "Unary")(big, timeout=20) == big
    assert await ch.unary_unary(P + "Blob")(b"%d" % (5 << 20), timeout=20) == blob(5 << 20)


# -- streaming ---------------------------------------------------------------------------

async def test_server_stream(ch):
    call = await ch.unary_stream(P + "Stream")(b"2000", timeout=10)
    got = [m async for m in call]
    assert got == [stream_message(i) for i in range(2000)]
    assert call.code() == StatusCode.OK


async def test_read_batch_with_batch_stream(ch):
    n = 20_000
    call = await ch.unary_stream(P + "BatchStream")(b"%d,500" % n, timeout=20)
    got, batches = [], 0
    while True:
        batch = await call.read_batch()
        if not batch:
            break
        batches += 1
        got.extend(batch)
    assert len(got) == n
    assert got == [stream_message(i) for i in range(n)]
    assert batches < n  # messages did arrive several at a time
    assert await call.read_batch() == []


async def test_empty_server_stream(ch):
    call = await ch.unary_stream(P + "Stream")(b"0", timeout=5)
    assert [m async for m in call] == []
    assert await call.read_batch() == []


async def test_client_stream(ch):
    async def gen():
        for i in range(1000):
            yield b"y" * (i % 10)
    assert await ch.stream_unary(P + "Sum")(gen(), timeout=10) == b"1000,%d" % (
        sum(i % 10 for i in range(1000)))
    assert await ch.stream_unary(P + "Sum")([b"ab", b"cde"], timeout=10) == b"2,5"
    assert await ch.stream_unary(P + "Sum")([], timeout=10) == b"0,0"
    # More than a stream window (4 MiB) of requests: exercises both directions' crediting.
    chunk = b"c" * (256 << 10)
    total = await ch.stream_unary(P + "Sum")([chunk] * 40, timeout=20)
    assert total == b"40,%d" % (40 * len(chunk))


async def test_bidi(ch):
    call = await ch.stream_stream(P + "BidiEcho")(timeout=10)
    for i in range(50):
        await call.write(b"ping-%d" % i)
        assert await call.read() == b"ping-%d" % i
    await call.done_writing()
    assert await call.read() is None
    assert call.code() == StatusCode.OK


async def test_bidi_write_all_then_read(ch):
    call = await ch.stream_stream(P + "BidiEcho")(timeout=10)
    msgs = [b"m%04d" % i for i in range(3000)]
    for m in msgs:
        await call.write(m)
    await call.done_writing()
    assert [m async for m in call] == msgs


# -- deadlines, errors, cancellation --------------------------------------------------------

async def test_deadline_exceeded(ch, rpc_server):
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(RpcError) as exc:
        await ch.unary_unary(P + "Sleep")(b"60000", timeout=0.2)
    assert exc.value.code == StatusCode.DEADLINE_EXCEEDED
    # Relative to the handler's 60 s: the deadline ended the call, not the handler.
    assert 0.15 < loop.time() - t0 < 30
    await echo_ok(ch)


async def test_deadline_cancels_server_handler(ch, rpc_server):
    key = b"dl-" + uuid.uuid4().hex.encode()
    with pytest.raises(RpcError) as exc:
        await ch.unary_unary(P + "Hang")(key, timeout=0.2)
    assert exc.value.code == StatusCode.DEADLINE_EXCEEDED
    assert await asyncio.to_thread(rpc_server.service.hang_cancelled[key].wait, 2)


async def test_deadline_on_streaming_call(ch):
    call = await ch.unary_stream(P + "Flood")(b"dl-stream-%s,100" % uuid.uuid4().hex.encode(),
                                              timeout=0.3)
    n = 0
    with pytest.raises(RpcError) as exc:
        async for _ in call:
            n += 1
    assert exc.value.code == StatusCode.DEADLINE_EXCEEDED
    assert n > 0


async def test_server_sees_timeout(ch):
    info = json.loads(await ch.unary_unary(P + "Inspect")(b"", timeout=12.5))
    assert 12.0 < info["timeout"] <= 12.5


async def test_error_details_roundtrip(ch):
    with pytest.raises(RpcError) as exc:
        await ch.unary_unary(P + "Error")(b"", timeout=5)
    assert exc.value.code == StatusCode.FAILED_PRECONDITION
    assert exc.value.details == ERROR_DETAILS
    for code in (StatusCode.NOT_FOUND, StatusCode.ABORTED, StatusCode.OUT_OF_RANGE):
        details = f"{code.name} 100% ✗ %2"
        with pytest.raises(RpcError) as exc:
            await ch.unary_unary(P + "Error")(b"%d|%s" % (code, details.encode()), timeout=5)
        assert (exc.value.code, exc.value.details) == (code, details)


async def test_handler_exception_is_internal(ch):
    with pytest.raises(RpcError) as exc:
        await ch.unary_unary(P + "Raise")(b"", timeout=5)
    assert exc.value.code == StatusCode.INTERNAL
    await echo_ok(ch)


async def test_unknown_method(ch):
    with pytest.raises(RpcError) as exc:
        await ch.unary_unary("/test.Echo/Missing")(b"", timeout=5)
    assert exc.value.code == StatusCode.UNIMPLEMENTED
    assert "/test.Echo/Missing" in exc.value.details


async def test_cancel_unary_call_cancels_handler(ch, rpc_server):
    key = b"cancel-" + uuid.uuid4().hex.encode()
    svc = rpc_server.service
    task = asyncio.ensure_future(ch.unary_unary(P + "Hang")(key, timeout=30))
    assert await asyncio.to_thread(rpc_server.wait_for, lambda: svc.hang_started[key] == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(svc.hang_cancelled[key].wait, 2)
    await echo_ok(ch)


async def test_cancel_streaming_call(ch, rpc_server):
    key = b"cancel-flood-" + uuid.uuid4().hex.encode()
    svc = rpc_server.service
    call = await ch.unary_stream(P + "Flood")(key + b",1000", timeout=30)
    assert await call.read() == b"f" * 1000
    call.cancel()
    assert await asyncio.to_thread(svc.flood_cancelled[key].wait, 2)
    with pytest.raises(RpcError) as exc:
        await call.read_batch()  # whatever was queued may still be read first
        await call.read_batch()
        await call.read_batch()
    assert exc.value.code == StatusCode.CANCELLED


async def test_slow_reader_holds_back_server(ch, rpc_server):
    """A client that stops reading a server stream stops crediting its window, so the
    server's handler blocks in write() instead of everything piling up client-side."""
    svc = rpc_server.service
    key = b"slow-reader-" + uuid.uuid4().hex.encode()
    msg = 64 << 10
    call = await ch.unary_stream(P + "Flood")(key + b",%d" % msg, timeout=30)
    assert len(await call.read()) == msg

    def stalled():
        last = -1
        for _ in range(100):
            time.sleep(0.1)
            now = svc.flood_writes[key]
            if now == last:
                return now
            last = now
        return None
    writes = await asyncio.to_thread(stalled)
    assert writes is not None, "server never stopped writing to a client that does not read"
    window = ch.config.stream_window
    assert writes * msg <= 2 * window + 4 * msg, (writes, window)
    # Reading again resumes the flow.
    for _ in range(writes + 10):
        assert len(await call.read()) == msg
    assert svc.flood_writes[key] > writes
    call.cancel()
    assert await asyncio.to_thread(svc.flood_cancelled[key].wait, 2)


async def test_response_over_client_limit(rpc_server):
    async with Channel(rpc_server.target, config=TransportConfig(max_message_size=1 << 20)) as c:
        with pytest.raises(RpcError) as exc:
            await c.unary_unary(P + "Blob")(b"%d" % (2 << 20), timeout=5)
        assert exc.value.code == StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(RpcError) as exc:
            await c.unary_unary(P + "Unary")(b"q" * ((1 << 20) + 1), timeout=5)
        assert exc.value.code == StatusCode.RESOURCE_EXHAUSTED
        await echo_ok(c)


async def test_local_reset_does_not_break_other_calls(rpc_server):
    """The client resets a call (here: response over its limit) while the server's trailers
    for it are already on the wire. Those late trailers must be ignored, not treated as a
    protocol error that takes down the connection and every other call on it."""
    svc = rpc_server.service
    key = b"bystander-" + uuid.uuid4().hex.encode()
    async with Channel(rpc_server.target, config=TransportConfig(max_message_size=1 << 20)) as c:
        await echo_ok(c)
        conn = await c.connection()
        bystander = asyncio.ensure_future(c.unary_unary(P + "Hang")(key, timeout=10))
        assert await asyncio.to_thread(rpc_server.wait_for, lambda: svc.hang_started[key] == 1)
        for _ in range(3):
            with pytest.raises(RpcError) as exc:
                await c.unary_unary(P + "Blob")(b"%d" % (2 << 20), timeout=5)
            assert exc.value.code == StatusCode.RESOURCE_EXHAUSTED
        # The late trailers arrive within a bounded window, and must not end the bystander.
        await async_holds_for(lambda: not bystander.done(), 0.1,
                              what=f"the bystander call still running: {bystander}")
        rpc_server.release(key)
        assert await bystander == b"released"
        assert (await c.connection()) is conn, "the connection was torn down"
        assert not svc.hang_cancelled[key].is_set()


# -- metadata ----------------------------------------------------------------------------

async def test_metadata(rpc_server):
    async with Channel(rpc_server.target, metadata=[("x-channel", "chan")]) as c:
        stream = await c.start_call(P + "Metadata", timeout=5,
                                    metadata=[("x-call", "call"), ("x-raw-bin", b"\x00\xff\x10")])
        await stream.send(b"", end=True)
        seen = json.loads(await stream.read())
        while stream.status is None:
            await stream._wait()
        stream.raise_for_status()
        assert ["x-channel", "chan"] in seen
        assert ["x-call", "call"] in seen
        assert ["x-raw-bin", "b64:AP8Q"] in seen
        assert ["user-agent", "danube-py-rpc/0.1"] in seen
        expected = [("x-channel", "chan"), ("x-call", "call"), ("x-raw-bin", b"\x00\xff\x10")]
        assert [kv for kv in stream.initial_metadata() if kv[0].startswith("x-")] == expected
        assert [kv for kv in stream.trailing_metadata() if kv[0].startswith("x-")] == expected


async def test_invalid_metadata_rejected_locally(ch):
    with pytest.raises(ValueError):
        await ch.unary_unary(P + "Unary")(b"", metadata=[("Bad Key", "v")])
    with pytest.raises(ValueError):
        await ch.unary_unary(P + "Unary")(b"", metadata=[("x-ok", "line\nbreak")])
    await echo_ok(ch)


# -- compression ---------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_request_compression_channel(rpc_server, encoding):
    payload = b"compressible " * 10000
    async with Channel(rpc_server.target, compression=encoding) as c:
        info = json.loads(await c.unary_unary(P + "Inspect")(payload, timeout=5))
        assert (info["encoding"], info["compressed"], info["length"]) == (encoding, True,
                                                                          len(payload))
        assert await c.unary_unary(P + "Unary")(payload, timeout=5) == payload
        assert await c.stream_unary(P + "Sum")([payload, b"x"], timeout=5) == b"2,%d" % (
            len(payload) + 1)


async def test_request_compression_per_call(ch):
    payload = b"per call " * 1000
    info = json.loads(await ch.unary_unary(P + "Inspect")(payload, timeout=5, compression="gzip"))
    assert (info["encoding"], info["compressed"]) == ("gzip", True)
    info = json.loads(await ch.unary_unary(P + "Inspect")(payload, timeout=5))
    assert (info["encoding"], info["compressed"]) == (None, False)


async def test_compressed_responses(gzip_server):
    async with Channel(gzip_server.target) as c:
        payload = b"z" * 100000
        stream = await c.start_call(P + "Unary", timeout=5)
        await stream.send(payload, end=True)
        assert await stream.read() == payload
        assert stream.encoding == "gzip"
        call = await c.unary_stream(P + "BatchStream")(b"3000,100", timeout=5)
        assert [m async for m in call] == [stream_message(i) for i in range(3000)]


# -- TLS -----------------------------------------------------------------------------------

async def test_tls(tls_server, certs):
    async with Channel(f"localhost:{tls_server.port}",
                       ssl=client_ssl_context(ca_file=certs.ca_file)) as c:
        await echo_ok(c, b"tls by name")
    async with Channel(tls_server.target, ssl=certs.client_context()) as c:
        await echo_ok(c, b"tls by ip")
        call = await c.unary_stream(P + "Stream")(b"500", timeout=5)
        assert len([m async for m in call]) == 500


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_server_that_hangs_up_before_any_frame_may_be_a_tls_port(reset):
    """A TLS server given our preface closes the connection, or resets it when the frames
    after the preface are still unread (which happens under load): either way, the error
    says what to try."""
    async def hang_up(reader, writer):
        await reader.read(1)                # the preface arrived; the rest stays unread
        if reset:
            writer.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    c = Channel(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        with pytest.raises(RpcError) as ei:
            await c.unary_unary(P + "Unary")(b"x", timeout=10)
    finally:
        await c.close()
        server.close()
    assert ei.value.code == StatusCode.UNAVAILABLE
    how = "reset" if reset else "closed"
    assert (f"the server {how} the connection before any HTTP/2 frame "
            "(is it a TLS port? then use https://)") in str(ei.value)


async def test_tls_wrong_ca(tls_server):
    import trustme
    ctx = client_ssl_context()
    trustme.CA().configure_trust(ctx)
    ctx.load_default_certs()
    async with Channel(tls_server.target, ssl=ctx, connect_timeout=3) as c:
        with pytest.raises(Exception) as exc:
            await c.unary_unary(P + "Unary")(b"x", timeout=3)
        assert isinstance(exc.value, RpcError) and exc.value.code == StatusCode.UNAVAILABLE, \
            repr(exc.value)


async def test_mtls(mtls_server, certs):
    ctx = client_ssl_context(ca_file=certs.ca_file, cert_file=certs.client_cert_file,
                             key_file=certs.client_key_file)
    async with Channel(mtls_server.target, ssl=ctx) as c:
        await echo_ok(c, b"mutual")
    async with Channel(mtls_server.target, ssl=client_ssl_context(ca_file=certs.ca_file),
                       connect_timeout=3) as c:
        with pytest.raises(Exception) as exc:
            await c.unary_unary(P + "Unary")(b"x", timeout=3)
        assert isinstance(exc.value, RpcError) and exc.value.code == StatusCode.UNAVAILABLE, \
            repr(exc.value)


# -- GOAWAY and reconnection -----------------------------------------------------------------

async def test_goaway_then_reconnect_to_new_server(server_factory):
    first = await asyncio.to_thread(server_factory)
    port = first.port
    c = Channel(first.target)
    try:
        await echo_ok(c, b"first")
        slow = asyncio.ensure_future(c.unary_unary(P + "Sleep")(b"300", timeout=5))
        await async_wait_for(lambda: first.service.calls["Sleep"] == 1,
                             what="the call in its handler")
        await asyncio.to_thread(first.call, first.server.stop(5))
        # The call in flight at GOAWAY completed normally.
        assert await slow == b"300"
        # Nobody listens now.
        with pytest.raises(RpcError) as exc:
            await c.unary_unary(P + "Unary")(b"x", timeout=2)
        assert exc.value.code == StatusCode.UNAVAILABLE
        # A new server on the same port: the same channel reconnects.
        second = await asyncio.to_thread(server_factory, port=port)
        assert second.port == port
        await echo_ok(c, b"second")
        assert second.service.calls["Unary"] == 1
    finally:
        await c.close()


async def test_goaway_while_idle_reconnects(server_factory):
    srv = await asyncio.to_thread(server_factory)
    c = Channel(srv.target)
    try:
        await echo_ok(c)
        conn = await c.connection()
        # A GOAWAY without shutting the listener down (what a draining proxy would do).
        await asyncio.to_thread(srv.run_sync,
                                lambda: [sc.begin_shutdown() for sc in srv.server.connections])
        await async_wait_for(lambda: conn.goaway_received is not None, what="the GOAWAY")
        assert not conn.usable
        await echo_ok(c, b"on a new connection")
        assert (await c.connection()) is not conn
    finally:
        await c.close()


async def test_connect_refused_is_unavailable():
    srv = ServerThread().start()
    port = srv.port
    srv.stop()
    async with Channel(f"127.0.0.1:{port}", connect_timeout=2) as c:
        with pytest.raises(RpcError) as exc:
            await c.unary_unary(P + "Unary")(b"x", timeout=2)
        assert exc.value.code == StatusCode.UNAVAILABLE
