"""Hostile clients at the stream level (issue 17): a unary call flooded with tiny messages,
streams left open without their request, deadlines that expire before the handler runs.

The broker tests drive a real `danube broker` process with raw HTTP/2 frames on loopback and
check (a) the broker's RSS stays bounded, (b) the documented status or reset arrives and the
stream slot is freed, (c) a well-behaved grpcio client is served meanwhile. The transport
tests after them cover every call kind with the in-process test service."""

import select
import socket
import time

import grpc
import h2.exceptions
import hpack
import pytest

from danube.config import ConfigError, load_config
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.connection import TransportConfig

from broker_process import BrokerProcess
from rpc_fixtures import P, PREFACE, RawH2Client, grpc_message, request_headers

HEALTH = "/danube.HealthCheck/HealthCheck"
RECEIVE = "/danube.ConsumerService/ReceiveMessages"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
E_NO_ERROR, E_REFUSED_STREAM, E_CANCEL = 0, 7, 8
OK, CANCELLED, DEADLINE_EXCEEDED, INTERNAL = 0, 1, 4, 13

IDLE_TIMEOUT_MS = 500
MAX_STREAMS = 2000
HEALTH_REQUEST = pb.HealthCheckRequest(request_id=1, client=pb.HealthCheckRequest.Producer,
                                       id=1).SerializeToString()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    cfg = tmp / "broker.yml"
    # Tight limits keep the tests short: a stalled request is dropped after 0.5 s, and a
    # leak of stream slots shows after 2,000 calls instead of 16,384.
    cfg.write_text("cluster_name: test\nbroker:\n  host: 127.0.0.1\n  ports:\n"
                   "    client: 0\n    admin: 0\n"
                   f"grpc:\n  stream_idle_timeout_ms: {IDLE_TIMEOUT_MS}\n"
                   f"  max_concurrent_streams: {MAX_STREAMS}\n"
                   # Calls expired on arrival count as resets; the leak test below sends
                   # 20,000 of them on one connection, which must not end it.
                   f"  max_resets_per_second: 1000000\n")
    b = BrokerProcess(data_dir=tmp / "d")
    b.args = ["--mode", "standalone", "--data-dir", str(tmp / "d"), "--config-file", str(cfg)]
    b.start()
    yield b
    b.stop()


def rss_mib(broker):
    with open(f"/proc/{broker.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def grpcio_health(broker):
    with grpc.insecure_channel(broker.client_addr) as ch:
        check = ch.unary_unary(HEALTH, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=pb.HealthCheckResponse.FromString)
        resp = check(pb.HealthCheckRequest(request_id=1, client=pb.HealthCheckRequest.Producer,
                                           id=1), timeout=5)
        assert resp.status == pb.HealthCheckResponse.CLOSE


def frame(ftype, flags, sid, payload):
    return (len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big")
            + payload)


class FastConn:
    """Raw frames for traffic in bulk (thousands of streams), where the `h2` state machine
    would dominate the test's time: requests are built by hand, responses parsed just enough
    to know each stream's grpc-status and RST_STREAM code."""

    def __init__(self, port):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 1 << 20
        self.buf = bytearray()
        self.status = {}      # sid -> grpc-status
        self.resets = {}      # sid -> RST_STREAM error code
        self.goaway = None
        self.eof = False
        self.next_sid = 1
        # Our client window stays wide open: the server's responses never wait for it.
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b"")
                          + frame(WINDOW_UPDATE, 0, 0, (1 << 30).to_bytes(4, "big")))

    def new_sid(self):
        sid, self.next_sid = self.next_sid, self.next_sid + 2
        return sid

    def request(self, path, body=None, end=True, extra=()):
        """(sid, bytes of a HEADERS frame and, if body is not None, one DATA frame)."""
        sid = self.new_sid()
        block = self.encoder.encode(request_headers(path, self.port, extra))
        out = frame(HEADERS, END_HEADERS | (END_STREAM if end and body is None else 0), sid,
                    block)
        if body is not None:
            out += frame(DATA, END_STREAM if end else 0, sid, body)
        return sid, out

    def pump(self, timeout):
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        pos = 0
        buf = self.buf
        while len(buf) - pos >= 9:
            n = int.from_bytes(buf[pos:pos + 3], "big")
            if len(buf) - pos - 9 < n:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + 9:pos + 9 + n])
            pos += 9 + n
            if ftype == HEADERS:
                assert flags & END_HEADERS, "test parser expects whole header blocks"
                for name, value in self.decoder.decode(payload, raw=True):
                    if name == b"grpc-status":
                        self.status[sid] = int(value)
            elif ftype == RST_STREAM:
                self.resets[sid] = int.from_bytes(payload[:4], "big")
            elif ftype == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0, b""))
            elif ftype == GOAWAY:
                self.goaway = int.from_bytes(payload[4:8], "big")
        del buf[:pos]
        return True

    def wait(self, predicate, timeout):
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                return predicate()
            self.pump(left)
        return True

    def health_call(self, timeout=5):
        sid, out = self.request(HEALTH, grpc_message(HEALTH_REQUEST))
        self.sock.sendall(out)
        assert self.wait(lambda: sid in self.status or sid in self.resets, timeout), \
            f"no answer to a HealthCheck on stream {sid}"
        return self.status.get(sid), self.resets.get(sid)

    def close(self):
        self.sock.close()


