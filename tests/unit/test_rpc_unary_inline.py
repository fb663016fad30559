"""A unary handler runs where its request completes, without a task of its own, and gets
one only if it suspends (issue 35): handlers that answer at once, that await once or many
times, that fail before or after awaiting, that are cancelled by the deadline or by the
server's stop while suspended, all behave as they did in a task of their own."""

import asyncio

import pytest

from danube.rpc import RpcError, StatusCode
from danube.rpc.client import Channel
from danube.rpc.server import Kind, Server


@pytest.fixture
async def served():
    server = Server()
    seen = {"cancelled": 0, "task_in_first_step": [], "contexts": []}
    release = asyncio.Event()

    async def at_once(request, context):
        seen["task_in_first_step"].append(asyncio.current_task())
        return request.upper()

    async def awaits(request, context):
        for _ in range(3):
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        seen["contexts"].append(asyncio.current_task() is not None)
        return request + b"!"

    async def hangs(request, context):
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            seen["cancelled"] += 1
            raise

    async def waits_for_release(request, context):
        await release.wait()
        return b"released"

    async def refuses(request, context):
        raise RpcError(StatusCode.FAILED_PRECONDITION, "no " + request.decode())

    async def refuses_later(request, context):
        await asyncio.sleep(0)
        raise RpcError(StatusCode.ABORTED, "later")

    async def breaks(request, context):
        raise ValueError("a bug")

    async def timeout_inside(request, context):
        # asyncio.timeout needs the current task: a unary handler has one from its first
        # suspension on (danube/rpc/server.py's docstring).
        await asyncio.sleep(0)
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
            return b"ok"

    for name, handler in [("AtOnce", at_once), ("Awaits", awaits), ("Hangs", hangs),
                          ("Waits", waits_for_release), ("Refuses", refuses),
                          ("RefusesLater", refuses_later), ("Breaks", breaks),
                          ("TimeoutInside", timeout_inside)]:
        server.add_method(f"/t.T/{name}", Kind.UNARY_UNARY, handler)
    port = await server.start()
    channel = Channel(f"127.0.0.1:{port}")
    yield server, channel, seen, release
    await channel.close()
    await server.stop(0.5)


def call(channel, name):
    return channel.unary_unary(f"/t.T/{name}")


async def test_answered_in_the_first_step_without_a_task(served):
    server, channel, seen, _ = served
    answers = await asyncio.gather(*(call(channel, "AtOnce")(b"x%d" % i, timeout=5)
                                     for i in range(50)))
    assert answers == [b"X%d" % i for i in range(50)]
    assert seen["task_in_first_step"] == [None] * 50
    assert server.active_calls == 0


async def test_a_handler_that_suspends_is_resumed_in_a_task(served):
    server, channel, seen, _ = served
    answers = await asyncio.gather(*(call(channel, "Awaits")(b"a%d" % i, timeout=5)
                                     for i in range(20)))
    assert answers == [b"a%d!" % i for i in range(20)]
    assert seen["contexts"] == [True] * 20
    assert await call(channel, "TimeoutInside")(b"", timeout=5) == b"ok"
    assert server.active_calls == 0


@pytest.mark.parametrize("name,code,details", [
    ("Refuses", StatusCode.FAILED_PRECONDITION, "no thing"),
    ("RefusesLater", StatusCode.ABORTED, "later"),
    ("Breaks", StatusCode.INTERNAL, "ValueError: a bug"),
])
async def test_failures_before_and_after_suspending(served, name, code, details):
    server, channel, _, _ = served
    with pytest.raises(RpcError) as err:
        await call(channel, name)(b"thing", timeout=5)
    assert err.value.code == code and details in err.value.details
    assert server.active_calls == 0


async def test_the_deadline_cancels_a_suspended_handler(served):
    server, channel, seen, _ = served
    with pytest.raises(RpcError) as err:
        await call(channel, "Hangs")(b"", timeout=0.2)
    assert err.value.code == StatusCode.DEADLINE_EXCEEDED
    deadline = asyncio.get_running_loop().time() + 10
    while seen["cancelled"] < 1 or server.active_calls:
        assert asyncio.get_running_loop().time() < deadline, seen
        await asyncio.sleep(0.01)


async def test_stop_cancels_a_suspended_handler_and_answers_unavailable(served):
    server, channel, seen, _ = served
    pending = asyncio.ensure_future(call(channel, "Hangs")(b"", timeout=10))
    deadline = asyncio.get_running_loop().time() + 10
    while server.active_calls < 1:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    await server.stop(0.1)
    with pytest.raises(RpcError) as err:
        await pending
    assert err.value.code in (StatusCode.UNAVAILABLE, StatusCode.CANCELLED)
    assert seen["cancelled"] == 1 and server.active_calls == 0


async def test_a_suspended_handler_resumes_when_what_it_waits_for_happens(served):
    server, channel, _, release = served
    pending = asyncio.ensure_future(call(channel, "Waits")(b"", timeout=10))
    deadline = asyncio.get_running_loop().time() + 10
    while server.active_calls < 1:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert not pending.done()
    release.set()
    assert await pending == b"released"
