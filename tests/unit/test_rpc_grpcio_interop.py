"""Interop of our gRPC server (danube.rpc.server) with the reference client: grpcio, both
the sync API and grpc.aio, using generic bytes-in/bytes-out calls."""

import asyncio
import json
import uuid

import grpc
import pytest

from rpc_fixtures import (ERROR_DETAILS, GRPC_OPTIONS, P, RawH2Client, blob,
                          split_grpc_messages, stream_message)

from danube.rpc.client import Channel


def channel(srv, **kw):
    return grpc.insecure_channel(srv.target, options=GRPC_OPTIONS, **kw)


@pytest.fixture(scope="module")
def ch(rpc_server):
    c = channel(rpc_server)
    yield c
    c.close()


def assert_serving(c):
    assert c.unary_unary(P + "Unary")(b"still-alive", timeout=5) == b"still-alive"


# -- unary -------------------------------------------------------------------------------

def test_unary_echo_sync(ch):
    assert ch.unary_unary(P + "Unary")(b"hello", timeout=5) == b"hello"
    assert ch.unary_unary(P + "Unary")(b"", timeout=5) == b""


async def test_unary_echo_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        assert await c.unary_unary(P + "Unary")(b"hello aio", timeout=5) == b"hello aio"
        responses = await asyncio.gather(*[c.unary_unary(P + "Unary")(b"m%d" % i, timeout=5)
                                           for i in range(50)])
        assert responses == [b"m%d" % i for i in range(50)]


def test_large_request_and_response_sync(ch):
    big = blob(3 << 20)
    assert ch.unary_unary(P + "Unary")(big, timeout=20) == big
    info = json.loads(ch.unary_unary(P + "Inspect")(big, timeout=20))
    assert info["length"] == len(big)
    assert ch.unary_unary(P + "Blob")(b"%d" % (3 << 20), timeout=20) == big


async def test_large_request_and_response_aio(rpc_server):
    big = blob(3 << 20)[::-1]
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        assert await c.unary_unary(P + "Unary")(big, timeout=20) == big


# -- streaming ---------------------------------------------------------------------------

N_STREAM = 100_000


def test_server_stream_100k_sync(ch):
    count = 0
    for i, message in enumerate(ch.unary_stream(P + "Stream")(b"%d" % N_STREAM, timeout=60)):
        if message != stream_message(i):
            pytest.fail(f"message {i} is {message[:20]!r}...")
        count += 1
    assert count == N_STREAM


async def test_server_stream_100k_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        call = c.unary_stream(P + "BatchStream")(b"%d,777" % N_STREAM, timeout=60)
        count = 0
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                break
            if message != stream_message(count):
                pytest.fail(f"message {count} is {message[:20]!r}...")
            count += 1
        assert count == N_STREAM
        assert await call.code() == grpc.StatusCode.OK


def test_client_stream_sync(ch):
    msgs = [b"x" * i for i in range(200)]
    assert ch.stream_unary(P + "Sum")(iter(msgs), timeout=10) == b"%d,%d" % (200, sum(range(200)))
    assert ch.stream_unary(P + "Sum")(iter([]), timeout=10) == b"0,0"


def test_bidi_sync(ch):
    msgs = [b"bidi-%d" % i for i in range(500)]
    assert list(ch.stream_stream(P + "BidiEcho")(iter(msgs), timeout=10)) == msgs


async def test_client_stream_and_bidi_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        async def gen():
            for i in range(100):
                yield b"%05d" % i
        assert await c.stream_unary(P + "Sum")(gen(), timeout=10) == b"100,500"

        call = c.stream_stream(P + "BidiEcho")(timeout=10)
        # Ping-pong: each response must arrive before the next request is written.
        for i in range(20):
            await call.write(b"ping-%d" % i)
            assert await call.read() == b"ping-%d" % i
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


# -- deadlines, errors -------------------------------------------------------------------

def test_deadline_exceeded_sync(ch, rpc_server):
    with pytest.raises(grpc.RpcError) as exc:
        ch.unary_unary(P + "Sleep")(b"2000", timeout=0.2)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_serving(ch)


async def test_deadline_exceeded_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.unary_unary(P + "Sleep")(b"60000", timeout=0.2)
        assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Relative to the handler's 60 s: the deadline ended the call, not the handler.
        assert loop.time() - start < 30
        assert await c.unary_unary(P + "Unary")(b"after", timeout=5) == b"after"


def test_server_sees_deadline(ch):
    info = json.loads(ch.unary_unary(P + "Inspect")(b"", timeout=30))
    # grpc-core rounds the timeout it sends up (30 s may go out as "30100m").
    assert 25 < info["timeout"] <= 31


