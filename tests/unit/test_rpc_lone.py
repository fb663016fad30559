"""The server's lone-call path (danube/rpc/_lone.pyx, issue 35): a read holding exactly one
unary call's HEADERS and DATA is answered in C. It must be taken by what grpcio sends one
call at a time, and every call must end exactly as on the general path: the same answers,
statuses, details and metadata, for handlers that answer at once, suspend, fail, set
metadata or a status, for requests that do not parse, are over a method's limit or are
compressed, and for deadlines. Each case runs against a server with the path and one
without it (its input handed straight to the general path)."""

import asyncio

import grpc
import pytest

from danube.codec import http2
from danube.codec.http2 import FrameReader
from danube.rpc import RpcError, StatusCode
from danube.rpc import server as server_mod
from danube.rpc.config import TransportConfig
from danube.rpc.headers import encode_headers
from danube.rpc.server import Kind, Server


class _GeneralOnly:
    """Stands in for LoneCalls: every read goes to the general path."""

    def __init__(self, conn, *args):
        self.data_received = conn.take_input
        self.taken = 0

    def forget(self):
        pass


def _parse_int(data):
    return int(data.decode("ascii"))


def _limit_refusal(size, head):
    return RpcError(StatusCode.INVALID_ARGUMENT, f"too big: {size}")


async def _start(lone):
    server = Server()
    seen = {"cancelled": 0}

    async def echo(request, context):
        return request

    async def awaits(request, context):
        await asyncio.sleep(0)
        return request + b"!"

    async def refuses(request, context):
        raise RpcError(StatusCode.FAILED_PRECONDITION, "no " + request.decode(),
                       (("why", "because"),))

    async def breaks(request, context):
        raise ValueError("a bug")

    async def metadata(request, context):
        await context.send_initial_metadata((("first", "1"),))
        context.set_trailing_metadata((("last", "2"),))
        return b"meta"

    async def status(request, context):
        context.set_code(StatusCode.NOT_FOUND)
        context.set_details("set by the handler")
        return b""

    async def hangs(request, context):
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            seen["cancelled"] += 1
            raise

    async def remaining(request, context):
        left = context.time_remaining()
        return b"none" if left is None else b"%d" % round(left)

    async def parsed(request, context):
        return b"%d" % (request + 1)

    async def peer(request, context):
        meta = dict(context.invocation_metadata())
        return meta.get("x-who", "").encode()

    for name, handler in [("Echo", echo), ("Awaits", awaits), ("Refuses", refuses),
                          ("Breaks", breaks), ("Meta", metadata), ("Status", status),
                          ("Hangs", hangs), ("Remaining", remaining), ("Peer", peer),
                          ("Limited", echo)]:
        server.add_method(f"/t.T/{name}", Kind.UNARY_UNARY, handler)
    server.add_method("/t.T/Parsed", Kind.UNARY_UNARY, parsed, _parse_int, None)
    server.limit_requests("/t.T/Limited", 64, _limit_refusal)
    if lone:
        port = await server.start()
    else:
        original = server_mod.LoneCalls
        server_mod.LoneCalls = _GeneralOnly
        try:
            port = await server.start()
            # The connection is made later, when the client connects: keep the stand-in
            # until then (restored in _stop).
        except BaseException:
            server_mod.LoneCalls = original
            raise
        server._test_restore = original
    return server, port, seen


async def _stop(server):
    await server.stop(0.5)
    original = getattr(server, "_test_restore", None)
    if original is not None:
        server_mod.LoneCalls = original


def _taken(server):
    return sum(conn._lone.taken for conn in server.connections)


async def _outcome(channel, name, body, **kw):
    call = channel.unary_unary(f"/t.T/{name}")
    try:
        answer = call(body, **kw)
        response = await answer
        return ("ok", response, tuple(await answer.initial_metadata()),
                tuple(await answer.trailing_metadata()))
    except grpc.aio.AioRpcError as exc:
        trailing = tuple((k, v) for k, v in (exc.trailing_metadata() or ())
                         if k not in ("content-type",))
        return (exc.code(), exc.details(), trailing)


