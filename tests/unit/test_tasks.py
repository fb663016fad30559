"""danube.tasks.TaskSet: every background task of an owner ends with the owner."""

import asyncio
import logging

import pytest

from danube.tasks import TaskSet


async def test_close_cancels_and_awaits_every_task():
    tasks = TaskSet("owner")
    started, cancelled, finished = asyncio.Event(), [], []

    async def forever(i):
        try:
            started.set()
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0)               # cleanup that itself awaits
            cancelled.append(i)
            raise

    async def quick():
        finished.append(True)

    running = [tasks.spawn(forever(i)) for i in range(3)]
    await tasks.spawn(quick())
    await started.wait()
    assert len(tasks) == 3 and finished == [True]    # a finished task leaves the set
    await tasks.close()
    assert sorted(cancelled) == [0, 1, 2] and all(t.done() for t in running)
    assert len(tasks) == 0
    await tasks.close()                              # idempotent


async def test_a_failed_task_is_logged_when_it_ends(caplog):
    tasks = TaskSet("tiered storage")

    async def boom():
        raise RuntimeError("store on fire")

    with caplog.at_level(logging.ERROR, logger="danube.tasks"):
        task = tasks.spawn(boom(), name="export x")
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert "tiered storage: background task export x failed" in caplog.text
    assert "store on fire" in caplog.text
    await tasks.close()


async def test_no_task_starts_after_close():
    tasks = TaskSet("owner")
    await tasks.close()
    ran = []

    async def job():
        ran.append(True)

    coro = job()
    with pytest.raises(RuntimeError, match="owner is closed"):
        tasks.spawn(coro)
    await asyncio.sleep(0)
    assert not ran and coro.cr_frame is None         # closed, never left pending


async def test_wait_lets_the_running_tasks_finish():
    """``wait`` ends when the tasks running now end by themselves; none is cancelled (a
    dispatcher's last cursor writes land before its final one)."""
    tasks = TaskSet("owner")
    release, done = asyncio.Event(), []

    async def write(i):
        await release.wait()
        done.append(i)

    for i in range(3):
        tasks.spawn(write(i))
    waiting = asyncio.ensure_future(tasks.wait())
    await asyncio.sleep(0)
    assert not waiting.done() and done == []
    release.set()
    await asyncio.wait_for(waiting, 30)
    assert sorted(done) == [0, 1, 2] and len(tasks) == 0
    await tasks.close()
