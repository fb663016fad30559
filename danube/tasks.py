"""Background tasks with an owner, the one idiom of the whole broker: every long-running
loop or piece of background work (the core's reaper and sampler, the logs' retention, the
reliable dispatcher's loop, cursor writes and dead-letter republishes, tiered uploads and
deletions, cluster membership, election, load reports, the rebalancer) is started through
its owner's ``TaskSet`` (or, for a single loop, kept as a task and ended by
``cancel_and_wait``), and cancelled and awaited when the owner closes.

What ``asyncio.TaskGroup`` gives, for owners whose tasks start outside any one ``async with``
block and whose tasks' failures are their own business: a task that fails is logged when it
ends, so nothing is left for the garbage collector to report, and a task never outlives its
owner."""

from __future__ import annotations

import asyncio
import logging
from typing import Coroutine

log = logging.getLogger("danube.tasks")


async def cancel_and_wait(*tasks):
    """Cancel ``tasks`` (None entries are skipped) and wait until each has finished; their
    cancellation is not an error, any other exception they end with is raised."""
    tasks = [t for t in tasks if t is not None]
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            pass


class TaskSet:
    """The tasks of one owner (``owner`` names it in logs). ``loop``: the event loop to run
    them on, for an owner made outside a running loop (default: the running one)."""

    def __init__(self, owner: str, loop: asyncio.AbstractEventLoop | None = None):
        self._owner = owner
        self._loop = loop
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def spawn(self, coro: Coroutine, *, name: str | None = None) -> asyncio.Task:
        """Run ``coro`` as a task of this set. Refused once the set is closed: the task would
        then have no owner to cancel it."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self._owner} is closed")
        loop = self._loop or asyncio.get_running_loop()
        task = loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task %s failed", self._owner, task.get_name(),
                      exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Wait for the tasks running now to end by themselves (none is cancelled)."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel every task and wait for all of them to end. Idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
