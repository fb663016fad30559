"""Helpers for the gRPC transport tests: a test service, a `Server` running in a uvloop loop
on a background thread, trustme certificates, and a raw HTTP/2 client built on the `h2`
library (plus frame reading with `hyperframe`, independent of our own codec).

Request conventions of the test service (all methods take and return raw bytes):

  /test.Echo/Unary          echo the request
  /test.Echo/Sleep          sleep int(request) milliseconds, then echo the request
  /test.Echo/Error          raise RpcError: request b"" -> (FAILED_PRECONDITION, ERROR_DETAILS),
                            else b"<code>|<utf-8 details>"
  /test.Echo/Raise          raise ValueError("boom")
  /test.Echo/Stream         int(request) messages of 100 bytes (stream_message(i)), yielded
  /test.Echo/BatchStream    b"<n>[,<batch>]": the same messages sent with write_batch
  /test.Echo/Sum            client stream: returns b"<count>,<total bytes>"
  /test.Echo/BidiEcho       echo every request message
  /test.Echo/Metadata       echo invocation metadata whose key starts with "x-" as initial
                            and trailing metadata; returns JSON of all invocation metadata
  /test.Echo/Hang           wait until release(key=request); records start/cancel/finish
  /test.Echo/Blob           int(request) bytes of blob(n)
  /test.Echo/Inspect        JSON about the call (grpc-encoding, compressed flag, length, ...)
  /test.Echo/Flood          b"<key>,<size>": write messages of <size> bytes forever
"""

import asyncio
import base64
import collections
import hashlib
import json
import os
import select
import socket
import ssl
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
import trustme
import uvloop

from danube.rpc import RpcError, StatusCode
from danube.rpc.server import Kind, Server

P = "/test.Echo/"
ERROR_DETAILS = "bad input: ünïcødé ✓ 100% done %41 \t tab"
STREAM_MESSAGE_SIZE = 100


def stream_message(i: int) -> bytes:
    """The i-th message of Stream/BatchStream: exactly 100 bytes, unique per index."""
    return b"%010d" % i + b"m" * (STREAM_MESSAGE_SIZE - 10)


_PATTERN = bytes(range(256)) * 4096  # 1 MiB


def blob(n: int) -> bytes:
    reps, rest = divmod(n, len(_PATTERN))
    return _PATTERN * reps + _PATTERN[:rest]


class TestService:
    """The handlers plus what they record; the records are read from the test thread."""

    __test__ = False  # not a pytest test class

    def __init__(self):
        self.loop = None  # the server loop, set by ServerThread
        self.hang_events = {}
        self.hang_started = collections.Counter()
        self.hang_cancelled = collections.defaultdict(threading.Event)
        self.hang_finished = collections.Counter()
        self.flood_contexts = {}
        self.flood_writes = collections.Counter()
        self.flood_cancelled = collections.defaultdict(threading.Event)
        self.calls = collections.Counter()

    # -- handlers ----------------------------------------------------------------------

    async def unary(self, request, context):
        self.calls["Unary"] += 1
        return request

    async def sleep(self, request, context):
        self.calls["Sleep"] += 1        # tests wait for the call to be in the handler
        await asyncio.sleep(int(request) / 1000)
        return request

    async def error(self, request, context):
        if not request:
            raise RpcError(StatusCode.FAILED_PRECONDITION, ERROR_DETAILS)
        code, _, details = request.decode("utf-8").partition("|")
        raise RpcError(StatusCode(int(code)), details)

    async def raise_(self, request, context):
        raise ValueError("boom")

    async def stream(self, request, context):
        for i in range(int(request)):
            yield stream_message(i)

    async def batch_stream(self, request, context):
        n, _, batch = request.partition(b",")
        n = int(n)
        batch = int(batch or 1000)
        for start in range(0, n, batch):
            await context.write_batch([stream_message(i)
                                       for i in range(start, min(n, start + batch))])

    async def sum(self, request_iterator, context):
        count = total = 0
        async for message in request_iterator:
            count += 1
            total += len(message)
        return b"%d,%d" % (count, total)

    async def bidi_echo(self, request_iterator, context):
        async for message in request_iterator:
            yield message

    async def metadata(self, request, context):
        md = context.invocation_metadata()
        echo = [(k, v) for k, v in md if k.startswith("x-")]
        await context.send_initial_metadata(echo)
        context.set_trailing_metadata(echo)
        return json.dumps([[k, v if isinstance(v, str) else "b64:" + base64.b64encode(v).decode()]
                           for k, v in md]).encode()

    def hang_event(self, key):
        event = self.hang_events.get(key)
        if event is None:
            event = self.hang_events[key] = asyncio.Event()
        return event

    async def hang(self, request, context):
        key = request
        self.hang_started[key] += 1
        try:
            await self.hang_event(key).wait()
            return b"released"
        except asyncio.CancelledError:
            self.hang_cancelled[key].set()
            raise
        finally:
            self.hang_finished[key] += 1

    async def blob(self, request, context):
        return blob(int(request))

    async def inspect(self, request, context):
        return json.dumps({
            "encoding": context.head.encoding,
            "compressed": bool(context.deframer.any_compressed),
            "length": len(request),
            "sha256": hashlib.sha256(request).hexdigest(),
            "timeout": context.time_remaining(),
            "peer": context.peer(),
        }).encode()

    async def flood(self, request, context):
        key, _, size = request.partition(b",")
        message = b"f" * int(size)
        self.flood_contexts[key] = context
        try:
            while True:
                await context.write(message)
                self.flood_writes[key] += 1
        except asyncio.CancelledError:
            self.flood_cancelled[key].set()
            raise

    def register(self, server: Server):
        U, US, SU, SS = Kind.UNARY_UNARY, Kind.UNARY_STREAM, Kind.STREAM_UNARY, Kind.STREAM_STREAM
        for name, kind, handler in [
            ("Unary", U, self.unary), ("Sleep", U, self.sleep), ("Error", U, self.error),
            ("Raise", U, self.raise_), ("Stream", US, self.stream),
            ("BatchStream", US, self.batch_stream), ("Sum", SU, self.sum),
            ("BidiEcho", SS, self.bidi_echo), ("Metadata", U, self.metadata),
            ("Hang", U, self.hang), ("Blob", U, self.blob), ("Inspect", U, self.inspect),
            ("Flood", US, self.flood),
        ]:
            server.add_method(P + name, kind, handler)