CASES = [
    ("Echo", b"hello", {}),
    ("Echo", b"", {}),
    ("Echo", b"x" * 20000, {}),
    ("Awaits", b"a", {}),
    ("Refuses", b"thing", {}),
    ("Breaks", b"x", {}),
    ("Meta", b"x", {}),
    ("Status", b"x", {}),
    ("Parsed", b"41", {}),
    ("Parsed", b"forty", {}),
    ("Limited", b"y" * 10, {}),
    ("Limited", b"y" * 100, {}),
    ("Remaining", b"", {"timeout": 30}),
    ("Remaining", b"", {}),
    ("Peer", b"", {"metadata": (("x-who", "me"),)}),
    ("Missing", b"", {}),
    ("Echo", b"z" * 300, {"compression": grpc.Compression.Gzip}),
]


async def _run_cases(lone):
    server, port, _ = await _start(lone)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            out = []
            for name, body, kw in CASES:
                # Twice: the second call's header block is the one cached by the first.
                await _outcome(channel, name, body, **kw)
                out.append(await _outcome(channel, name, body, **kw))
            return out, _taken(server)      # before the channel closes: the count is per connection
    finally:
        await _stop(server)


async def test_every_call_ends_as_on_the_general_path():
    general, none_taken = await _run_cases(lone=False)
    lone, taken = await _run_cases(lone=True)
    assert none_taken == 0
    for case, a, b in zip(CASES, general, lone):
        assert a == b, case
    # The path was used (most second calls: grpcio repeats a call's header block).
    assert taken >= 5, taken
    assert general[0] == ("ok", b"hello", (), ())
    assert general[4][0] == grpc.StatusCode.FAILED_PRECONDITION
    assert general[9][0] == grpc.StatusCode.INTERNAL and "parse" in general[9][1]
    assert general[11] == (grpc.StatusCode.INVALID_ARGUMENT, "too big: 100", ())


