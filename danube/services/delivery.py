"""The broker's DeliverySink (danube.broker.delivery) over a ReceiveMessages server stream.

The sink owns the one task a blocked stream needs (waiting for the flow-control window or
the socket to drain); the ReceiveMessages handler that made the sink cancels and awaits it
when the stream is done with, so nothing outlives the call."""

import asyncio


class StreamSink:
    __slots__ = ("_stream", "start_response", "send_framed", "_ended", "_drainer",
                 "_cancelled")

    def __init__(self, stream):
        self._stream = stream
        # Bound once: the consumer's flush calls these directly, at no extra cost.
        self.start_response = stream.start_response
        self.send_framed = stream.send_framed
        self._ended = asyncio.get_running_loop().create_future()
        self._drainer = None          # the pending when_writable wait
        self._cancelled = set()       # waits cancelled, not yet awaited (see close)

    @property
    def finished(self):
        return self._stream.finished

    @property
    def blocked(self):
        return self._stream.blocked

    def when_writable(self, callback):
        self._drainer = asyncio.get_running_loop().create_task(self._drain(callback))

    async def _drain(self, callback):
        try:
            await self._stream.drain()
            drained = True
        except ConnectionError:
            drained = False
        if self._drainer is asyncio.current_task():
            self._drainer = None
        callback(drained)

    def cancel_writable(self):
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            drainer.cancel()          # a cancelled wait never calls back
            self._cancelled.add(drainer)

    def end(self, reason):
        if not self._ended.done():
            self._ended.set_result(reason)

    async def ended(self):
        """Wait until the broker ends the stream; returns its reason (None: a clean end)."""
        return await self._ended

    async def close(self):
        """The call is over: stop a pending wait and wait for every one stopped."""
        self.cancel_writable()
        waits, self._cancelled = self._cancelled, set()
        if waits:
            await asyncio.gather(*waits, return_exceptions=True)
