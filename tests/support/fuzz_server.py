"""Fuzz target: a whole gRPC server connection, in process. A ServerConnection of a Server that
never listens gets the client preface and then the fuzz input through a fake transport, on an
event loop the target drives turn by turn, so frames, SETTINGS, flow control, HPACK and gRPC
framing all see hostile bytes, and the test service's handlers run on what gets through.

Findings: an exception out of data_received or connection_lost, anything the loop's exception
handler is given, an error logged by the transport ("internal error handling input", a
"handler ... failed"), state growing past the connection's limits, and streams, tasks or timers
left behind once the connection is lost.
"""

import asyncio
import contextlib
import logging

import hpack

from danube.codec import http2
from danube.codec.grpcframe import grpc_frame
from danube.rpc.config import TransportConfig
from danube.rpc.connection import BACKLOG_PAUSE
from danube.rpc.headers import HeaderDecoder, encode_headers
from danube.rpc.server import Kind, Server, ServerConnection, _failures_logged
from fuzz_codecs import check
from rpc_fixtures import P, TestService

# Small limits, so that fuzz inputs reach them: the checks run at the limits, not below.
CONFIG = dict(max_concurrent_streams=32, stream_window=65535, connection_window=1 << 20,
              max_header_list_size=8192, max_message_size=1 << 18,
              max_connection_buffered_bytes=1 << 20, max_settings_per_second=50,
              max_resets_per_second=100)
# The handlers of the test service that answer any request without failing (the others parse
# numbers out of it, or fail or flood on purpose) plus Hang, whose call only ends when the
# connection does: what is left of it at the end is a finding.
METHODS = (("Unary", Kind.UNARY_UNARY), ("Sum", Kind.STREAM_UNARY),
           ("BidiEcho", Kind.STREAM_STREAM), ("Metadata", Kind.UNARY_UNARY),
           ("Inspect", Kind.UNARY_UNARY), ("Hang", Kind.UNARY_UNARY))
HANDLERS = {"Unary": "unary", "Sum": "sum", "BidiEcho": "bidi_echo", "Metadata": "metadata",
            "Inspect": "inspect", "Hang": "hang"}
TURNS = 4                 # event-loop turns between pieces of input
MAX_PIECES = 64
SETTLE_TURNS = 200        # turns allowed for the lost connection's calls to end


class FakeTransport(asyncio.Transport):
    """What ServerConnection uses of a socket transport; it counts what is written."""

    def __init__(self, conn):
        super().__init__()
        self.conn = conn
        self.written = 0
        self.closing = False
        self.paused = False

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 50000) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def can_write_eof(self):
        return False        # a connection error then closes at once, as over TLS

    def get_write_buffer_size(self):
        return 0

    def write(self, data):
        self.written += len(data)

    def writelines(self, pieces):
        for piece in pieces:
            self.write(piece)

    def is_closing(self):
        return self.closing

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False

    def close(self):
        self._lose()

    def abort(self):
        self._lose()

    def _lose(self):
        # As a socket transport does: connection_lost comes on a later turn, once.
        if not self.closing:
            self.closing = True
            self.conn.loop.call_soon(self.conn.connection_lost, None)


class _Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        text = record.getMessage()
        if record.levelno >= logging.ERROR or "failed" in text:
            self.records.append(f"{record.name}: {text}")


