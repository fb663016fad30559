"""Connection-level limits against hostile HTTP/2 clients (issue 17), each attack driven with
hand-made frames against a real broker process. Every test checks that the broker's memory
stays bounded, that the attacking connection gets the documented GOAWAY or close, and that a
well-behaved client (grpcio HealthCheck) is served meanwhile."""

import os
import socket
import threading
import time

import grpc
import hpack
import pytest

from danube.proto import DanubeApi_pb2 as pb
from broker_process import BrokerProcess
from rpc_fixtures import FrameStream, PREFACE, goaways, h2_frame, read_frames, request_headers
from waiting import wait_for

DATA, HEADERS, RST_STREAM, SETTINGS, PING, CONTINUATION = 0, 1, 3, 4, 6, 9
END_STREAM, END_HEADERS = 0x1, 0x4
E_NO_ERROR, E_CANCEL, E_ENHANCE_YOUR_CALM = 0, 8, 11
HEALTH = "/danube.HealthCheck/HealthCheck"
MiB = 1024 * 1024


def start_broker(tmp_path, grpc_limits=None, extra=""):
    cfg = tmp_path / "broker.yml"
    lines = [extra]
    if grpc_limits:
        lines.append("grpc:")
        lines += [f"  {k}: {v}" for k, v in grpc_limits.items()]
    cfg.write_text("\n".join(lines) + "\n")
    return BrokerProcess("--config-file", str(cfg), data_dir=tmp_path / "data").start()


@pytest.fixture
def broker_factory(tmp_path):
    started = []

    def make(grpc_limits=None, extra=""):
        b = start_broker(tmp_path, grpc_limits, extra)
        started.append(b)
        return b
    yield make
    for b in started:
        b.stop()


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Health:
    """A grpcio channel kept open, timing HealthCheck calls."""

    def __init__(self, addr):
        self.channel = grpc.insecure_channel(addr)
        self.call = self.channel.unary_unary(
            HEALTH, request_serializer=pb.HealthCheckRequest.SerializeToString,
            response_deserializer=pb.HealthCheckResponse.FromString)

    def check(self, timeout=2.0):
        """Seconds one HealthCheck took; fails the test past `timeout`."""
        start = time.monotonic()
        resp = self.call(pb.HealthCheckRequest(request_id=1, id=1), timeout=timeout)
        assert resp.status == pb.HealthCheckResponse.CLOSE
        return time.monotonic() - start

    def close(self):
        self.channel.close()


class Watcher:
    """Samples the broker's RSS and HealthCheck latency in a thread while an attack runs."""

    # HealthCheck's deadline during an attack: a broker the attack stalls answers late or
    # not at all; 10 s leaves a slow machine's normal latency room.
    def __init__(self, broker, health, timeout=10.0):
        self.pid = broker.pid
        self.health = health
        self.timeout = timeout
        self.peak = rss_mib(self.pid)
        self.worst = 0.0
        self.failures = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            try:
                self.worst = max(self.worst, self.health.check(self.timeout))
            except grpc.RpcError as exc:
                self.failures.append(exc.code())
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        self.peak = max(self.peak, rss_mib(self.pid))


def connect(port, settings=b""):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(PREFACE + h2_frame(SETTINGS, 0, 0, settings))
    return sock


def indexed_block(port, extra=()):
    """A request header block for HealthCheck that, sent after `first`, is all indexed
    fields, so the same bytes open any number of streams."""
    enc = hpack.Encoder()
    first = enc.encode(request_headers(HEALTH, port, extra))
    return first, enc.encode(request_headers(HEALTH, port, extra))


def grpc_statuses(frames):
    """The grpc-status of every response header block in `frames`, in order."""
    dec = hpack.Decoder()
    out = []
    for f in frames:
        if type(f).__name__ == "HeadersFrame":
            out += [v for k, v in dec.decode(f.data) if k == "grpc-status"]
    return out