class ServerThread:
    """A danube.rpc Server with the test service, on a uvloop loop in a daemon thread."""

    def __init__(self, *, config=None, compression=None, ssl_context=None, port=0):
        self.service = TestService()
        self.config = config
        self.compression = compression
        self.ssl_context = ssl_context
        self.requested_port = port
        self.server = None
        self.port = None
        self.loop = None
        self.thread = None
        self.stopped = False

    def start(self):
        self.loop = uvloop.new_event_loop()
        self.service.loop = self.loop
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="rpc-test-server", daemon=True)
        self.thread.start()
        ready.wait(5)
        self.server = Server(self.config, compression=self.compression)
        self.service.register(self.server)
        try:
            self.port = self.call(self.server.start("127.0.0.1", self.requested_port,
                                                    ssl=self.ssl_context))
        except BaseException:
            self.server = None
            self.stop()
            raise
        return self

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    def call(self, coro, timeout=10):
        """Run a coroutine on the server loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def submit(self, coro):
        """Schedule a coroutine on the server loop; returns a concurrent Future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run_sync(self, fn, *args, timeout=10):
        """Call a plain function on the server loop (to read loop-owned state safely)."""
        async def wrapper():
            return fn(*args)
        return self.call(wrapper(), timeout)

    def release(self, key: bytes):
        self.loop.call_soon_threadsafe(lambda: self.service.hang_event(key).set())

    def wait_for(self, predicate, timeout=5.0, interval=0.005):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(interval)
        return True

    def stop(self, grace=0.5):
        """Stop the server (GOAWAY, grace, cancel) and then the loop and the thread."""
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.server is not None:
                # Release anything still hanging so teardown does not wait out the grace.
                self.run_sync(lambda: [e.set() for e in self.service.hang_events.values()])
                self.call(self.server.stop(grace), timeout=grace + 15)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()


# -- TLS ---------------------------------------------------------------------------------