# -- finding 1: a unary request is one message ----------------------------------------------

def test_unary_flooded_with_tiny_messages_is_refused_unbuffered(broker):
    """HEADERS without END_STREAM and then megabytes of 1-byte messages: each such message
    once cost a Python object (~7x its wire size) and was credited back, so the client could
    grow the broker without bound. Now the second message ends the call with INTERNAL, the
    stream is reset and its window never reopens."""
    rss0 = rss_mib(broker)
    c = RawH2Client(broker.client_port)
    try:
        assert c.wait(lambda: c.settings_received, 5)
        chunk = grpc_message(b"x") * 2730                    # 16,380 bytes, 2,730 messages
        per_stream = 8 * 1024 * 1024
        for path in (HEALTH, HEALTH, RECEIVE):
            sid = c.start_call(path, end=False)
            sent = 0
            stalled_since = None
            while sent < per_stream and not c.streams[sid].done:
                if c.conn.local_flow_control_window(sid) < len(chunk):
                    # The server withholds credit: what we may send is bounded by its window.
                    stalled_since = stalled_since or time.monotonic()
                    if time.monotonic() - stalled_since > 2:
                        break
                    c.pump(0.05)
                    continue
                stalled_since = None
                try:
                    c.conn.send_data(sid, chunk)
                except h2.exceptions.StreamClosedError:
                    break
                c.flush()
                sent += len(chunk)
                c.pump(0)
            assert c.wait(lambda: c.streams[sid].done, 5), \
                f"{path}: no answer after {sent} bytes of extra messages"
            assert c.streams[sid].grpc_status == INTERNAL, c.streams[sid].trailers
            assert b"more than one request message" in c.streams[sid].header(b"grpc-message")
            # Refused at the second message: well under one stream window got through.
            assert sent < 4 * 1024 * 1024, sent
        # A server-streaming request with its two messages in separate DATA frames.
        sid = c.start_call(RECEIVE, end=False)
        c.conn.send_data(sid, grpc_message(b"\x08\x01"))
        c.flush()
        c.pump(0.05)
        try:
            c.conn.send_data(sid, grpc_message(b"\x08\x02"))
            c.flush()
        except h2.exceptions.StreamClosedError:
            pass
        assert c.wait(lambda: c.streams[sid].done, 5)
        assert c.streams[sid].grpc_status == INTERNAL
        # The same connection still serves calls, and so does the broker.
        r = c.call(HEALTH, [HEALTH_REQUEST])
        assert r.grpc_status == OK, r.trailers
        grpcio_health(broker)
    finally:
        c.close()
    grown = rss_mib(broker) - rss0
    assert grown < 40, f"broker RSS grew {grown:.0f} MiB"


# -- finding 2: stalled requests time out ---------------------------------------------------

