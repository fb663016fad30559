"""gRPC client on the same HTTP/2 layer as the server (asyncio/uvloop): unary and streaming
calls, deadlines, metadata, compression and TLS. Used by the CLI, benchmarks, broker-to-broker
calls and the Spark connector.

    channel = Channel("127.0.0.1:6650")
    call = channel.unary_unary("/danube.HealthCheck/HealthCheck",
                               HealthCheckRequest.SerializeToString,
                               HealthCheckResponse.FromString)
    response = await call(request, timeout=5)
"""

import asyncio
import collections
import ssl as _ssl

from danube.codec import http2
from danube.codec.grpcframe import (CompressedMessage, GrpcDeframer, GrpcMessageTooLarge,
                                    grpc_frame, grpc_frame_many)
from danube.rpc import compression
from danube.rpc.connection import (MAX_GRPC_MESSAGE, PIECES_MIN, H2Connection, StreamBase,
                                   TransportConfig)
from danube.rpc.headers import (encode_headers, format_timeout, metadata_from_headers,
                                metadata_to_headers, percent_decode)
from danube.rpc.status import RpcError, StatusCode, http_status_to_grpc

USER_AGENT = b"danube-py-rpc/0.1"


class ResponseHead:
    """A parsed response header block (initial headers or trailers)."""

    __slots__ = ("fields", "http_status", "content_type", "grpc_status", "grpc_message",
                 "encoding")

    def __init__(self, fields):
        self.fields = fields
        self.http_status = None
        self.content_type = None
        self.grpc_status = None
        self.grpc_message = ""
        self.encoding = None
        for name, value in fields:
            if name == b":status":
                self.http_status = int(value) if value.isdigit() else 0
            elif name == b"grpc-status":
                self.grpc_status = int(value) if value.isdigit() else StatusCode.UNKNOWN
            elif name == b"grpc-message":
                self.grpc_message = percent_decode(value)
            elif name == b"content-type":
                self.content_type = value
            elif name == b"grpc-encoding":
                self.encoding = value.decode("ascii", "replace")


