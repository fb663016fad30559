"""Background tasks with an owner: started through it, cancelled and awaited by its close.

What ``asyncio.TaskGroup`` gives, for owners whose tasks start outside any one ``async with``
block (the tiered storage manager starts exports from its loop and deletions from admin calls)
and whose tasks' failures are their own business: a task that fails is logged when it ends, so
nothing is left for the garbage collector to report, and a task never outlives its owner."""

from __future__ import annotations

import asyncio
import logging
from typing import Coroutine

log = logging.getLogger("danube.storage")


class TaskSet:
    def __init__(self, owner: str):
        self._owner = owner
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def spawn(self, coro: Coroutine, *, name: str | None = None) -> asyncio.Task:
        """Run ``coro`` as a task of this set. Refused once the set is closed: the task would
        then have no owner to cancel it."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"{self._owner} is closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
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

    async def close(self) -> None:
        """Cancel every task and wait for all of them to end. Idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
