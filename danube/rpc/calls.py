"""The callables a Channel hands out, one per method kind, in grpc.aio's shapes
(`await channel.unary_unary(path, ...)(request)`), and the streaming call object they return."""

from danube.rpc.status import RpcError, StatusCode


class _Method:
    __slots__ = ("channel", "path", "serialize", "deserialize")

    def __init__(self, channel, path, serialize, deserialize):
        self.channel = channel
        self.path = path
        self.serialize = serialize or (lambda m: m)
        self.deserialize = deserialize or (lambda b: b)


class UnaryUnary(_Method):
    async def __call__(self, request, *, timeout=None, metadata=None, compression=None):
        stream = await self.channel.start_call(self.path, timeout=timeout, metadata=metadata,
                                               compression=compression)
        try:
            await stream.send(self.serialize(request), end=True)
            response = await stream.read()
            if response is None:
                raise RpcError(StatusCode.INTERNAL, "no response message from the server")
            while stream.status is None:
                await stream._wait()
            stream.raise_for_status()
            return self.deserialize(response)
        except BaseException:
            stream.cancel()
            raise


class _StreamingCall:
    """A running call whose responses are read with `async for` (or `read()`)."""

    def __init__(self, stream, deserialize, serialize=None):
        self.stream = stream
        self._deserialize = deserialize
        self._serialize = serialize or (lambda m: m)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            data = await self.stream.read()
        except BaseException:
            self.stream.cancel()
            raise
        if data is None:
            raise StopAsyncIteration
        return self._deserialize(data)

    async def read(self):
        data = await self.stream.read()
        return None if data is None else self._deserialize(data)

    async def read_batch(self):
        return [self._deserialize(d) for d in await self.stream.read_batch()]

    async def write(self, message):
        await self.stream.send(self._serialize(message))

    async def done_writing(self):
        await self.stream.end()

    def cancel(self):
        self.stream.cancel()

    def initial_metadata(self):
        return self.stream.initial_metadata()

    def trailing_metadata(self):
        return self.stream.trailing_metadata()

    def code(self):
        return self.stream.status


class UnaryStream(_Method):
    async def __call__(self, request, *, timeout=None, metadata=None, compression=None):
        stream = await self.channel.start_call(self.path, timeout=timeout, metadata=metadata,
                                               compression=compression)
        await stream.send(self.serialize(request), end=True)
        return _StreamingCall(stream, self.deserialize)


class StreamUnary(_Method):
    async def __call__(self, request_iterator, *, timeout=None, metadata=None,
                       compression=None):
        stream = await self.channel.start_call(self.path, timeout=timeout, metadata=metadata,
                                               compression=compression)
        try:
            async for request in _aiter(request_iterator):
                await stream.send(self.serialize(request))
            await stream.end()
            response = await stream.read()
            while stream.status is None:
                await stream._wait()
            stream.raise_for_status()
            if response is None:
                raise RpcError(StatusCode.INTERNAL, "no response message from the server")
            return self.deserialize(response)
        except BaseException:
            stream.cancel()
            raise


class StreamStream(_Method):
    async def __call__(self, *, timeout=None, metadata=None, compression=None):
        """Returns a call to `write()` requests to, `done_writing()`, and iterate."""
        stream = await self.channel.start_call(self.path, timeout=timeout, metadata=metadata,
                                               compression=compression)
        return _StreamingCall(stream, self.deserialize, self.serialize)


async def _aiter(iterable):
    if hasattr(iterable, "__aiter__"):
        async for item in iterable:
            yield item
    else:
        for item in iterable:
            yield item