def sync(sock, fs, opaque=b"syncsync", timeout=10.0):
    """Wait until the broker has handled everything sent so far (its ACK of our PING)."""
    sock.sendall(h2_frame(PING, 0, 0, opaque))
    assert fs.wait(lambda frames: any(getattr(f, "opaque_data", None) == opaque
                                      and "ACK" in f.flags for f in frames), timeout)


def read_until_close(sock, fs=None, timeout=30.0):
    """(frames, eof) read until the broker closes the connection or `timeout`: generous, since
    a close ends the read at once and a loaded machine may take seconds to get there."""
    if fs is None:
        return read_frames(sock, timeout)
    fs.wait(lambda frames: False, timeout)
    return fs.frames, fs.eof


def assert_goaway_close(frames, eof, code):
    ga = goaways(frames)
    assert ga, "no GOAWAY"
    assert ga[-1].error_code == code, (ga[-1].error_code, ga[-1].additional_data)
    assert eof, "broker did not close the connection after GOAWAY"
    return ga[-1]


def expect_goaway_close(sock, code, fs=None, timeout=30.0):
    return assert_goaway_close(*read_until_close(sock, fs, timeout), code)


def test_settings_flood_over_many_streams(broker_factory):
    """Finding 1: 16,000 open streams, then SETTINGS frames flipping INITIAL_WINDOW_SIZE.
    Each SETTINGS used to walk every stream (seconds of stall for the whole broker); now
    the window change is applied lazily and the flood gets GOAWAY ENHANCE_YOUR_CALM."""
    broker = broker_factory()
    health = Health(broker.client_addr)
    health.check(5)
    base = rss_mib(broker.pid)
    sock = connect(broker.client_port)
    fs = FrameStream(sock)
    try:
        first, again = indexed_block(broker.client_port)
        opens = [h2_frame(HEADERS, END_HEADERS, 1, first)]
        opens += [h2_frame(HEADERS, END_HEADERS, sid, again) for sid in range(3, 32001, 2)]
        sock.sendall(b"".join(opens))
        sync(sock, fs)
        flips = b"".join(h2_frame(SETTINGS, 0, 0, (4).to_bytes(2, "big")
                                  + (65535 + i % 2).to_bytes(4, "big")) for i in range(5000))
        with Watcher(broker, health) as w:
            sock.sendall(flips)
            closed = read_until_close(sock, fs)
            time.sleep(0.3)
        assert not w.failures, f"HealthCheck failed during the flood: {w.failures}"
        assert w.worst < 5.0
        assert w.peak - base < 96, f"RSS grew {w.peak - base:.0f} MiB"
        assert_goaway_close(*closed, E_ENHANCE_YOUR_CALM)
        assert broker.wait_for_log(r"WARNING.*SETTINGS frames per second")
    finally:
        sock.close()
        health.close()


FLOOD_CAP = 64 * MiB


def test_ping_flood_from_peer_that_never_reads(broker_factory):
    """Finding 2: PINGs from a peer that never reads its ACKs. The broker stops reading from
    a connection whose write buffer is over its high-water mark, so the peer's own sends
    stall and the ACK queue stays near the 4 MiB mark instead of growing with the flood."""
    broker = broker_factory()
    health = Health(broker.client_addr)
    health.check(5)
    base = rss_mib(broker.pid)
    sock = socket.socket()
    sock.connect(("127.0.0.1", broker.client_port))
    sock.sendall(PREFACE + h2_frame(SETTINGS, 0, 0, b""))
    sock.setblocking(False)
    chunk = h2_frame(PING, 0, 0, b"pingping") * 60000             # ~1 MiB of PINGs
    sent = 0
    last_progress = time.monotonic()
    try:
        with Watcher(broker, health) as w:
            # Bounded by bytes, not seconds: a loaded machine drains the flood slowly for a
            # while, and only a broker that never stops reading gets past FLOOD_CAP.
            end = time.monotonic() + 120
            while time.monotonic() < end and time.monotonic() - last_progress < 1.5 \
                    and sent < FLOOD_CAP:
                try:
                    # Whole frames only: resume a partial send where it stopped.
                    n = sock.send(chunk[sent % len(chunk):])
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                sent += n
                last_progress = time.monotonic()
        stalled = time.monotonic() - last_progress >= 1.5
        print(f"sent {sent / MiB:.0f} MiB, RSS +{w.peak - base:.0f} MiB, stalled {stalled}")
        assert stalled, f"broker kept reading: {sent / MiB:.0f} MiB of PINGs accepted"
        assert not w.failures, f"HealthCheck failed during the flood: {w.failures}"
        assert w.peak - base < 48, f"RSS grew {w.peak - base:.0f} MiB ({sent / MiB:.0f} MiB sent)"
    finally:
        sock.close()
        health.close()