class Certs:
    """A trustme CA, a server certificate for 127.0.0.1/localhost and a client certificate,
    written to files (grpcio wants PEM bytes, our client wants paths or a context)."""

    def __init__(self, directory):
        self.ca = trustme.CA()
        self.server_cert = self.ca.issue_cert("127.0.0.1", "localhost")
        self.client_cert = self.ca.issue_cert("client.test")
        self.dir = str(directory)
        self.ca_file = os.path.join(self.dir, "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        self.client_cert_file = os.path.join(self.dir, "client.pem")
        self.client_key_file = os.path.join(self.dir, "client.key")
        self.client_cert.private_key_pem.write_to_path(self.client_key_file)
        self.client_cert.cert_chain_pems[0].write_to_path(self.client_cert_file)
        for pem in self.client_cert.cert_chain_pems[1:]:
            pem.write_to_path(self.client_cert_file, append=True)

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    @property
    def client_key_pem(self) -> bytes:
        return self.client_cert.private_key_pem.bytes()

    @property
    def client_chain_pem(self) -> bytes:
        return b"".join(p.bytes() for p in self.client_cert.cert_chain_pems)

    def server_context(self, require_client_cert=False) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_cert.configure_cert(ctx)
        ctx.set_alpn_protocols(["h2"])
        if require_client_cert:
            self.ca.configure_trust(ctx)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self, with_cert=False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        self.ca.configure_trust(ctx)
        ctx.set_alpn_protocols(["h2"])
        if with_cert:
            self.client_cert.configure_cert(ctx)
        return ctx


# -- grpcio helpers ----------------------------------------------------------------------

GRPC_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20)]


# -- raw HTTP/2 ----------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def grpc_message(data: bytes, compressed=False) -> bytes:
    return bytes((1 if compressed else 0,)) + len(data).to_bytes(4, "big") + data


def split_grpc_messages(data: bytes):
    """[(compressed_flag, payload)] from a buffer of whole length-prefixed messages."""
    out = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 5, "truncated gRPC prefix in response"
        flag = data[pos]
        n = int.from_bytes(data[pos + 1:pos + 5], "big")
        assert len(data) - pos - 5 >= n, "truncated gRPC message in response"
        out.append((flag, data[pos + 5:pos + 5 + n]))
        pos += 5 + n
    return out


def request_headers(path, port, extra=()):
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
            (b":authority", b"127.0.0.1:%d" % port), (b"content-type", b"application/grpc"),
            (b"te", b"trailers"), *extra]


class StreamResult:
    def __init__(self):
        self.headers = None
        self.trailers = None
        self.data = bytearray()
        self.ended = False
        self.reset = None  # RST_STREAM error code

    @property
    def done(self):
        return self.ended or self.reset is not None

    def header(self, name: bytes):
        for block in (self.trailers or (), self.headers or ()):
            for k, v in block:
                if k == name:
                    return v
        return None

    @property
    def grpc_status(self):
        v = self.header(b"grpc-status")
        return None if v is None else int(v)

    @property
    def messages(self):
        return [m for _, m in split_grpc_messages(bytes(self.data))]


