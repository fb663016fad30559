"""gRPC server on uvloop and our HTTP/2 connection layer: a connection's side of the server
(ServerConnection: calls routed to methods, the connection's limits and life), the method
registry and the listener's lifecycle (Server). A call itself is a ServerStream
(server_stream.py).

Handlers are plain coroutines in grpc.aio's shapes:
  unary-unary    async def m(request, context) -> response
  unary-stream   async def m(request, context): yield response   (or `await context.write`)
  stream-unary   async def m(request_iterator, context) -> response
  stream-stream  async def m(request_iterator, context): yield response
A handler fails its call by raising `RpcError` (or `await context.abort(code, details)`); any
other exception fails only that call, with INTERNAL.

A unary-unary handler starts where its request completes, in the connection's input
callback, and gets a task only when it first suspends (ServerStream._run_unary): most
unary calls are answered in the loop turn that read them, with no task. Until its first
`await` that suspends, such a handler has no current task: `asyncio.current_task()` is None
there and `asyncio.timeout()` refuses to start, so a handler that needs either awaits
something first (or uses `asyncio.wait_for`). No handler of the broker does.

A read that holds exactly one unary call (HEADERS, DATA, WINDOW_UPDATEs) with a header block
this connection has decoded before is handled whole in C by `_lone.pyx` (LoneCalls), the
connection's `data_received`; what it does not take goes unchanged to `take_input`.
"""

import asyncio
import collections
import logging
import re
import resource
import time

from google.protobuf import message_factory

from danube.codec import http2
from danube.codec.http2 import rst_stream_frame
from danube.rpc import compression
from danube.rpc._lone import LoneCalls
from danube.rpc.config import TransportConfig
from danube.rpc.connection import H2Connection
from danube.rpc.headers import RESERVED_HEADERS, encode_headers, parse_timeout
from danube.rpc.idle import IdleStreams
from danube.rpc.method import Kind, RpcMethod
from danube.rpc.request_errors import request_parser
from danube.rpc.server_stream import _RESPONSE_HEADERS, _TRAILERS_OK, ServerStream, _resumed
# The handler-failure log is the server's: re-exported, tests reach it here.
from danube.rpc.server_stream import _failures_logged, _log_handler_failure  # noqa: F401
from danube.rpc.status import RpcError, StatusCode

log = logging.getLogger("danube.rpc.server")