def test_stalled_requests_time_out_and_free_their_streams(broker):
    """Streams whose request never completes (HEADERS alone, or part of a message) are
    failed with CANCELLED and RST_STREAM(CANCEL) after grpc.stream_idle_timeout_ms; their
    slots are free again, on the same connection, and the memory is reused."""
    grpcio_health(broker)
    rss0 = rss_mib(broker)
    peak = rss0
    conns = []
    try:
        for wave in range(3):
            wave_conns = [FastConn(broker.client_port) for _ in range(3)]
            conns += wave_conns
            sids = []
            for c in wave_conns:
                out = bytearray()
                for i in range(MAX_STREAMS):
                    # Half send HEADERS alone, half also the first 50 bytes of a message.
                    sid, data = c.request(HEALTH, end=False) if i % 2 == 0 else \
                        c.request(HEALTH, grpc_message(b"x" * 100)[:50], end=False)
                    out += data
                    sids.append((c, sid))
                c.sock.sendall(out)
                # Every slot is taken: one more call on this connection is refused.
                status, reset = c.health_call()
                assert reset == E_REFUSED_STREAM and status is None, (status, reset)
            # A well-behaved client is served while the stalled streams hold every slot.
            grpcio_health(broker)
            peak = max(peak, rss_mib(broker))
            t0 = time.monotonic()
            for c in wave_conns:
                assert c.wait(lambda c=c: all(s in c.resets for cc, s in sids if cc is c), 60), \
                    f"wave {wave}: stalled streams were never reset"
            waited = time.monotonic() - t0
            # Reset by the idle timeout, not by something much later (generous: 20 of them).
            assert waited < 20 * IDLE_TIMEOUT_MS / 1000, waited
            for c, sid in sids:
                assert c.status.get(sid) == CANCELLED, (sid, c.status.get(sid))
                assert c.resets[sid] == E_CANCEL
            # The slots are free again: a new call on the same connection is served.
            for c in wave_conns:
                assert c.health_call() == (OK, None)
    finally:
        for c in conns:
            c.close()
    # 18,000 streams were opened; at most 6,000 were ever open at once and their memory
    # was reused wave after wave (before the fix all 18,000 stayed).
    grown = rss_mib(broker) - rss0
    assert grown < 40, f"broker RSS grew {grown:.0f} MiB (peak +{peak - rss0:.0f})"
    grpcio_health(broker)


# -- finding 3: expired deadlines are always answered --------------------------------------

def test_deadline_expired_before_start_is_answered_and_freed(broker):
    """HEADERS with grpc-timeout 1n and the request with END_STREAM in one write, 20,000
    times on one connection: every call is answered (DEADLINE_EXCEEDED, or OK when the
    handler won the race) and its stream freed, so the connection (2,000 slots) keeps
    serving."""
    grpcio_health(broker)
    rss0 = rss_mib(broker)
    c = FastConn(broker.client_port)
    body = grpc_message(HEALTH_REQUEST)
    statuses = {}
    try:
        for batch in range(40):
            out = bytearray()
            sids = []
            for _ in range(500):
                sid, data = c.request(HEALTH, body, extra=[(b"grpc-timeout", b"1n")])
                out += data
                sids.append(sid)
            c.sock.sendall(out)
            assert c.wait(lambda: all(s in c.status or s in c.resets for s in sids), 10), \
                f"batch {batch}: {sum(s not in c.status for s in sids)} calls unanswered"
            for s in sids:
                assert c.resets.get(s) != E_REFUSED_STREAM, f"batch {batch}: slots leaked"
                statuses[s] = c.status[s]
            if batch == 20:
                grpcio_health(broker)
        assert set(statuses.values()) <= {OK, DEADLINE_EXCEEDED}, set(statuses.values())
        assert DEADLINE_EXCEEDED in statuses.values()
        assert len(statuses) == 20000
        # The same connection still serves a call without a deadline.
        assert c.health_call() == (OK, None)
        assert c.goaway is None
    finally:
        c.close()
    grpcio_health(broker)
    grown = rss_mib(broker) - rss0
    assert grown < 30, f"broker RSS grew {grown:.0f} MiB"


# -- the transport, every call kind ----------------------------------------------------------

def _streams_freed(srv):
    return srv.run_sync(lambda: sum(len(c.streams) for c in srv.server.connections)) == 0


@pytest.mark.parametrize("method,body,end", [
    ("Unary", b"x", True),
    ("Stream", b"3", True),          # server streaming
    ("Sum", b"x", False),            # client streaming, request still open
    ("Sum", b"x", True),
    ("BidiEcho", b"x", False),
    ("BidiEcho", b"x", True),
])
def test_expired_deadline_every_kind(server_factory, method, body, end):
    srv = server_factory(config=TransportConfig())
    c = FastConn(srv.port)
    try:
        sids = []
        out = bytearray()
        for _ in range(300):
            sid, data = c.request(P + method, grpc_message(body), end=end,
                                  extra=[(b"grpc-timeout", b"1n")])
            out += data
            sids.append(sid)
        c.sock.sendall(out)
        assert c.wait(lambda: all(s in c.status or s in c.resets for s in sids), 5), \
            f"{sum(s not in c.status for s in sids)} of {len(sids)} calls unanswered"
        assert {c.status[s] for s in sids} <= {OK, DEADLINE_EXCEEDED}
        if not end:
            # The request was still open: the status is followed by RST_STREAM.
            assert all(s in c.resets for s in sids if c.status[s] == DEADLINE_EXCEEDED)
        assert srv.wait_for(lambda: _streams_freed(srv), 3)
    finally:
        c.close()