@pytest.mark.parametrize("code,details", [
    (grpc.StatusCode.FAILED_PRECONDITION, ERROR_DETAILS),
    (grpc.StatusCode.NOT_FOUND, "topic /default/tøpic not found"),
    (grpc.StatusCode.INVALID_ARGUMENT, "100%%%"),
    (grpc.StatusCode.PERMISSION_DENIED, "%zz %4 %%41 日本語"),
    (grpc.StatusCode.ALREADY_EXISTS, "plain ascii"),
    (grpc.StatusCode.UNAUTHENTICATED, ""),
    (grpc.StatusCode.DATA_LOSS, "line1\nline2\r\n"),
])
def test_error_code_and_details_roundtrip_sync(ch, code, details):
    request = b"" if details == ERROR_DETAILS else b"%d|%s" % (code.value[0], details.encode())
    with pytest.raises(grpc.RpcError) as exc:
        ch.unary_unary(P + "Error")(request, timeout=5)
    assert exc.value.code() == code
    assert exc.value.details() == details


async def test_error_details_roundtrip_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.unary_unary(P + "Error")(b"", timeout=5)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert exc.value.details() == ERROR_DETAILS


def test_handler_exception_is_internal_sync(ch):
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as exc:
            ch.unary_unary(P + "Raise")(b"", timeout=5)
        assert exc.value.code() == grpc.StatusCode.INTERNAL
        assert "boom" in exc.value.details()
        assert_serving(ch)


async def test_handler_exception_is_internal_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.unary_unary(P + "Raise")(b"", timeout=5)
        assert exc.value.code() == grpc.StatusCode.INTERNAL
        assert await c.unary_unary(P + "Unary")(b"ok", timeout=5) == b"ok"


def test_unknown_method_sync(ch):
    for path in ("/test.Echo/Nope", "/no.Such/Service"):
        with pytest.raises(grpc.RpcError) as exc:
            ch.unary_unary(path)(b"x", timeout=5)
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as exc:
        list(ch.unary_stream("/test.Echo/NopeStream")(b"x", timeout=5))
    assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert_serving(ch)


async def test_unknown_method_aio(rpc_server):
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await c.unary_unary("/test.Echo/Nope")(b"x", timeout=5)
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED


# -- compression -------------------------------------------------------------------------

def test_gzip_request_channel_compression(rpc_server):
    payload = b"compress me " * 5000
    with channel(rpc_server, compression=grpc.Compression.Gzip) as c:
        info = json.loads(c.unary_unary(P + "Inspect")(payload, timeout=5))
        assert info["encoding"] == "gzip"
        assert info["compressed"] is True
        assert info["length"] == len(payload)
        assert c.unary_unary(P + "Unary")(payload, timeout=5) == payload
        assert c.stream_unary(P + "Sum")(iter([payload] * 3), timeout=5) == b"3,%d" % (
            3 * len(payload))


def test_gzip_and_deflate_request_call_compression(ch):
    payload = b"per-call compression " * 3000
    for comp, name in ((grpc.Compression.Gzip, "gzip"), (grpc.Compression.Deflate, "deflate")):
        info = json.loads(ch.unary_unary(P + "Inspect")(payload, timeout=5, compression=comp))
        assert (info["encoding"], info["compressed"], info["length"]) == (name, True, len(payload))
        assert ch.unary_unary(P + "Unary")(payload, timeout=5, compression=comp) == payload


async def test_gzip_request_aio(rpc_server):
    payload = b"aio gzip " * 4000
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS,
                                         compression=grpc.Compression.Gzip) as c:
        info = json.loads(await c.unary_unary(P + "Inspect")(payload, timeout=5))
        assert (info["encoding"], info["compressed"]) == ("gzip", True)


def test_compressed_responses_decoded_by_grpcio(gzip_server):
    payload = b"squeeze " * 20000
    with channel(gzip_server) as c:
        assert c.unary_unary(P + "Unary")(payload, timeout=5) == payload
        got = list(c.unary_stream(P + "Stream")(b"500", timeout=10))
        assert got == [stream_message(i) for i in range(500)]
        got = list(c.unary_stream(P + "BatchStream")(b"500,64", timeout=10))
        assert got == [stream_message(i) for i in range(500)]


def test_compressed_responses_on_the_wire(gzip_server):
    """Check the response really is compressed: grpc-encoding header and flag 1 on the
    length prefix, fewer bytes than the message, and it decompresses to the message."""
    import zlib
    payload = b"squeeze " * 20000
    client = RawH2Client(gzip_server.port)
    try:
        r = client.call(P + "Unary", [payload],
                        extra_headers=[(b"grpc-accept-encoding", b"identity,gzip")])
        assert r.grpc_status == 0
        assert dict(r.headers)[b"grpc-encoding"] == b"gzip"
        (flag, body), = split_grpc_messages(bytes(r.data))
        assert flag == 1
        assert len(body) < len(payload) // 10
        assert zlib.decompress(body, 31) == payload
        # A client that does not accept gzip gets identity.
        r = client.call(P + "Unary", [payload])
        assert r.grpc_status == 0
        assert b"grpc-encoding" not in dict(r.headers)
        assert split_grpc_messages(bytes(r.data)) == [(0, payload)]
    finally:
        client.close()


async def test_compressed_responses_our_client(gzip_server):
    async with Channel(gzip_server.target) as c:
        call = await c.unary_stream(P + "Stream")(b"10")
        assert [m async for m in call] == [stream_message(i) for i in range(10)]
        assert call.stream.encoding == "gzip"


