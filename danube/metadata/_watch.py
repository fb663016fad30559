"""Watch fan-out shared by the in-process stores.

Writers publish synchronously, right after their commit and before they return, so events
reach every watcher in commit order without any task or lock in between. A watcher that does
not keep up must not hold up writers (a stuck cluster component would otherwise freeze topic
assignment for the whole broker), and must not grow memory without bound either. So each
watch buffers at most ``max_pending`` events; the next event beyond that discards the buffer
and ends the watch with ``WatchOverflow``. That is the honest outcome: the watcher has lost
events, and the only correct recovery is to re-read with ``scan`` and watch again, exactly as
after an etcd watch is compacted away.

Each watcher gets its own decoded copy of every value, so one consumer mutating an event's
dict cannot change what another sees. The hub keeps watches by weak reference: a watch that
its owner dropped without closing unregisters itself when it is collected.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Iterable

from danube.metadata.errors import WatchOverflow
from danube.metadata.store import WatchEvent, decode_value, in_prefix

#: One committed change as the stores hand it to the hub: (kind, key, JSON text or None,
#: version).
Change = tuple[str, str, "str | None", int]


class Watch:
    """Async iterator of ``WatchEvent`` for one prefix; also an async context manager that
    closes it on exit.

    Iteration ends (StopAsyncIteration) after ``close()``. It ends with ``WatchOverflow`` if
    this watcher fell behind, and with ``MetadataUnavailable`` once the store closes (after the
    events already buffered). Cancelling a pending ``__anext__`` loses nothing; to stop
    watching, close the watch or leave its ``async with`` block."""

    def __init__(self, hub: WatchHub, prefix: str, max_pending: int):
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending!r}")
        self.prefix = prefix
        self.max_pending = max_pending
        self._hub = hub
        self._events: collections.deque[WatchEvent] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self):
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._events:
                return self._events.popleft()
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        """Stop watching; buffered events are discarded. Idempotent."""
        self._events.clear()
        self._end(None)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        self.close()

    def _deliver(self, event: WatchEvent) -> None:
        if self._closed:
            return
        if len(self._events) >= self.max_pending:
            self._events.clear()
            self._end(WatchOverflow(
                f"watch on {self.prefix!r} fell more than {self.max_pending} events behind; "
                "re-read with scan() and watch again"))
            return
        self._events.append(event)
        self._wake()

    def _end(self, error: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._error = error
        self._hub._discard(self)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class WatchHub:
    """The set of open watches of one store, and the fan-out of committed changes to them."""

    def __init__(self):
        self._watches: weakref.WeakSet[Watch] = weakref.WeakSet()

    def __len__(self) -> int:
        return len(self._watches)

    def open(self, prefix: str, max_pending: int) -> Watch:
        watch = Watch(self, prefix, max_pending)
        self._watches.add(watch)
        return watch

    def publish(self, changes: Iterable[Change]) -> None:
        if not self._watches:
            return
        watches = list(self._watches)
        for kind, key, text, version in changes:
            for watch in watches:
                if in_prefix(key, watch.prefix):
                    watch._deliver(WatchEvent(kind, key, decode_value(text), version))

    def close(self, error: BaseException) -> None:
        """End every watch with ``error`` (each gets its own instance's traceback-free copy)."""
        for watch in list(self._watches):
            watch._end(type(error)(*error.args))

    def _discard(self, watch: Watch) -> None:
        self._watches.discard(watch)