def test_endless_empty_continuations(broker_factory):
    """Finding 3: a HEADERS without END_HEADERS followed by empty CONTINUATION frames used to
    be buffered forever; the header block is now capped (bytes and frames) with GOAWAY."""
    broker = broker_factory()
    health = Health(broker.client_addr)
    health.check(5)
    base = rss_mib(broker.pid)
    sock = connect(broker.client_port)
    try:
        first, _ = indexed_block(broker.client_port)
        flood = h2_frame(HEADERS, 0, 1, first[:10]) + h2_frame(CONTINUATION, 0, 1, b"") * 100000
        with Watcher(broker, health) as w:
            try:
                sock.sendall(flood)
            except (BrokenPipeError, ConnectionResetError):
                pass
            closed = read_until_close(sock)
        assert not w.failures
        assert w.peak - base < 32
        assert_goaway_close(*closed, E_ENHANCE_YOUR_CALM)
    finally:
        sock.close()
    # A block in a few CONTINUATION frames, as a well-behaved peer may send, still works.
    sock = connect(broker.client_port)
    fs = FrameStream(sock)
    try:
        first, _ = indexed_block(broker.client_port)
        frames = h2_frame(HEADERS, END_STREAM, 1, first[:5])
        frames += h2_frame(CONTINUATION, 0, 1, first[5:10])
        frames += h2_frame(CONTINUATION, END_HEADERS, 1, first[10:])
        sock.sendall(frames)
        assert fs.wait(lambda frames: fs.stream_ended(1), 5)
        assert not goaways(fs.frames)
    finally:
        sock.close()
    assert broker.wait_for_log(r"WARNING.*CONTINUATION frames")
    health.close()


def test_unfinished_messages_capped_per_connection(broker_factory):
    """Finding 4: 20 streams each announcing a ~1 MB request and sending 900 kB of it. With a
    4 MiB cap on incomplete requests per connection, the streams past it are reset with
    ENHANCE_YOUR_CALM and their data dropped on arrival."""
    broker = broker_factory({"max_message_size": 1048576,
                             "max_connection_buffered_bytes": 4 * MiB},
                            extra="policies:\n  max_message_size: 262144")
    health = Health(broker.client_addr)
    health.check(5)
    base = rss_mib(broker.pid)
    sock = connect(broker.client_port)
    fs = FrameStream(sock)
    try:
        first, again = indexed_block(broker.client_port)
        announced, body = 1_000_000, 900_000
        prefix = b"\x00" + announced.to_bytes(4, "big")
        payload = prefix + b"x" * (body - 5)
        sids = list(range(1, 41, 2))
        with Watcher(broker, health) as w:
            for i, sid in enumerate(sids):
                out = [h2_frame(HEADERS, END_HEADERS, sid, first if i == 0 else again)]
                out += [h2_frame(DATA, 0, sid, payload[p:p + 16384])
                        for p in range(0, len(payload), 16384)]
                sock.sendall(b"".join(out))
            sync(sock, fs)
        resets = {f.stream_id: f.error_code for f in fs.frames
                  if type(f).__name__ == "RstStreamFrame"}
        refused = [sid for sid, code in resets.items() if code == E_ENHANCE_YOUR_CALM]
        # 4 MiB holds four 1 MB reservations; every stream after them is refused.
        assert not w.failures
        assert w.peak - base < 12, f"RSS grew {w.peak - base:.0f} MiB"
        assert len(refused) >= 15, resets
        assert not goaways(fs.frames)
        assert broker.wait_for_log(r"WARNING.*max_connection_buffered_bytes")
    finally:
        sock.close()
        health.close()