class ServerConnectionTarget:
    """`target(data)`: byte 0 picks the size of the pieces the input is fed in, the rest is
    what the client sends after its preface."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.loop_errors = []
        self.loop.set_exception_handler(lambda loop, ctx: self.loop_errors.append(
            f"{ctx.get('message')}: {ctx.get('exception')!r}"))
        self.log = _Errors()
        logging.getLogger("danube").addHandler(self.log)
        self.extra_methods = []       # (name, kind, handler attribute) a test adds

    def close(self):
        logging.getLogger("danube").removeHandler(self.log)
        self.loop.close()

    def _turns(self, n):
        for _ in range(n):
            self.loop.run_until_complete(asyncio.sleep(0))

    def _from_loop(self, callback, *args):
        """Call ``callback`` as the loop calls a protocol's methods: from a callback of the
        running loop, outside any task (a unary handler may run right there, in
        data_received). Whatever it raises reaches the loop's exception handler: a finding."""
        self.loop.call_soon(callback, *args)
        self._turns(1)

    def __call__(self, data: bytes):
        if not data:
            return
        service = TestService()
        service.loop = self.loop
        config = TransportConfig(**CONFIG)
        server = Server(config, loop=self.loop)
        for name, kind in METHODS:
            server.add_method(P + name, kind, getattr(service, HANDLERS[name]))
        for name, kind, attribute in self.extra_methods:
            server.add_method(P + name, kind, getattr(service, attribute))
        # A handler failure is logged at error once per kind, later ones at debug: each
        # input starts with none logged, so that every one is seen.
        _failures_logged.clear()
        conn = ServerConnection(server)
        transport = FakeTransport(conn)
        body = http2.CLIENT_PREFACE + data[1:]
        # Small pieces split frames and prefixes everywhere; at most MAX_PIECES of them keep
        # an execution short.
        piece = max(data[0] * 97 + 1, len(body) // MAX_PIECES + 1)
        try:
            self._from_loop(conn.connection_made, transport)
            for i in range(0, len(body), piece):
                for _ in range(50):
                    if not transport.paused:
                        break
                    self._turns(1)
                if transport.closing:
                    break
                if not transport.paused:
                    self._from_loop(conn.data_received, body[i:i + piece])
                self._turns(TURNS)
                self._check_bounded(conn, piece)
            if not transport.closing:
                transport.closing = True
                self._from_loop(conn.connection_lost, None)
            self._settle(conn, server)
        finally:
            if server.idle_streams is not None:
                server.idle_streams.close()
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self._turns(2)
        errors, self.loop_errors = self.loop_errors, []
        logged, self.log.records = self.log.records, []
        check(not errors, f"the event loop's exception handler was called: {errors}")
        check(not logged, f"errors logged: {logged}")

    def _check_bounded(self, conn, piece):
        c = conn.config
        if conn.closed:
            # After a connection error the reader keeps what it had; nothing reads it again.
            return
        check(conn.reader.buffered <= 9 + c.max_frame_size + 24,
              f"frame reader holds {conn.reader.buffered} bytes")
        check(len(conn.streams) <= c.max_concurrent_streams, f"{len(conn.streams)} streams")
        check(conn.buffered <= c.max_connection_buffered_bytes + c.max_message_size + 5,
              f"{conn.buffered} bytes of incomplete requests held")
        check(len(conn._recently_reset) <= 1025, "reset-stream memory unbounded")
        check(len(conn.decoder._cache) <= HeaderDecoder._CACHE_LIMIT, "header cache unbounded")
        check(len(conn._backlog or ()) <= BACKLOG_PAUSE + piece // 9 + 1,
              f"{len(conn._backlog or ())} frames in the backlog")
        if conn._header_block is not None:
            check(conn._header_block[3] <= c.max_header_list_size + c.max_frame_size,
                  f"header block of {conn._header_block[3]} bytes being assembled")

    def _settle(self, conn, server):
        for _ in range(SETTLE_TURNS):
            if not asyncio.all_tasks(self.loop):
                break
            self._turns(1)
        check(not conn.streams, f"{len(conn.streams)} streams left after connection_lost")
        check(conn._timer is None, "connection timer left after connection_lost")
        check(not server.connections, "the server still lists the lost connection")
        check(server.active_calls == 0, f"{server.active_calls} calls still active")
        left = asyncio.all_tasks(self.loop)
        check(not left, f"{len(left)} tasks still running {SETTLE_TURNS} turns after "
                        f"connection_lost: {[t.get_coro() for t in left][:3]}")
        if server.idle_streams is not None:
            check(not any(server.idle_streams.buckets.values()),
                  "streams left in the idle-stream timer wheel")


@contextlib.contextmanager
def server_connection():
    target = ServerConnectionTarget()
    try:
        yield target
    finally:
        target.close()


def _request(sid, method, messages, end=True, extra=()):
    block = encode_headers([(b":method", b"POST"), (b":scheme", b"http"),
                            (b":path", (P + method).encode()), (b":authority", b"fuzz"),
                            (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                            *extra])
    body = b"".join(grpc_frame(m) for m in messages)
    return (http2.header_frames(sid, block, 16384, False)
            + http2.data_frames(sid, body, 0, len(body), 16384, end))


def server_seeds():
    settings = http2.settings_frame([(1, 4096), (4, 1 << 20), (5, 16384), (6, 8192)])
    enc = hpack.Encoder()
    indexed = enc.encode([(b":method", b"POST"), (b":scheme", b"http"),
                          (b":path", (P + "Unary").encode()), (b"x-user", b"fuzz"),
                          (b"content-type", b"application/grpc"), (b"grpc-timeout", b"2S")])
    calls = (_request(1, "Unary", [b"hello"])
             + _request(3, "Sum", [b"a" * 10, b"b" * 300])
             + _request(5, "BidiEcho", [b"x", b"y"], end=False)
             + _request(7, "Metadata", [b""], extra=[(b"x-key-bin", b"AAEC")])
             + _request(9, "Hang", [b"key"])
             + _request(11, "Inspect", [b"q" * 70000]))
    control = (http2.window_update_frame(0, 1 << 16) + http2.window_update_frame(5, 100)
               + http2.ping_frame(b"pingpong") + http2.rst_stream_frame(5, 8)
               + http2.settings_frame([], ack=True))
    continued = http2.header_frames(13, encode_headers([
        (b":method", b"POST"), (b":path", (P + "Unary").encode()),
        (b"content-type", b"application/grpc")]), 7, False) + \
        http2.data_frames(13, grpc_frame(b"c"), 0, 6, 16384, True)
    hpacked = (http2.header_frames(15, indexed, 16384, False)
               + http2.data_frames(15, grpc_frame(b"i"), 0, 6, 16384, True)
               + http2.header_frames(17, enc.encode([(b":method", b"POST"),
                                                     (b":path", (P + "Unary").encode())]),
                                     16384, True))
    return [b"\x00" + settings + calls + control,
            b"\x01" + settings + continued + hpacked,
            b"\x0b" + settings + calls[:200] + http2.goaway_frame(0, 0, b""),
            b"\xff" + settings + hpacked + calls]

