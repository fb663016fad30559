"""gRPC client on the same HTTP/2 layer as the server (asyncio/uvloop): unary and streaming
calls, deadlines, metadata, compression and TLS. Used by the CLI, benchmarks, broker-to-broker
calls and the Spark connector.

    channel = Channel("127.0.0.1:6650")
    call = channel.unary_unary("/danube.HealthCheck/HealthCheck",
                               HealthCheckRequest.SerializeToString,
                               HealthCheckResponse.FromString)
    response = await call(request, timeout=5)

This module holds the channel (connecting, TLS, request headers) and the client's side of a
connection; a call is a ClientStream (client_stream.py), the callables a channel hands out are
in calls.py and target parsing in target.py.
"""

import asyncio
import collections
import ssl as _ssl

from danube.codec import http2
from danube.rpc import compression
from danube.rpc.calls import StreamStream, StreamUnary, UnaryStream, UnaryUnary
from danube.rpc.client_stream import ClientStream
from danube.rpc.config import MAX_GRPC_MESSAGE, TransportConfig
from danube.rpc.connection import H2Connection
from danube.rpc.headers import (encode_headers, format_timeout, metadata_to_headers,
                                percent_decode)
from danube.rpc.status import RpcError, StatusCode
# Re-exported: the client library checks its service URL with it.
from danube.rpc.target import parse_target

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


class ClientConnection(H2Connection):
    is_client = True
    head_parser = ResponseHead

    __slots__ = ("next_sid", "plaintext", "heard", "lost_reason", "on_lost", "ready",
                 "_slot_waiters", "send_limit")

    def __init__(self, config, loop, on_lost=None, plaintext=False):
        super().__init__(config, loop)
        self.next_sid = 1
        self.plaintext = plaintext
        self.heard = False
        self.lost_reason = None
        self.on_lost = on_lost
        self.ready = loop.create_future()
        self._slot_waiters = collections.deque()
        self.send_limit = min(config.max_send_message_size or config.max_message_size,
                              MAX_GRPC_MESSAGE)

    def connection_made(self, transport):
        super().connection_made(transport)
        if not self.ready.done():
            self.ready.set_result(None)

    def data_received(self, data):
        self.heard = True
        super().data_received(data)

    def connection_lost(self, exc):
        if (self.plaintext and not self.heard
                and (exc is None or isinstance(exc, ConnectionResetError))):
            # What a TLS server does to an HTTP/2 preface: it closes, or resets when our
            # frames after the preface are still unread. The bare "connection lost" this
            # would otherwise give leaves the user guessing.
            how = "closed" if exc is None else "reset"
            exc = ConnectionError(f"the server {how} the connection before any HTTP/2 frame "
                                  "(is it a TLS port? then use https://)")
        self.lost_reason = exc
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
            raise RpcError(StatusCode.UNAVAILABLE, f"connection lost: {self.lost_reason}"
                           if self.lost_reason else "connection is closing")
        sid = self.next_sid
        self.next_sid += 2
        stream = ClientStream(sid, self, send_encoding)
        self.streams[sid] = stream
        self.send_headers(stream, header_block, end_stream)
        if end_stream:
            stream.closed_local = True
        return stream


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
                lambda: ClientConnection(self.config, loop, plaintext=self.ssl is None),
                self.host, self.port, ssl=self.ssl,
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


__all__ = ["Channel", "ClientConnection", "ClientStream", "ResponseHead", "StreamStream",
           "StreamUnary", "UnaryStream", "UnaryUnary", "client_ssl_context", "parse_target"]