class ClientStream(StreamBase):
    """One call from the client side."""

    __slots__ = ("deframer", "messages", "initial", "status", "details", "trailers",
                 "_waiter", "_timer", "encoding", "_queued_bytes", "_held_credit",
                 "send_encoding", "local")

    def __init__(self, sid, conn, send_encoding=None):
        super().__init__(sid, conn)
        self.deframer = GrpcDeframer(conn.config.max_message_size)
        self.messages = collections.deque()
        self.initial = None
        self.status = None
        self.details = ""
        self.trailers = None
        self._waiter = None
        self._timer = None
        self.encoding = None
        self.send_encoding = send_encoding
        self._queued_bytes = 0
        self._held_credit = 0
        self.local = False          # the status was decided here, not by the server

    # -- frames from the server ----------------------------------------------------------

    def on_headers(self, head, end_stream):
        if self.initial is None and not end_stream:
            if head.http_status != 200:
                self._set_status(http_status_to_grpc(head.http_status or 0),
                                 f"unexpected HTTP status {head.http_status}")
                return
            if not (head.content_type or b"").startswith(b"application/grpc"):
                self._set_status(StatusCode.UNKNOWN,
                                 f"unexpected content-type {head.content_type!r}")
                return
            self.initial = head
            self.encoding = head.encoding
            return
        if not end_stream:
            self._fail(StatusCode.INTERNAL, "headers after the initial headers without END_STREAM")
            return
        self.closed_remote = True
        if self.initial is None:
            self.initial = head
            if head.grpc_status is None and head.http_status != 200:
                self._set_status(http_status_to_grpc(head.http_status or 0),
                                 f"HTTP status {head.http_status} without grpc-status")
                return
        self.trailers = head
        if head.grpc_status is None:
            self._set_status(StatusCode.INTERNAL, "response ended without grpc-status")
        elif self.deframer.pending:
            self._set_status(StatusCode.INTERNAL, "truncated gRPC message at end of stream")
        else:
            self._set_status(head.grpc_status, head.grpc_message)
        if self.pending is not None:
            # The server answered before taking the whole request (one over its size
            # limit, say): the call is over, so the rest of the request must not wait for
            # windows that may never open. Our server follows its trailers with RST_STREAM;
            # this covers a server that does not.
            self.pending = None
            self.conn._reset_stream(self, http2.E_CANCEL)

    def on_data(self, payload, end_stream):
        try:
            messages = self.deframer.feed(payload)
        except GrpcMessageTooLarge as exc:
            self._fail(StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        except ValueError as exc:
            self._fail(StatusCode.INTERNAL, str(exc))
            return
        # Credit the window as the application reads, so a slow reader holds back the
        # server instead of growing this queue without bound.
        self._queued_bytes += len(payload)
        if self._queued_bytes < self.conn.config.stream_window:
            self.credit(len(payload))
        else:
            self._held_credit += len(payload)
        if messages:
            self.messages.extend(messages)
            self._wake()
        if end_stream:
            self.closed_remote = True
            self._set_status(StatusCode.INTERNAL, "stream ended without trailers")

    def on_reset(self, code):
        self.closed_local = self.closed_remote = True
        if self.status is None:
            if code == http2.E_REFUSED_STREAM:
                self._set_status(StatusCode.UNAVAILABLE, "stream refused by the server")
            elif code is None:
                self._set_status(StatusCode.CANCELLED, "call cancelled")
            else:
                self._set_status(StatusCode.CANCELLED if code == http2.E_CANCEL
                                 else StatusCode.INTERNAL,
                                 f"stream reset by the server (HTTP/2 error {code})")

    def on_connection_lost(self, exc):
        self.reset = True
        if self.status is None:
            self._set_status(StatusCode.UNAVAILABLE,
                             f"connection lost{': ' + str(exc) if exc else ''}")

    def _set_status(self, code, details):
        if self.status is not None:
            return
        self.status = StatusCode(code) if code in StatusCode._value2member_map_ else StatusCode.UNKNOWN
        self.details = details
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.closed_remote and (self.closed_local or self.reset) and self.pending is None:
            self.conn.stream_done(self)
        self._wake()

    def _fail(self, code, details):
        """End the call locally: RST_STREAM(CANCEL) and the given status."""
        if self.status is None:
            self.local = True
        self._set_status(code, details)
        if not self.reset:
            self.conn._reset_stream(self, http2.E_CANCEL)
        self.conn.flush()

    def _wake(self):
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_deadline(self):
        self._timer = None
        self._fail(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # -- application side ----------------------------------------------------------------

    async def _wait(self):
        self._waiter = self.conn.loop.create_future()
        try:
            await self._waiter
        except asyncio.CancelledError:
            self._fail(StatusCode.CANCELLED, "call cancelled by the caller")
            raise

    def _take(self, data):
        self._queued_bytes -= len(data) + 5
        if self._held_credit and self._queued_bytes < self.conn.config.stream_window // 2:
            credit, self._held_credit = self._held_credit, 0
            self.credit(credit)
        if type(data) is CompressedMessage:
            data = compression.decompress(self.encoding or "identity", data,
                                          self.conn.config.max_message_size)
        return data

    async def read(self):
        """The next response message (bytes), or None at a clean end. Raises RpcError."""
        while True:
            if self.messages:
                return self._take(self.messages.popleft())
            if self.status is not None:
                self.raise_for_status()
                return None
            await self._wait()

    async def read_batch(self):
        """All response messages that have arrived (at least one), or [] at a clean end."""
        while True:
            if self.messages:
                out = [self._take(m) for m in self.messages]
                self.messages.clear()
                return out
            if self.status is not None:
                self.raise_for_status()
                return []
            await self._wait()

    def raise_for_status(self):
        if self.status is not None and self.status != StatusCode.OK:
            raise RpcError(self.status, self.details,
                           metadata_from_headers(self.trailers.fields) if self.trailers else (),
                           local=self.local)

    def _frame(self, data):
        if len(data) > self.conn.send_limit:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED,
                           f"request message larger than max ({len(data)} vs. "
                           f"{self.conn.send_limit})", local=True)
        if self.send_encoding:
            return grpc_frame(compression.compress(self.send_encoding, data), True)
        return grpc_frame(data)

    async def send(self, data, end=False):
        """Send one serialised request message, waiting for flow control when needed."""
        if self.status is not None:
            self.raise_for_status()
            raise RpcError(StatusCode.INTERNAL, "call already finished")
        if end:
            self.closed_local = True
        n = len(data)
        if n >= PIECES_MIN and not self.send_encoding and n <= self.conn.send_limit:
            if not self.send_message_pieces(data, end):
                # Shut windows: the message waits as it is, behind a first frame's worth
                # copied with its prefix, instead of being copied whole into a framed buffer
                # (a large message may well be refused from its first frame, whose head
                # then tells the server whose message it is).
                first = self.conn.peer_max_frame - 5
                self.send_data(b"\x00" + n.to_bytes(4, "big") + data[:first])
                self.send_data(memoryview(data)[first:], end)
            if self.pending is not None or self.conn.write_paused:
                await self.drain()
            return
        if not self.send_data(self._frame(data), end) or self.conn.write_paused:
            await self.drain()

    async def send_batch(self, messages, end=False):
        if self.status is not None:
            self.raise_for_status()
            raise RpcError(StatusCode.INTERNAL, "call already finished")
        if end:
            self.closed_local = True
        body = (b"".join(self._frame(m) for m in messages) if self.send_encoding
                else grpc_frame_many(messages))
        if not self.send_data(body, end) or self.conn.write_paused:
            await self.drain()

    async def end(self):
        """Half-close: no more request messages."""
        if not self.closed_local and self.status is None:
            self.closed_local = True
            self.send_data(b"", True)

    def cancel(self):
        if self.status is None:
            self._fail(StatusCode.CANCELLED, "call cancelled by the caller")

    def initial_metadata(self):
        return metadata_from_headers(self.initial.fields) if self.initial else ()

    def trailing_metadata(self):
        return metadata_from_headers(self.trailers.fields) if self.trailers else ()


class ClientConnection(H2Connection):
    is_client = True
    head_parser = ResponseHead

    def __init__(self, config, loop, on_lost=None):
        super().__init__(config, loop)
        self.next_sid = 1
        self.on_lost = on_lost
        self.ready = loop.create_future()
        self._slot_waiters = collections.deque()
        self.send_limit = min(config.max_send_message_size or config.max_message_size,
                              MAX_GRPC_MESSAGE)

    def connection_made(self, transport):
        super().connection_made(transport)
        if not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc):
        super().connection_lost(exc)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"connection lost: {exc}"))
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection lost"))
        if self.on_lost is not None:
            self.on_lost(self)

    @property
    def usable(self):
        return not self.closed and self.goaway_received is None and self.next_sid < 2**31 - 2

    def _is_idle_stream(self, sid):
        return sid % 2 == 0 or sid >= self.next_sid

    def new_stream_from_headers(self, sid, head, end_stream):
        if sid % 2 == 1 and sid < self.next_sid:
            # A stream we already reset (deadline, cancel): its response was in flight. The
            # block has been decoded, so HPACK state stays in step; the rest is ignored.
            return
        raise http2.H2ConnectionError(http2.E_PROTOCOL_ERROR,
                                      f"server sent HEADERS on unopened stream {sid}")

    def _on_goaway(self, last_sid, code, debug):
        super()._on_goaway(last_sid, code, debug)
        for sid, stream in list(self.streams.items()):
            if sid > last_sid:
                # Never processed by the server, so safe for the caller to retry.
                self.streams.pop(sid, None)
                stream.reset = True
                stream._set_status(StatusCode.UNAVAILABLE, "server is going away (GOAWAY)")
        if not self.streams:
            self.close()

    def stream_done(self, stream):
        super().stream_done(stream)
        while self._slot_waiters and len(self.streams) < self.peer_max_streams:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break
        if self.goaway_received is not None and not self.streams:
            self.close()

    async def open_stream(self, header_block, send_encoding=None, end_stream=False):
        while len(self.streams) >= self.peer_max_streams:
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter
        if not self.usable:
            raise RpcError(StatusCode.UNAVAILABLE, "connection is closing")
        sid = self.next_sid
        self.next_sid += 2
        stream = ClientStream(sid, self, send_encoding)
        self.streams[sid] = stream
        self.send_headers(stream, header_block, end_stream)
        if end_stream:
            stream.closed_local = True
        return stream


