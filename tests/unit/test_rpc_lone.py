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

from danube.rpc import RpcError, StatusCode
from danube.rpc import server as server_mod
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