def test_deadline_while_response_blocked_on_window(server_factory):
    """A deadline that fires while the handler waits for a window the client never opens:
    the status (or a reset) still goes out and the stream is freed."""
    srv = server_factory(config=TransportConfig())
    for window in (1050, 1000):      # 10 whole messages / a message cut by the window
        c = RawH2Client(srv.port, initial_window=window, auto_ack=False)
        try:
            sid = c.start_call(P + "Flood", [b"k%d,100" % window],
                               extra_headers=[(b"grpc-timeout", b"300m")])
            assert c.wait(lambda: c.streams[sid].done, 3)
            st = c.streams[sid]
            assert st.grpc_status == DEADLINE_EXCEEDED or st.reset == E_CANCEL, \
                (st.trailers, st.reset)
            assert srv.wait_for(lambda: _streams_freed(srv), 3)
        finally:
            c.close()


def test_idle_timeout_spares_streams_that_progress(server_factory):
    """Only requests that stall are timed out: a handler running long after its request
    completed, and a client stream that keeps sending, are left alone."""
    srv = server_factory(config=TransportConfig(stream_idle_timeout_ms=200))
    c = RawH2Client(srv.port)
    try:
        hang = c.start_call(P + "Hang", [b"idle-spare"])
        bidi = c.start_call(P + "BidiEcho", end=False)
        stalled = c.start_call(P + "Sum", [b"a"], end=False)
        for i in range(8):           # 0.8 s: four timeouts' worth
            c.conn.send_data(bidi, grpc_message(b"m%d" % i))
            c.flush()
            c.wait(lambda: False, 0.1)
        assert c.streams[stalled].grpc_status == CANCELLED
        assert c.streams[stalled].reset == E_CANCEL
        assert not c.streams[hang].done and not c.streams[bidi].done
        c.conn.end_stream(bidi)
        c.flush()
        srv.release(b"idle-spare")
        assert c.wait(lambda: c.streams[hang].done and c.streams[bidi].done, 3)
        assert c.streams[hang].grpc_status == OK
        assert c.streams[bidi].grpc_status == OK and len(c.streams[bidi].messages) == 8
        assert srv.wait_for(lambda: _streams_freed(srv), 3)
    finally:
        c.close()


def test_idle_timeout_zero_disables(server_factory):
    srv = server_factory(config=TransportConfig(stream_idle_timeout_ms=0))
    assert srv.server.idle_streams is None
    c = RawH2Client(srv.port)
    try:
        stalled = c.start_call(P + "Sum", [b"a"], end=False)
        assert not c.wait(lambda: c.streams[stalled].done, 0.5)
        c.conn.end_stream(stalled)
        c.flush()
        assert c.wait(lambda: c.streams[stalled].done, 3)
        assert c.streams[stalled].grpc_status == OK
    finally:
        c.close()


# -- the config key ----------------------------------------------------------------------

def test_stream_idle_timeout_config_key(tmp_path):
    path = tmp_path / "b.yml"
    path.write_text("grpc: {stream_idle_timeout_ms: 1500}\n")
    cfg = load_config(path)
    cfg.validate()
    assert cfg.grpc_stream_idle_timeout_ms == 1500
    path.write_text("grpc: {}\n")
    assert load_config(path).grpc_stream_idle_timeout_ms == 30000   # the default
    assert TransportConfig().stream_idle_timeout_ms == 30000
    path.write_text("grpc: {stream_idle_timeout_ms: -1}\n")
    with pytest.raises(ConfigError, match="stream_idle_timeout_ms"):
        load_config(path).validate()
    path.write_text("grpc: {stream_idle_timeout: 1500}\n")
    with pytest.raises(ConfigError, match="did you mean 'stream_idle_timeout_ms'"):
        load_config(path)