async def test_one_call_at_a_time_takes_the_lone_path():
    server, port, _ = await _start(lone=True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/Echo")
            for i in range(200):
                body = b"call %d" % i
                assert await call(body) == body
            taken = _taken(server)
        # grpcio sends each call's HEADERS and DATA in one write; a slow machine may split
        # one now and then (those go the general way).
        assert taken >= 100, taken
        assert server.active_calls == 0
    finally:
        await _stop(server)


async def test_a_deadline_still_ends_a_suspended_call():
    server, port, seen = await _start(lone=True)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/Hangs")
            # grpc-core sends a new grpc-timeout value as a literal the first times (not
            # cached), then by its index once it settles on one (cached): calls until the
            # lone path has taken some.
            calls = 0
            while calls < 3 or (_taken(server) < 2 and calls < 20):
                calls += 1
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call(b"", timeout=0.5)
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while seen["cancelled"] < calls or server.active_calls:
                assert loop.time() < deadline, (seen, server.active_calls)
                await asyncio.sleep(0.01)
            assert _taken(server) >= 2
    finally:
        await _stop(server)


# -- raw HTTP/2: what the path refuses reaches the general path's checks ---------------------

_BLOCK = encode_headers([(b":method", b"POST"), (b":scheme", b"http"),
                         (b":path", b"/t.T/Echo"), (b":authority", b"x"),
                         (b"content-type", b"application/grpc"), (b"te", b"trailers")])
_HANG_BLOCK = _BLOCK.replace(b"/t.T/Echo", b"/t.T/Hang")


def _call(sid, body=b"hi", block=_BLOCK):
    message = b"\0" + len(body).to_bytes(4, "big") + body
    return (http2.frame(http2.HEADERS, http2.FLAG_END_HEADERS, sid, block)
            + http2.frame(http2.DATA, http2.FLAG_END_STREAM, sid, message))


async def _raw(config=None):
    server = Server(config or TransportConfig())

    async def echo(request, context):
        return request

    async def hang(request, context):
        await asyncio.get_running_loop().create_future()

    server.add_method("/t.T/Echo", Kind.UNARY_UNARY, echo)
    server.add_method("/t.T/Hang", Kind.UNARY_UNARY, hang)
    port = await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(http2.CLIENT_PREFACE + http2.settings_frame([]))
    return server, reader, writer


async def _frames_until(reader, done, timeout=30):
    """Frames read until done(frames) holds (or the connection ends)."""
    frames, parser = [], FrameReader(1 << 24)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not done(frames):
        data = await asyncio.wait_for(reader.read(65536), max(0.1, end - loop.time()))
        if not data:
            break
        frames.extend(parser.feed(data))
    return frames


def _ended(sid):
    return lambda fs: any(f[0] == http2.HEADERS and f[2] == sid and f[1] & 1 for f in fs)


async def test_a_reused_stream_id_is_still_a_connection_error():
    server, reader, writer = await _raw()
    try:
        writer.write(_call(1))          # the general path: its head is cached from now on
        await _frames_until(reader, _ended(1))
        writer.write(_call(3))
        await _frames_until(reader, _ended(3))
        assert _taken(server) == 1
        writer.write(_call(3))          # again: refused by the lone path, an error on the other
        frames = await _frames_until(reader, lambda fs: any(f[0] == http2.GOAWAY for f in fs))
        goaway = [f for f in frames if f[0] == http2.GOAWAY]
        assert goaway and int.from_bytes(goaway[0][3][4:8], "big") == http2.E_PROTOCOL_ERROR
        assert _taken(server) == 1
    finally:
        writer.close()
        await server.stop(0.5)


async def test_the_concurrent_stream_limit_still_refuses():
    server, reader, writer = await _raw(TransportConfig(max_concurrent_streams=1))
    try:
        writer.write(_call(1, block=_HANG_BLOCK))    # held open by its handler
        writer.write(_call(3))
        frames = await _frames_until(
            reader, lambda fs: any(f[0] == http2.RST_STREAM and f[2] == 3 for f in fs))
        reset = [f for f in frames if f[0] == http2.RST_STREAM and f[2] == 3]
        assert int.from_bytes(reset[0][3], "big") == http2.E_REFUSED_STREAM
        assert _taken(server) == 0
    finally:
        writer.close()
        await server.stop(0.5)


async def test_a_call_past_the_method_limit_or_windows_goes_the_general_way():
    server, reader, writer = await _raw(TransportConfig(max_message_size=1000))
    try:
        writer.write(_call(1))
        await _frames_until(reader, _ended(1))
        writer.write(_call(3, b"x" * 2000))         # over max_message_size
        frames = await _frames_until(reader, _ended(3))
        trailers = [f for f in frames if f[0] == http2.HEADERS and f[2] == 3]
        assert trailers and _taken(server) == 0
        writer.write(_call(5, b"ok"))
        frames = await _frames_until(reader, _ended(5))
        assert any(f[0] == http2.DATA and f[2] == 5 and f[3].endswith(b"ok") for f in frames)
        assert _taken(server) == 1
    finally:
        writer.close()
        await server.stop(0.5)


async def test_the_routes_kept_per_connection_are_bounded():
    from danube.rpc._lone import MAX_ROUTES
    server, reader, writer = await _raw()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not server.connections:
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        conn = next(iter(server.connections))
        held = []
        sid = 1
        for i in range(MAX_ROUTES + 100):
            block = encode_headers([(b":method", b"POST"), (b":scheme", b"http"),
                                    (b":path", b"/t.T/Echo"), (b":authority", b"x"),
                                    (b"content-type", b"application/grpc"),
                                    (b"x-n", b"%d" % i)])
            for _ in range(2):      # the second call of each block is the lone path's
                writer.write(_call(sid, block=block))
                await _frames_until(reader, _ended(sid))
                sid += 2
            held.append(conn._lone.routes_held)
        assert max(held) <= MAX_ROUTES
        assert held[-1] < MAX_ROUTES + 100        # cleared once past the bound
        assert _taken(server) >= MAX_ROUTES
    finally:
        writer.close()
        await server.stop(0.5)