def parse_target(target):
    """(host, port, secure) of a target URL (`http://h:p`, `https://h:p` or `h:p`, secure
    None when unsaid); ValueError when it is none of those. Public: the client library checks
    its service URL with it."""
    secure = None
    if target.startswith("http://"):
        target, secure = target[7:], False
    elif target.startswith("https://"):
        target, secure = target[8:], True
    target = target.rstrip("/")
    if target.startswith("["):
        host, _, port = target[1:].partition("]:")
    else:
        host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"invalid target {target!r}: expected host:port")
    return host, int(port), secure


def client_ssl_context(ca_file=None, cert_file=None, key_file=None, verify=True):
    """TLS for the client: ALPN h2, the given CA (or the system's), an optional client
    certificate for mTLS."""
    ctx = _ssl.create_default_context(cafile=ca_file)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = _ssl.CERT_NONE
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    ctx.set_alpn_protocols(["h2"])
    return ctx


class Channel:
    """A lazily connected, self-healing HTTP/2 connection to one server."""

    def __init__(self, target, *, ssl=None, server_hostname=None, config=None, metadata=(),
                 compression=None, connect_timeout=10.0):
        self.host, self.port, secure = parse_target(target)
        if ssl is None and secure:
            ssl = client_ssl_context()
        self.ssl = ssl
        self.server_hostname = server_hostname
        self.config = config or TransportConfig()
        self.metadata = tuple(metadata)
        self.compression = compression
        self.connect_timeout = connect_timeout
        self.authority = f"{self.host}:{self.port}".encode()
        self._conn = None
        self._connecting = None
        self._head_cache = {}

    async def connection(self):
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self):
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: ClientConnection(self.config, loop), self.host, self.port, ssl=self.ssl,
                server_hostname=(self.server_hostname or self.host) if self.ssl else None),
                self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise RpcError(StatusCode.UNAVAILABLE,
                           f"failed to connect to {self.host}:{self.port}: {exc}") from None
        if self.ssl is not None:
            proto = conn.transport.get_extra_info("ssl_object").selected_alpn_protocol()
            if proto != "h2":
                conn.close()
                raise RpcError(StatusCode.UNAVAILABLE,
                               f"server at {self.host}:{self.port} did not negotiate h2 "
                               f"(ALPN {proto!r})")
        self._conn = conn
        return conn

    def _header_block(self, path, timeout, metadata, encoding):
        base = self._head_cache.get((path, encoding))
        if base is None:
            fields = [(b":method", b"POST"), (b":scheme", b"https" if self.ssl else b"http"),
                      (b":path", path.encode()), (b":authority", self.authority),
                      (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                      (b"user-agent", USER_AGENT),
                      (b"grpc-accept-encoding", compression.ACCEPT_ENCODING)]
            if encoding:
                fields.append((b"grpc-encoding", encoding.encode()))
            fields.extend(metadata_to_headers(self.metadata))
            base = self._head_cache[(path, encoding)] = encode_headers(fields)
        extra = []
        if timeout is not None:
            extra.append((b"grpc-timeout", format_timeout(timeout)))
        if metadata:
            extra.extend(metadata_to_headers(metadata))
        # Our HPACK blocks never index, so independently encoded blocks concatenate.
        return base + encode_headers(extra) if extra else base

    async def start_call(self, path, *, timeout=None, metadata=None, compression=None):
        """Open a call and return its ClientStream (for streaming use)."""
        encoding = compression if compression is not None else self.compression
        if encoding == "identity":
            encoding = None
        block = self._header_block(path, timeout, metadata, encoding)
        conn = await self.connection()
        stream = await conn.open_stream(block, encoding)
        if timeout is not None:
            stream._timer = conn.loop.call_later(max(timeout, 0), stream.on_deadline)
        return stream

    def unary_unary(self, path, request_serializer=None, response_deserializer=None):
        return UnaryUnary(self, path, request_serializer, response_deserializer)

    def unary_stream(self, path, request_serializer=None, response_deserializer=None):
        return UnaryStream(self, path, request_serializer, response_deserializer)

    def stream_unary(self, path, request_serializer=None, response_deserializer=None):
        return StreamUnary(self, path, request_serializer, response_deserializer)

    def stream_stream(self, path, request_serializer=None, response_deserializer=None):
        return StreamStream(self, path, request_serializer, response_deserializer)

    async def close(self):
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.write(http2.goaway_frame(0, http2.E_NO_ERROR, b""))
            conn.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


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