# RFC 9113 8.2.1: a field name is a lowercase token (after the ':' of a pseudo-header); a
# value has no NUL, CR or LF and no leading or trailing whitespace. A request breaking either
# is malformed, and its metadata could not be handed to a handler (nor sent back) as it is.
_FIELD_NAME = re.compile(rb"^:?[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
_BAD_VALUE = re.compile(rb"[\x00\r\n]|^[ \t]|[ \t]\Z")
# gRPC's Header-Name and ASCII-Value for custom metadata: what a handler can be given and
# send back.
_GRPC_KEY = re.compile(rb"^[0-9a-z_.\-]+\Z")
_NOT_ASCII_VALUE = re.compile(rb"[^\x20-\x7e]")


class RequestHead:
    """What the server needs from a request's header block, parsed once per distinct block
    (repeated calls reuse the cached instance)."""

    __slots__ = ("fields", "path", "timeout", "encoding", "accept_encoding", "http_error",
                 "error")

    def __init__(self, fields):
        self.fields = fields
        self.path = None
        self.timeout = None
        self.encoding = None
        self.accept_encoding = None
        self.http_error = None
        self.error = None
        method = content_type = None
        for name, value in fields:
            if not _FIELD_NAME.match(name):
                self.http_error = 400
                return
            if name == b"authorization":
                # The token's own check answers a malformed one (UNAUTHENTICATED naming
                # why, security/tokens.py); with authentication off the header is unused.
                continue
            if _BAD_VALUE.search(value):
                self.http_error = 400
                return
            if name == b":path":
                self.path = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                try:
                    self.timeout = parse_timeout(value)
                except ValueError as exc:
                    self.error = (StatusCode.INTERNAL, str(exc))
            elif name == b"grpc-encoding":
                self.encoding = value.decode("ascii", "replace")
            elif name == b"grpc-accept-encoding":
                self.accept_encoding = value
            elif name[:1] != b":" and name not in RESERVED_HEADERS:
                self._check_metadata(name, value)
        if method != b"POST":
            self.http_error = 405
        elif content_type is None or not content_type.startswith(b"application/grpc"):
            self.http_error = 415
        elif self.path is None:
            self.error = (StatusCode.UNIMPLEMENTED, "missing :path")
        elif self.encoding not in (None, "identity", "gzip", "deflate"):
            self.error = (StatusCode.UNIMPLEMENTED,
                          f"grpc-encoding {self.encoding!r} is not supported")

    def _check_metadata(self, name, value):
        # gRPC's grammar for custom metadata, which a handler must be able to send back.
        if not _GRPC_KEY.match(name):
            self.error = (StatusCode.INVALID_ARGUMENT,
                          f"metadata key {name.decode()!r} is not a gRPC metadata key "
                          f"(0-9, a-z, '_', '-', '.')")
        elif not name.endswith(b"-bin") and _NOT_ASCII_VALUE.search(value):
            self.error = (StatusCode.INVALID_ARGUMENT,
                          f"metadata {name.decode()!r}: a value must be printable ASCII "
                          f"(use a '-bin' key for other bytes)")


# What a connection that has reset no stream holds as its recently reset streams: one shared
# empty set, so that a connection pays for its own set and deque (~1 KB) only once it resets
# a stream (note_reset).
_NONE_RESET = frozenset()


class ServerConnection(H2Connection):
    is_client = False
    head_parser = RequestHead

    __slots__ = ("server", "goaway_last", "_recently_reset", "_reset_order", "_timer",
                 "_active_at", "_deadlines_due", "_when_lost", "_lone", "data_received")

    def __init__(self, server):
        super().__init__(server.config, server.loop)
        self.server = server
        self.goaway_last = None
        self._recently_reset = _NONE_RESET
        self._reset_order = None
        self._timer = None               # handshake, then idle timer
        self._active_at = 0.0            # when the last stream ended (or the connection began)
        self._deadlines_due = []         # calls started by this input: their timers to arm
        self._when_lost = {}             # key -> callback run when the connection ends
        # Input goes to the lone-call path (_lone.pyx), which hands what it cannot take whole
        # to take_input; uvloop reads this attribute once, when the transport is made.
        self._lone = LoneCalls(self, ServerStream, Kind.UNARY_UNARY, _resumed,
                               _RESPONSE_HEADERS, _TRAILERS_OK)
        self.data_received = self._lone.data_received

    def connection_made(self, transport):
        server = self.server
        if len(server.connections) >= server.max_connections:
            # Refused before anything is sent: an fd held by a connection that may never
            # speak is what the limit protects.
            self.transport = transport
            self.closed = True
            server.refuse_connection(transport.get_extra_info("peername"))
            transport.abort()
            return
        super().connection_made(transport)
        server.connections.add(self)
        self._active_at = now = self.loop.time()
        self._timer = self.loop.call_at(
            now + min(self.config.handshake_timeout_ms, self.config.idle_timeout_ms) / 1000,
            self._check_timers)
        if server.draining:
            self.begin_shutdown()

    def connection_lost(self, exc):
        super().connection_lost(exc)
        self._lone.forget()
        callbacks, self._when_lost = self._when_lost, {}
        for callback in callbacks.values():
            try:
                callback()
            except Exception:  # noqa: BLE001 - one holder's failure must not skip the others
                log.exception("a callback on a lost connection failed")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.server.connections.discard(self)
        if self.server.idle_waiter is not None:
            self.server.idle_waiter.set()

    def call_when_lost(self, key, callback):
        """Run ``callback()`` once, when this connection ends (soon, if it has ended); one
        per ``key``, a later one replacing it. What holds state for a call made on this
        connection (a consumer waiting for its stream) learns that the client is gone.
        Entries live until then or until forget_when_lost, so holders drop theirs."""
        if self.lost:
            self.loop.call_soon(callback)
        else:
            self._when_lost[key] = callback

    def forget_when_lost(self, key):
        self._when_lost.pop(key, None)

    def _receiving(self, handle, arg):
        try:
            super()._receiving(handle, arg)
        finally:
            due = self._deadlines_due
            if due:
                self._deadlines_due = []
                for stream in due:
                    stream.arm_deadline()

    def arm_deadline_later(self, stream):
        """Arm `stream`'s deadline timer once the input being handled is done, unless the
        call has ended by then (ServerStream.start)."""
        if self._in_receive:
            self._deadlines_due.append(stream)
        else:
            stream.arm_deadline()

    # -- limits on the connection's life (issue 17) --------------------------------------

    def _check_timers(self):
        # One timer per connection (the handshake's, then the idle one), re-armed when it
        # fires rather than on every stream, so busy connections pay nothing per call for it.
        self._timer = None
        if self.closed:
            return
        if not self.reader.expect_preface:
            self._check_idle()
            return
        handshake_end = self._active_at + self.config.handshake_timeout_ms / 1000
        if self.loop.time() < handshake_end:
            self._timer = self.loop.call_at(handshake_end, self._check_timers)
        else:
            # It never spoke HTTP/2: no GOAWAY it would understand, just free the fd.
            self.note_abuse(f"no HTTP/2 client preface within "
                            f"{self.config.handshake_timeout_ms} ms (grpc.handshake_timeout_ms); "
                            f"closing")
            self.closed = True
            self.transport.abort()

    def _arm_idle(self, when):
        self._timer = self.loop.call_at(when, self._check_timers)

    def _check_idle(self):
        timeout = self.config.idle_timeout_ms / 1000
        now = self.loop.time()
        if self.streams:
            self._arm_idle(now + timeout)
        elif now - self._active_at < timeout:
            self._arm_idle(self._active_at + timeout)
        else:
            log.info("closing HTTP/2 connection from %s: no stream for %d ms "
                     "(grpc.idle_timeout_ms)", self.peername, self.config.idle_timeout_ms)
            self.goaway_last = self.last_peer_stream
            self.write(http2.goaway_frame(self.goaway_last, http2.E_NO_ERROR, b"idle"))
            self.flush()
            self.closed = True
            self.hard_close()

    def forget_stream(self, stream):
        super().forget_stream(stream)
        if not self.streams:
            self._active_at = self.loop.time()

    def stream_data(self, stream, payload, end_stream):
        stream.on_data(payload, end_stream)
        cap = self.config.max_connection_buffered_bytes
        if cap is None:
            return
        # What the stream's deframer holds of incomplete messages (a large one at its
        # announced length): complete messages are handed to the call at once, and a
        # client-streaming call's queue of complete messages is bounded by its stream
        # window (credit is held back while it is full). A stream that has ended was
        # forgotten already (forget_stream took its count back).
        held = 0
        if self.streams.get(stream.sid) is stream and not stream.finished:
            held = stream.deframer.reserved
        if held != stream.held:
            self.buffered += held - stream.held
            stream.held = held
            if self.buffered > cap:
                self.note_abuse(f"incomplete requests over {cap} bytes "
                                f"(grpc.max_connection_buffered_bytes); resetting streams "
                                f"that add to them with ENHANCE_YOUR_CALM")
                self._reset_stream(stream, http2.E_ENHANCE_YOUR_CALM)

    def _is_idle_stream(self, sid):
        return sid % 2 == 0 or sid > self.last_peer_stream

    def note_reset(self, sid):
        """Remember a stream we reset while the client was still sending, so that its
        frames still in flight are ignored (RFC 9113 5.1) rather than taken as an error."""
        if self._reset_order is None:
            self._recently_reset = set()
            self._reset_order = collections.deque()
        self._recently_reset.add(sid)
        self._reset_order.append(sid)
        if len(self._reset_order) > 1024:
            self._recently_reset.discard(self._reset_order.popleft())

    def new_stream_from_headers(self, sid, head, end_stream):
        if sid in self._recently_reset:
            return
        if sid % 2 == 0 or sid <= self.last_peer_stream:
            raise http2.H2ConnectionError(http2.E_PROTOCOL_ERROR,
                                          f"client opened stream {sid} out of order")
        self.last_peer_stream = sid
        if (self.goaway_last is not None and sid > self.goaway_last) or \
                len(self.streams) >= self.config.max_concurrent_streams:
            self.write(rst_stream_frame(sid, http2.E_REFUSED_STREAM))
            return
        if head.http_error is not None:
            self.send_http_error(sid, head.http_error)
            return
        method = self.server.methods.get(head.path)
        stream = ServerStream(sid, self, head, method or _UNKNOWN_METHOD)
        self.streams[sid] = stream
        if head.error is not None:
            stream.fail_early(*head.error)
        elif method is None:
            stream.fail_early(StatusCode.UNIMPLEMENTED,
                              f"Method not found: {head.path.decode('utf-8', 'replace')}")
        else:
            stream.start(end_stream)

    def send_http_error(self, sid, status):
        block = encode_headers([(b":status", b"%d" % status),
                                (b"content-type", b"text/plain")])
        self.write(http2.header_frames(sid, block, self.peer_max_frame, True))
        self.write(rst_stream_frame(sid, http2.E_NO_ERROR))

    def begin_shutdown(self):
        """Graceful GOAWAY: calls already started run to completion; new ones are refused."""
        if self.goaway_last is None and not self.closed:
            self.goaway_last = self.last_peer_stream
            self.write(http2.goaway_frame(self.goaway_last, http2.E_NO_ERROR, b"shutdown"))
            self.flush()
            if not self.streams:
                self.close()

    def stream_done(self, stream):
        super().stream_done(stream)
        if self.goaway_last is not None and not self.streams:
            self.close()


async def _unknown_handler(request, context):  # pragma: no cover - never invoked
    raise RpcError(StatusCode.UNIMPLEMENTED, "method not found")

_UNKNOWN_METHOD = RpcMethod(b"", Kind.UNARY_UNARY, _unknown_handler)


def default_max_connections():
    """Three quarters of the process's open-file limit: the rest is left for the WAL, the
    metadata store and the other listener. (Half left exactly 10,000 on a host whose limit
    is 20,000: the ten thousand producers' connections of issue 53 fitted with not one to
    spare, and the next client was refused.)"""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(64, soft * 3 // 4)


def _serialize_message(message):
    # A handler may answer with bytes it serialized itself (a message built in C).
    if type(message) is bytes:
        return message
    return message.SerializeToString()


class Server:
    """A gRPC server: register methods or protobuf services, then `await start(...)`."""

    def __init__(self, config: TransportConfig | None = None, *, compression=None, loop=None):
        self.config = config or TransportConfig()
        self.methods = {}
        # Applied to every method registered from then on (set by whoever guards the server:
        # a method added after the guard is guarded too).
        self.method_wrapper = None
        self.connections = set()
        self.loop = loop
        self.default_compression = compression
        self._servers = []
        self.draining = False
        self.active_calls = 0
        self.idle_waiter = None
        self.started_at = time.time()
        self.max_connections = self.config.max_connections or default_max_connections()
        self._refused = 0                # connections refused since the last warning
        self._refused_warned_at = None
        # (method path, status code) -> finished calls; read by the metrics exporter.
        self.rpc_counts = collections.Counter()
        # Times out streams whose request stalls (TransportConfig.stream_idle_timeout_ms).
        self.idle_streams = (IdleStreams(self.config.stream_idle_timeout_ms)
                             if self.config.stream_idle_timeout_ms > 0 else None)

    # -- registration --------------------------------------------------------------------

    def add_method(self, path, kind: Kind, handler, deserialize=None, serialize=None):
        key = path.encode() if isinstance(path, str) else path
        method = RpcMethod(key, kind, handler, deserialize, serialize)
        if self.method_wrapper is not None:
            method.handler = self.method_wrapper(method)
        self.methods[key] = method

    def limit_requests(self, path, max_size, refuse):
        """Give the method at `path` (registered already) a request-size limit of its own:
        a request message whose length prefix announces more than `max_size` bytes is
        refused as soon as the prefix is read, with the RpcError `refuse(size, head)`
        returns (`head`: the first bytes of the message that came with the prefix, perhaps
        none), instead of being received whole first. The transport's cap (`max_message_size`,
        RESOURCE_EXHAUSTED) still applies above a larger `max_size`."""
        method = self.methods[path.encode() if isinstance(path, str) else path]
        method.own_limit = max_size
        method.max_request = min(max_size, self.config.max_message_size)
        method.refuse = refuse

    def add_service(self, service_descriptor, servicer):
        """Register every method of a protobuf ServiceDescriptor; methods the servicer lacks
        answer UNIMPLEMENTED, as generated grpc servicers do."""
        for m in service_descriptor.methods:
            path = f"/{service_descriptor.full_name}/{m.name}"
            kind = Kind((m.client_streaming, m.server_streaming))
            request_cls = message_factory.GetMessageClass(m.input_type)
            handler = getattr(servicer, m.name, None)
            if handler is None:
                continue
            self.add_method(path, kind, handler, request_parser(request_cls),
                            _serialize_message)

    def refuse_connection(self, peer):
        """Count a connection refused for grpc.max_connections; one warning a minute at most,
        so a flood of them cannot flood the log."""
        self._refused += 1
        now = time.monotonic()
        if self._refused_warned_at is None or now - self._refused_warned_at >= 60:
            log.warning("refusing new connections (the latest from %s): %d open, the limit "
                        "(grpc.max_connections) is %d; %d refused since the last warning",
                        peer, len(self.connections), self.max_connections, self._refused)
            self._refused_warned_at = now
            self._refused = 0

    def response_encoding(self, head):
        if self.default_compression is None:
            return None
        return compression.pick_response_encoding(self.default_compression,
                                                  head.accept_encoding)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, host="127.0.0.1", port=0, ssl=None):
        """Listen on host:port (port 0 picks a free one); returns the bound port."""
        self.loop = self.loop or asyncio.get_running_loop()
        if self.config.max_connections is None:
            # Read again: the broker raises its open-file limit after building its servers.
            self.max_connections = default_max_connections()
        extra = {}
        if ssl is not None:
            extra["ssl_handshake_timeout"] = self.config.handshake_timeout_ms / 1000
        srv = await self.loop.create_server(lambda: ServerConnection(self), host, port,
                                            ssl=ssl, reuse_address=True, backlog=4096,
                                            **extra)
        self._servers.append(srv)
        return srv.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None = 5.0):
        """Stop accepting, send GOAWAY, let in-flight calls finish for up to `grace` seconds,
        then cancel what is left and close every connection."""
        self.draining = True
        if self.idle_streams is not None:
            self.idle_streams.close()
        for srv in self._servers:
            srv.close()
        for conn in list(self.connections):
            conn.begin_shutdown()
        if grace:
            self.idle_waiter = asyncio.Event()
            deadline = self.loop.time() + grace
            while self.connections and self.loop.time() < deadline:
                self.idle_waiter.clear()
                try:
                    await asyncio.wait_for(self.idle_waiter.wait(), deadline - self.loop.time())
                except asyncio.TimeoutError:
                    break
        tasks = []
        for conn in list(self.connections):
            for stream in list(conn.streams.values()):
                if stream.task is not None and not stream.task.done():
                    stream.task.cancel()
                    tasks.append(stream.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for conn in list(self.connections):
            conn.close()
        for srv in self._servers:
            await srv.wait_closed()
        self._servers.clear()


__all__ = ["IdleStreams", "Kind", "RequestHead", "RpcMethod", "Server", "ServerConnection",
           "ServerStream", "TransportConfig", "default_max_connections"]