# -- metadata ----------------------------------------------------------------------------

def test_metadata_roundtrip_sync(ch):
    md = (("x-plain", "value 1"), ("x-trace-bin", b"\x00\x01\xfe\xff binary"),
          ("x-multi", "a"), ("x-multi", "b"))
    response, call = ch.unary_unary(P + "Metadata").with_call(b"", metadata=md, timeout=5)
    seen = json.loads(response)
    assert ["x-plain", "value 1"] in seen
    assert ["x-trace-bin", "b64:AAH+/yBiaW5hcnk="] in seen
    for got in (call.initial_metadata(), call.trailing_metadata()):
        got = [(k, v) for k, v in got if k.startswith("x-")]
        assert got == list(md)


async def test_metadata_roundtrip_aio(rpc_server):
    md = (("x-user", "alice"), ("x-token-bin", bytes(range(256))))
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        call = c.unary_unary(P + "Metadata")(b"", metadata=md, timeout=5)
        await call
        initial = [(k, v) for k, v in await call.initial_metadata() if k.startswith("x-")]
        trailing = [(k, v) for k, v in await call.trailing_metadata() if k.startswith("x-")]
        assert initial == list(md)
        assert trailing == list(md)


# -- concurrency ---------------------------------------------------------------------------

async def test_2000_concurrent_streams_aio(rpc_server):
    """2,000 calls in flight at once on one channel: the hang handler only returns once all
    2,000 have started on the server."""
    key = b"conc-" + uuid.uuid4().hex.encode()
    n = 2000
    svc = rpc_server.service
    async with grpc.aio.insecure_channel(rpc_server.target, options=GRPC_OPTIONS) as c:
        method = c.unary_unary(P + "Hang")
        tasks = [asyncio.ensure_future(method(key, timeout=60)) for _ in range(n)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while svc.hang_started[key] < n and loop.time() < deadline:
            await asyncio.sleep(0.02)
        started = svc.hang_started[key]
        rpc_server.release(key)
        results = await asyncio.gather(*tasks)
        assert started == n
        assert results == [b"released"] * n
        assert svc.hang_finished[key] == n


# -- TLS ---------------------------------------------------------------------------------

def test_tls_secure_channel(tls_server, certs):
    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_pem)
    with grpc.secure_channel(tls_server.target, creds, options=GRPC_OPTIONS) as c:
        assert c.unary_unary(P + "Unary")(b"over tls", timeout=5) == b"over tls"
        big = blob(1 << 20)
        assert c.unary_unary(P + "Unary")(big, timeout=10) == big
        assert len(list(c.unary_stream(P + "Stream")(b"1000", timeout=10))) == 1000


def test_tls_untrusted_ca_fails(tls_server):
    import trustme
    other = trustme.CA()
    creds = grpc.ssl_channel_credentials(root_certificates=other.cert_pem.bytes())
    with grpc.secure_channel(tls_server.target, creds, options=GRPC_OPTIONS) as c:
        with pytest.raises(grpc.RpcError) as exc:
            c.unary_unary(P + "Unary")(b"x", timeout=3)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mtls_without_client_cert_fails(mtls_server, certs):
    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_pem)
    with grpc.secure_channel(mtls_server.target, creds, options=GRPC_OPTIONS) as c:
        with pytest.raises(grpc.RpcError) as exc:
            c.unary_unary(P + "Unary")(b"x", timeout=3)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert mtls_server.service.calls["Unary"] == 0


def test_mtls_with_client_cert(mtls_server, certs):
    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca_pem,
                                         private_key=certs.client_key_pem,
                                         certificate_chain=certs.client_chain_pem)
    with grpc.secure_channel(mtls_server.target, creds, options=GRPC_OPTIONS) as c:
        assert c.unary_unary(P + "Unary")(b"mutual", timeout=5) == b"mutual"


# -- message size limit --------------------------------------------------------------------

def test_request_over_transport_limit(small_limit_server):
    with channel(small_limit_server) as c:
        for size in ((1 << 20) + 1, 3 << 20):
            with pytest.raises(grpc.RpcError) as exc:
                c.unary_unary(P + "Unary")(b"z" * size, timeout=10)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert_serving(c)
        exact = b"e" * (1 << 20)
        assert c.unary_unary(P + "Unary")(exact, timeout=10) == exact


def test_response_over_transport_limit(small_limit_server):
    with channel(small_limit_server) as c:
        with pytest.raises(grpc.RpcError) as exc:
            c.unary_unary(P + "Blob")(b"%d" % (2 << 20), timeout=10)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_serving(c)


def test_compressed_request_inflating_over_limit(small_limit_server):
    """A small gzip message that inflates past the limit is RESOURCE_EXHAUSTED too."""
    with channel(small_limit_server, compression=grpc.Compression.Gzip) as c:
        with pytest.raises(grpc.RpcError) as exc:
            c.unary_unary(P + "Unary")(b"\x00" * (2 << 20), timeout=10)
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert_serving(c)