def test_rapid_reset(broker_factory):
    """Finding 5 (CVE-2023-44487): streams opened and reset at once. Past
    grpc.max_resets_per_second the connection gets GOAWAY ENHANCE_YOUR_CALM."""
    broker = broker_factory({"max_resets_per_second": 100})
    health = Health(broker.client_addr)
    health.check(5)
    base = rss_mib(broker.pid)
    sock = connect(broker.client_port)
    try:
        first, again = indexed_block(broker.client_port)
        rst = (E_CANCEL).to_bytes(4, "big")
        out = []
        for sid in range(1, 40001, 2):
            out.append(h2_frame(HEADERS, END_HEADERS | END_STREAM, sid,
                                first if sid == 1 else again))
            out.append(h2_frame(RST_STREAM, 0, sid, rst))
        with Watcher(broker, health) as w:
            try:
                sock.sendall(b"".join(out))
            except (BrokenPipeError, ConnectionResetError):
                pass
            closed = read_until_close(sock)
        assert not w.failures, f"HealthCheck failed during the attack: {w.failures}"
        assert w.peak - base < 48, f"RSS grew {w.peak - base:.0f} MiB"
        assert_goaway_close(*closed, E_ENHANCE_YOUR_CALM)
        assert broker.wait_for_log(r"WARNING.*streams reset or expired on arrival per second")
    finally:
        sock.close()
        health.close()


def test_expired_on_arrival_flood(broker_factory):
    """Finding 5's flood: calls whose grpc-timeout has passed when they arrive are answered
    (DEADLINE_EXCEEDED, no handler) and count against grpc.max_resets_per_second, as a reset
    stream does; past it the connection gets GOAWAY ENHANCE_YOUR_CALM while another client is
    served."""
    broker = broker_factory({"max_resets_per_second": 100})
    health = Health(broker.client_addr)
    health.check(5)
    base = rss_mib(broker.pid)
    sock = connect(broker.client_port)
    try:
        first, again = indexed_block(broker.client_port, [(b"grpc-timeout", b"1n")])
        out = []
        for sid in range(1, 40001, 2):
            out.append(h2_frame(HEADERS, END_HEADERS, sid, first if sid == 1 else again))
            out.append(h2_frame(DATA, END_STREAM, sid, b"\0\0\0\0\0"))
        with Watcher(broker, health) as w:
            try:
                sock.sendall(b"".join(out))
            except (BrokenPipeError, ConnectionResetError):
                pass
            closed = read_until_close(sock)
        assert not w.failures, f"HealthCheck failed during the attack: {w.failures}"
        assert w.peak - base < 48, f"RSS grew {w.peak - base:.0f} MiB"
        assert_goaway_close(*closed, E_ENHANCE_YOUR_CALM)
        # The calls inside the budget were answered before the GOAWAY, not dropped.
        statuses = grpc_statuses(closed[0])
        assert 100 <= len(statuses) < 20000 and set(statuses) == {"4"}, statuses[:5]
        assert broker.wait_for_log(r"WARNING.*streams reset or expired on arrival per second")
    finally:
        sock.close()
        health.close()