class RawH2Client:
    """A blocking HTTP/2 client on a plain socket driven by the `h2` state machine. Flow
    control on receive is manual (auto_ack=False) so tests can hold windows shut."""

    def __init__(self, port, *, initial_window=None, connection_window=None, auto_ack=True,
                 max_frame_size=None):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                        validate_inbound_headers=True)
        self.conn = h2.connection.H2Connection(config=cfg)
        initial = {h2.settings.SettingCodes.ENABLE_PUSH: 0}
        if initial_window is not None:
            initial[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] = initial_window
        if max_frame_size is not None:
            initial[h2.settings.SettingCodes.MAX_FRAME_SIZE] = max_frame_size
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values=initial)
        if max_frame_size is not None:
            # h2 took its inbound limit from the settings it was constructed with.
            self.conn.max_inbound_frame_size = max_frame_size
        self.conn.initiate_connection()
        if connection_window:
            self.conn.increment_flow_control_window(connection_window)
        self.auto_ack = auto_ack
        self.streams = collections.defaultdict(StreamResult)
        self.events = []
        self.terminated = None  # ConnectionTerminated event
        self.eof = False
        self.settings_received = False
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start_call(self, path, messages=(), end=True, extra_headers=()):
        sid = self.conn.get_next_available_stream_id()
        body = b"".join(grpc_message(m) for m in messages)
        self.conn.send_headers(sid, request_headers(path, self.port, extra_headers),
                               end_stream=end and not body)
        self.flush()
        if body:
            self.send_body(sid, body, end)
        return sid

    def send_body(self, sid, body, end=True, timeout=10.0):
        """Send DATA within the server's flow-control windows and frame size."""
        deadline = time.monotonic() + timeout
        if not self.settings_received:
            self.wait(lambda: self.settings_received, timeout)
        pos = 0
        while pos < len(body):
            allowed = min(self.conn.local_flow_control_window(sid),
                          self.conn.max_outbound_frame_size, len(body) - pos)
            if allowed <= 0:
                assert time.monotonic() < deadline, "server never opened its window"
                self.pump(0.5)
                continue
            try:
                self.conn.send_data(sid, body[pos:pos + allowed],
                                    end_stream=end and pos + allowed == len(body))
            except h2.exceptions.StreamClosedError:
                return  # the server already answered (and reset) the stream
            pos += allowed
            self.flush()

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def pump(self, timeout=5.0):
        """Read once (up to `timeout`) and process events. Returns False at EOF/timeout."""
        if self.eof:
            return False
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return False
        try:
            data = self.sock.recv(1 << 20)
        except (ConnectionResetError, OSError):
            data = b""
        if not data:
            self.eof = True
            return False
        for event in self.conn.receive_data(data):
            self.events.append(event)
            self._on_event(event)
        self.flush()
        return True

    def _on_event(self, event):
        if isinstance(event, h2.events.ResponseReceived):
            self.streams[event.stream_id].headers = list(event.headers)
        elif isinstance(event, h2.events.TrailersReceived):
            self.streams[event.stream_id].trailers = list(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.streams[event.stream_id].data += event.data
            if self.auto_ack and event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.streams[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.streams[event.stream_id].reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings_received = True

    def wait(self, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not self.pump(left) and self.eof:
                return predicate()
        return True

    def call(self, path, messages=(), timeout=5.0, extra_headers=()):
        sid = self.start_call(path, messages, extra_headers=extra_headers)
        assert self.wait(lambda: self.streams[sid].done, timeout), f"stream {sid} not done"
        return self.streams[sid]

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def read_frames(sock, timeout=5.0):
    """Read raw frames (parsed with hyperframe) until EOF or `timeout`. Returns
    (frames, eof)."""
    buf = bytearray()
    frames = []
    deadline = time.monotonic() + timeout
    eof = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([sock], [], [], left)
        if not r:
            break
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, OSError):
            chunk = b""
        if not chunk:
            eof = True
            break
        buf += chunk
    pos = 0
    while len(buf) - pos >= 9:
        frame, length = hyperframe.frame.Frame.parse_frame_header(memoryview(buf[pos:pos + 9]))
        if len(buf) - pos - 9 < length:
            break
        frame.parse_body(memoryview(bytes(buf[pos + 9:pos + 9 + length])))
        frames.append(frame)
        pos += 9 + length
    return frames, eof


def raw_connection(port, settings=b""):
    """A socket that has sent the client preface and an (empty by default) SETTINGS frame."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    settings_frame = len(settings).to_bytes(3, "big") + b"\x04\x00\x00\x00\x00\x00" + settings
    sock.sendall(PREFACE + settings_frame)
    return sock


def h2_frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return (len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big")
            + payload)


def goaways(frames):
    return [f for f in frames if isinstance(f, hyperframe.frame.GoAwayFrame)]


class FrameStream:
    """Incremental reader of raw frames from a socket (parsed with hyperframe), for
    exchanges the `h2` state machine refuses to follow (it stops accepting frames on a
    stream once it has received GOAWAY)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.frames = []
        self.eof = False

    def _parse(self):
        pos = 0
        while len(self.buf) - pos >= 9:
            frame, length = hyperframe.frame.Frame.parse_frame_header(
                memoryview(bytes(self.buf[pos:pos + 9])))
            if len(self.buf) - pos - 9 < length:
                break
            frame.parse_body(memoryview(bytes(self.buf[pos + 9:pos + 9 + length])))
            self.frames.append(frame)
            pos += 9 + length
        del self.buf[:pos]

    def wait(self, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        while not predicate(self.frames):
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                return predicate(self.frames)
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                continue
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, OSError):
                chunk = b""
            if not chunk:
                self.eof = True
            self.buf += chunk
            self._parse()
        return True

    def of_stream(self, sid, kind=None):
        return [f for f in self.frames if f.stream_id == sid
                and (kind is None or isinstance(f, kind))]

    def stream_ended(self, sid):
        return any("END_STREAM" in f.flags for f in self.of_stream(sid)
                   if isinstance(f, (hyperframe.frame.HeadersFrame, hyperframe.frame.DataFrame)))


def encode_request(path, port, extra=(), encoder=None):
    import hpack
    encoder = encoder or hpack.Encoder()
    return encoder.encode(request_headers(path, port, extra))