def test_handshake_timeout_and_connection_limit(broker_factory):
    """Finding 6: connections that never send the preface are closed after
    grpc.handshake_timeout_ms; past grpc.max_connections new ones are closed at once, with
    one warning for many refusals."""
    broker = broker_factory({"handshake_timeout_ms": 1000, "max_connections": 8})
    health = Health(broker.client_addr)
    health.check(5)                       # one of the 8

    def sockets():
        fds = f"/proc/{broker.pid}/fd"
        return sum(os.readlink(f"{fds}/{fd}").startswith("socket:") for fd in os.listdir(fds))
    before = sockets()
    bare = [socket.create_connection(("127.0.0.1", broker.client_port)) for _ in range(7)]
    try:
        # The broker has accepted all seven (each is a socket of its own) before the limit
        # is tried.
        wait_for(lambda: sockets() >= before + 7, what="the broker to accept the 7 connections")
        for _ in range(5):
            extra = socket.create_connection(("127.0.0.1", broker.client_port), timeout=2)
            try:
                assert extra.recv(1) == b"", "connection past the limit was served"
            except ConnectionResetError:
                pass
            extra.close()
        health.check(1.0)                 # the open channel is served meanwhile
        for s in bare:                    # closed for want of a preface
            s.settimeout(3)
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        assert broker.wait_for_log("refusing new connections")     # read by a thread: may lag
        assert sum("refusing new connections" in line for line in list(broker.lines)) == 1
        assert broker.wait_for_log(r"WARNING.*no HTTP/2 client preface within 1000 ms")
        # The slots are free again.
        fresh = Health(broker.client_addr)
        fresh.check(2.0)
        fresh.close()
    finally:
        for s in bare:
            s.close()
        health.close()


def test_idle_timeout(broker_factory):
    """Finding 6: a connection with no stream is closed with GOAWAY NO_ERROR after
    grpc.idle_timeout_ms, even if it sends keepalive PINGs (which are answered); a grpcio
    channel whose connection was closed for idleness reconnects on its next call."""
    broker = broker_factory({"idle_timeout_ms": 1000})
    health = Health(broker.client_addr)
    health.check(5)
    quiet = connect(broker.client_port)
    pinger = connect(broker.client_port)
    fs = FrameStream(pinger)
    try:
        start = time.monotonic()
        while time.monotonic() - start < 2.5 and not fs.eof:
            pinger.sendall(h2_frame(PING, 0, 0, b"keepaliv"))
            fs.wait(lambda frames: False, 0.2)
        acks = [f for f in fs.frames if getattr(f, "opaque_data", None) == b"keepaliv"]
        assert acks, "keepalive PINGs were not answered"
        assert fs.eof and goaways(fs.frames)[-1].error_code == E_NO_ERROR
        expect_goaway_close(quiet, E_NO_ERROR, timeout=1.0)
        health.check(30.0)                # still served (a deadline, not a speed check)
    finally:
        quiet.close()
        pinger.close()
        health.close()


def test_limit_keys_are_validated_and_reach_the_transport(tmp_path):
    from danube.process.app import Broker
    from danube.config import ConfigError, load_config

    path = tmp_path / "b.yml"
    for bad in ("max_resets_per_second: 0", "idle_timeout_ms: -5", "max_connections: 1.5",
                "max_connection_buffered_bytes: 1024", "max_header_list_size: 100"):
        path.write_text(f"grpc:\n  {bad}\n")
        with pytest.raises(ConfigError, match="grpc."):
            load_config(str(path)).validate()
    path.write_text("grpc:\n  max_resets_per_second: 7\n  handshake_timeout_ms: 1234\n"
                    "  max_connections: 99\n  max_header_list_size: 32768\n")
    cfg = load_config(str(path)).validate()
    transport = Broker(cfg).client_server.config
    assert (transport.max_resets_per_second, transport.handshake_timeout_ms,
            transport.max_connections, transport.max_header_list_size) == (7, 1234, 99, 32768)
    # Derived: room for four of the largest messages.
    assert transport.max_connection_buffered_bytes == 4 * cfg.grpc_max_message_size
    assert transport.idle_timeout_ms == 300_000 and transport.max_settings_per_second == 50
