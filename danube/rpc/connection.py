"""HTTP/2 connection machinery shared by the gRPC server and client: settings, PING, GOAWAY,
connection-level flow control in both directions, header-block assembly and batched socket
writes. A stream's own flow control is in `stream.py`, the limits in `config.py`.

Per-frame parsing and serialisation are in the Cython codec (`danube.codec`); this module
decides what frames mean. Every per-stream structure is a dict entry or a slot on the stream
object, so no operation walks the open streams: a change of SETTINGS_INITIAL_WINDOW_SIZE is
applied lazily (each stream's window is kept against the initial window it last saw) and
only streams waiting for their own window are woken by it.

Limits against hostile peers (issue 17) live here and in ServerConnection: a header block
is capped in bytes and CONTINUATION frames, SETTINGS frames and client resets of unfinished
streams are rate-limited per connection (token buckets), incomplete request messages are
capped per connection, and a server stops reading from a peer that does not read what it
is sent (control-frame ACKs included), so nothing a peer sends grows memory without bound.

Over 500 lines, one class: H2Connection is the connection's state machine (as h2's
connection.py is), every frame handler reads and changes the same state, and spreading the
handlers over mixins in other modules would split that state without making any part simpler.
"""

import asyncio
import collections
import logging
import socket
import time

import hpack

from danube.codec import http2
from danube.codec.http2 import (FrameReader, H2ConnectionError, goaway_frame, header_frames,
                                parse_settings, parse_u32, ping_frame, rst_stream_frame,
                                settings_frame, window_update_frame)
# MAX_GRPC_MESSAGE, TransportConfig and StreamBase are re-exported: this was their home.
from danube.rpc.config import MAX_GRPC_MESSAGE, TokenBucket, TransportConfig
from danube.rpc.headers import HeaderDecoder
from danube.rpc.stream import StreamBase

log = logging.getLogger("danube.rpc")

S_HEADER_TABLE_SIZE = 0x1
S_ENABLE_PUSH = 0x2
S_MAX_CONCURRENT_STREAMS = 0x3
S_INITIAL_WINDOW_SIZE = 0x4
S_MAX_FRAME_SIZE = 0x5
S_MAX_HEADER_LIST_SIZE = 0x6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
# Frames a server handles per connection per event-loop turn (see _handle_frames): a few
# calls' worth, so that one peer's burst does not keep the other connections waiting; the
# rest waits in a backlog, and past BACKLOG_PAUSE frames the peer is not read from until
# the backlog is worked off (the socket buffer holds the rest, not our memory).
FRAMES_PER_TURN = 16
BACKLOG_PAUSE = 256
#: CONTINUATION frames one header block may take. A well-behaved peer needs
#: max_header_list_size / max_frame_size of them (4 at the defaults); empty or tiny ones cost
#: us a frame each and carry nothing.
MAX_CONTINUATIONS = 32


# How long a connection closed for an error keeps dropping the peer's input before it is
# aborted (the peer has the GOAWAY and the FIN by then).
LINGER_SECONDS = 2.0


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection. Subclasses create streams (`new_stream_from_headers`) and react to
    GOAWAY; everything else about the connection is handled here."""

    is_client = False

    head_parser = list

    # Slots, not a __dict__: a broker holds one of these per client connection, idle ones
    # by the ten thousand (bench/scale/connections.py), and a dict of this many attributes
    # costs ~1 KB more each.
    __slots__ = ("config", "loop", "transport", "reader", "decoder", "streams", "blocked",
                 "window_blocked", "buffered", "reading_paused", "_backlog", "_backlog_paused",
                 "abuse_logged", "lost", "received_at", "_settings_budget", "_reset_budget",
                 "drain_waiters", "peer_max_frame", "peer_initial_window", "peer_max_streams",
                 "send_window", "recv_unacked", "recv_window", "write_paused", "closed",
                 "_lingering", "goaway_sent", "goaway_received", "last_peer_stream", "_out",
                 "_out_bytes", "_out_pieces", "_flush_scheduled", "_in_receive",
                 "_header_block", "_ping_waiters", "peername")

    def __init__(self, config: TransportConfig, loop=None):
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        self.transport = None
        self.reader = FrameReader(config.max_frame_size, not self.is_client)
        self.decoder = HeaderDecoder(config.max_header_list_size, self.head_parser)
        self.streams = {}
        self.blocked = {}                 # sid -> stream waiting for the connection window
        self.window_blocked = {}          # sid -> stream waiting for its own window
        self.buffered = 0                 # incomplete request bytes held (ServerConnection)
        self.reading_paused = False
        self._backlog = None         # frames read but left for the next turn (server side)
        self._backlog_paused = False      # reading paused until the backlog is worked off
        self.abuse_logged = False
        self.lost = False
        now = self.loop.time()
        self.received_at = time.monotonic()
        self._settings_budget = TokenBucket(config.max_settings_per_second, now)
        self._reset_budget = TokenBucket(config.max_resets_per_second, now)
        self.drain_waiters = set()
        self.peer_max_frame = 16384
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_streams = 2**31 - 1
        self.send_window = DEFAULT_WINDOW
        self.recv_unacked = 0
        self.recv_window = DEFAULT_WINDOW
        self.write_paused = False
        self.closed = False
        # After a connection error: GOAWAY sent, writing shut down, the peer's input dropped
        # until it closes (see _linger_close).
        self._lingering = False
        self.goaway_sent = False
        self.goaway_received = None       # last_stream_id from the peer's GOAWAY
        self.last_peer_stream = 0
        self._out = []
        self._out_bytes = 0
        self._out_pieces = False          # _out holds memoryviews: writelines, no join
        self._flush_scheduled = False
        self._in_receive = False
        self._header_block = None         # [sid, flags, [fragments]] while CONTINUATIONs are due
        # A deque once ping() is first called: an empty deque costs ~700 bytes, and most
        # connections (every server-side one) never send a PING.
        self._ping_waiters = ()
        self.peername = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        self.peername = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass
        transport.set_write_buffer_limits(self.config.write_buffer_high,
                                          self.config.write_buffer_low)
        c = self.config
        if self.is_client:
            self.write(http2.CLIENT_PREFACE)
        settings = [(S_MAX_CONCURRENT_STREAMS, c.max_concurrent_streams),
                    (S_INITIAL_WINDOW_SIZE, c.stream_window),
                    (S_MAX_FRAME_SIZE, c.max_frame_size),
                    (S_MAX_HEADER_LIST_SIZE, c.max_header_list_size)]
        if self.is_client:
            settings.append((S_ENABLE_PUSH, 0))
        self.write(settings_frame(settings))
        if c.connection_window > DEFAULT_WINDOW:
            self.write(window_update_frame(0, c.connection_window - DEFAULT_WINDOW))
            self.recv_window = c.connection_window
        self.flush()

    def take_input(self, data):
        if self._lingering:
            return
        self._receiving(self._take_input, data)

    # A ServerConnection's own instance attribute replaces it (its lone-call path first).
    data_received = take_input

    def _take_input(self, data):
        frames = self.reader.feed(data)
        if self._backlog:
            self._backlog.extend(frames)
            self._bound_backlog()
        else:
            self._handle_frames(frames)

    def _receiving(self, handle, arg):
        """Run ``handle(arg)`` on input: output is written once at the end, and an error
        costs this connection (GOAWAY), never the server."""
        self._in_receive = True
        self.received_at = time.monotonic()     # when this input was read (deadlines)
        try:
            handle(arg)
        except H2ConnectionError as exc:
            self.protocol_error(exc.code, str(exc))
        except Exception:  # noqa: BLE001 - a bug here must cost one connection, not the server
            log.exception("internal error handling input from %s", self.peername)
            self.protocol_error(http2.E_INTERNAL_ERROR, "internal error")
        finally:
            self._in_receive = False
            self.flush()

    def _handle_frames(self, frames):
        """Handle ``frames``; a server handles at most FRAMES_PER_TURN of them per event-loop
        turn and keeps the rest for the next turn, not reading from this peer meanwhile. One
        socket read can hold thousands of small frames (each a call to start or answer), and
        handling them all at once would keep every other connection waiting for as long:
        per turn, each connection gets its share instead."""
        budget = len(frames) if self.is_client else FRAMES_PER_TURN
        try:
            for ftype, flags, sid, payload, flow_len in (
                    frames if len(frames) <= budget else frames[:budget]):
                if self._header_block is not None and ftype != http2.CONTINUATION:
                    raise H2ConnectionError(http2.E_PROTOCOL_ERROR,
                                            "expected CONTINUATION frame")
                if ftype == http2.DATA:
                    self._on_data(flags, sid, payload, flow_len)
                elif ftype == http2.HEADERS:
                    self._on_headers_frame(flags, sid, payload)
                elif ftype == http2.CONTINUATION:
                    self._on_continuation(flags, sid, payload)
                elif ftype == http2.WINDOW_UPDATE:
                    self._on_window_update(sid, parse_u32(payload) & 0x7FFFFFFF)
                elif ftype == http2.SETTINGS:
                    if not flags & http2.FLAG_ACK:
                        self._on_settings(payload)
                elif ftype == http2.PING:
                    self._on_ping(flags, payload)
                elif ftype == http2.RST_STREAM:
                    self._on_rst_stream(sid, parse_u32(payload))
                elif ftype == http2.GOAWAY:
                    self._on_goaway(parse_u32(payload) & 0x7FFFFFFF, parse_u32(payload, 4),
                                    payload[8:])
                elif ftype == http2.PUSH_PROMISE:
                    raise H2ConnectionError(http2.E_PROTOCOL_ERROR, "PUSH_PROMISE not allowed")
            if self.recv_unacked >= self.recv_window // 4:
                self.write(window_update_frame(0, self.recv_unacked))
                self.recv_unacked = 0
        except hpack.HPACKError as exc:
            raise H2ConnectionError(http2.E_COMPRESSION_ERROR, f"HPACK: {exc}") from None
        if len(frames) > budget and not self.closed:
            self._backlog = frames[budget:]
            self._bound_backlog()
            self.loop.call_soon(self._handle_backlog)

    def _bound_backlog(self):
        if (len(self._backlog) > BACKLOG_PAUSE and not self._backlog_paused
                and self.transport is not None and not self.transport.is_closing()):
            self._backlog_paused = True
            self.transport.pause_reading()

    def _handle_backlog(self):
        frames, self._backlog = self._backlog, None
        if not frames or self.closed:
            return
        self._receiving(self._handle_frames, frames)
        if (self._backlog_paused and not self._backlog and not self.reading_paused
                and not self.closed and self.transport is not None):
            self._backlog_paused = False
            self.transport.resume_reading()

    def pause_writing(self):
        self.write_paused = True
        if not self.is_client and self.transport is not None:
            # A peer that does not read what we send must not make us queue more: every
            # frame it sends may cost output (PING and SETTINGS ACKs, responses, RST_STREAMs),
            # so stop reading from it until the socket drains below the low-water mark. The
            # output queued per connection stays near write_buffer_high; memory stays
            # bounded whatever the peer sends. (A client must read while it writes anyway,
            # to see WINDOW_UPDATEs; grpcio, h2load and our client all do.) Not on the
            # client side: two endpoints that both stopped reading could deadlock.
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self):
        self.write_paused = False
        if self.reading_paused:
            self.reading_paused = False
            if not self.closed and self.transport is not None and not self._backlog_paused:
                self.transport.resume_reading()
        waiters, self.drain_waiters = self.drain_waiters, set()
        for stream in waiters:
            if stream.pending is None:
                stream._wake_drain()

    def connection_lost(self, exc):
        self.closed = True
        self.lost = True
        streams = list(self.streams.values())
        self.streams.clear()
        self.blocked.clear()
        self.window_blocked.clear()
        self.buffered = 0
        for stream in streams:
            stream.on_connection_lost(exc)
            stream._wake_drain()
        waiters, self._ping_waiters = self._ping_waiters, ()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection lost"))

    # -- output --------------------------------------------------------------------------

    def write(self, data):
        """Queue bytes; they go out in one socket write per event-loop turn."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= 262144:
            # A writer that never yields (a tight batch loop) must still reach the socket,
            # which is also what lets pause_writing() apply backpressure to it.
            self.flush()
            return
        if not self._flush_scheduled and not self._in_receive:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def write_many(self, pieces, nbytes):
        """Queue buffers (memoryviews of large messages among them) to go out without being
        joined first."""
        self._out.extend(pieces)
        self._out_bytes += nbytes
        self._out_pieces = True
        if self._out_bytes >= 262144:
            self.flush()
            return
        if not self._flush_scheduled and not self._in_receive:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self):
        self._flush_scheduled = False
        out = self._out
        if not out or self.transport is None:
            return
        if self._lingering:             # writing is shut down: nothing more can go out
            self._out = []
            self._out_bytes = 0
            return
        self._out = []
        self._out_bytes = 0
        pieces, self._out_pieces = self._out_pieces, False
        if self.transport.is_closing():
            return
        if len(out) == 1:
            self.transport.write(out[0])
        elif pieces:
            self.transport.writelines(out)
        else:
            self.transport.write(b"".join(out))

    def protocol_error(self, code, message):
        """A connection error: GOAWAY with `code`, then close. Other connections are unaffected."""
        if code == http2.E_ENHANCE_YOUR_CALM:
            self.abuse(code, message)
            return
        log.info("closing HTTP/2 connection from %s: %s", self.peername, message)
        self.write(goaway_frame(self.last_peer_stream, code, message.encode()[:256]))
        self.flush()
        self.closed = True
        self._linger_close()

    def abuse(self, code, reason):
        """A connection error for abuse (a flood, a limit exceeded): logged at warning once
        per connection with the peer's address, then GOAWAY with `code` and close."""
        if self.closed:
            return
        self.note_abuse(reason)
        self.write(goaway_frame(self.last_peer_stream, code, reason.encode()[:256]))
        self.flush()
        self.closed = True
        self.hard_close()

    def hard_close(self):
        """Close now if the peer is not reading (the GOAWAY could never reach it and close()
        would wait for the write buffer to drain forever), else after the buffer drains or
        within 5 s at most."""
        transport = self.transport
        if transport is None:
            return
        if self.write_paused:
            transport.abort()
            return
        self._linger_close()

    def _linger_close(self):
        """Close once the GOAWAY can reach the peer. A socket closed while the peer's input
        is still unread answers with a reset, which drops what is still queued to send (the
        GOAWAY, so the peer never learns why). So: shut down writing (FIN after the GOAWAY),
        drop the peer's input until it closes, and abort after LINGER_SECONDS at most."""
        transport = self.transport
        if transport is None:
            return
        if transport.is_closing() or not transport.can_write_eof():     # TLS: plain close
            transport.close()
        else:
            self._lingering = True
            transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self._abort_if_open)

    def _abort_if_open(self):
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def note_abuse(self, reason):
        if not self.abuse_logged:
            self.abuse_logged = True
            log.warning("HTTP/2 peer %s: %s", self.peername, reason)

    def close(self):
        self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def ping(self, timeout=None):
        """Send PING and wait for the ACK; returns the round-trip time in seconds."""
        waiter = self.loop.create_future()
        if not self._ping_waiters:
            self._ping_waiters = collections.deque()
        self._ping_waiters.append(waiter)
        start = self.loop.time()
        self.write(ping_frame(start.hex().encode()[:8].ljust(8, b"0")))
        await asyncio.wait_for(waiter, timeout)
        return self.loop.time() - start

    # -- incoming frames -----------------------------------------------------------------

    def _on_data(self, flags, sid, payload, flow_len):
        if flow_len > self.recv_window - self.recv_unacked:
            raise H2ConnectionError(http2.E_FLOW_CONTROL_ERROR, "connection window exceeded")
        # Data on any stream, even a dead one, uses the connection window: credit it here.
        self.recv_unacked += flow_len
        stream = self.streams.get(sid)
        if stream is None:
            self._check_closed_stream(sid, "DATA")
            return
        if stream.closed_remote:
            self._reset_stream(stream, http2.E_STREAM_CLOSED)
            return
        pad = flow_len - len(payload)
        if pad:
            stream.credit(pad)
        self.stream_data(stream, payload, bool(flags & http2.FLAG_END_STREAM))

    def stream_data(self, stream, payload, end_stream):
        """Hand DATA to a stream; ServerConnection counts what its streams buffer."""
        stream.on_data(payload, end_stream)

    def _check_closed_stream(self, sid, what):
        if self._is_idle_stream(sid):
            raise H2ConnectionError(http2.E_PROTOCOL_ERROR, f"{what} on idle stream {sid}")
        # Frames after we reset a stream may still be in flight; the RFC lets us drop them.

    def _is_idle_stream(self, sid):
        raise NotImplementedError

    def _on_headers_frame(self, flags, sid, payload):
        if flags & http2.FLAG_END_HEADERS:
            self._on_header_block(sid, flags, payload)
        else:
            # [sid, flags, fragments, bytes, CONTINUATION frames]
            self._header_block = [sid, flags, [payload], len(payload), 0]

    def _on_continuation(self, flags, sid, payload):
        block = self._header_block
        if block is None or block[0] != sid:
            raise H2ConnectionError(http2.E_PROTOCOL_ERROR, "unexpected CONTINUATION frame")
        # A header block is capped as a whole (its compressed size cannot usefully exceed
        # the list size we advertise) and in frames, so neither big nor empty CONTINUATIONs
        # grow memory. A connection error, not a 431-style stream error: the block would
        # have to be received whole and decoded to keep HPACK state, which is the cost the
        # cap avoids.
        block[4] += 1
        if block[4] > MAX_CONTINUATIONS:
            raise H2ConnectionError(http2.E_ENHANCE_YOUR_CALM,
                                    f"header block in more than {MAX_CONTINUATIONS} "
                                    f"CONTINUATION frames")
        if payload:
            block[2].append(payload)
            block[3] += len(payload)
        if block[3] > self.config.max_header_list_size:
            raise H2ConnectionError(http2.E_ENHANCE_YOUR_CALM,
                                    f"header block over {self.config.max_header_list_size} "
                                    f"bytes")
        if flags & http2.FLAG_END_HEADERS:
            self._header_block = None
            self._on_header_block(sid, block[1], b"".join(block[2]))

    def _on_header_block(self, sid, flags, block):
        # `head` is whatever the subclass's head_parser made of the fields; the decoder
        # caches it, so a repeated block is parsed once.
        head = self.decoder.decode(block)
        end_stream = bool(flags & http2.FLAG_END_STREAM)
        stream = self.streams.get(sid)
        if stream is None:
            self.new_stream_from_headers(sid, head, end_stream)
        elif stream.closed_remote:
            self._reset_stream(stream, http2.E_STREAM_CLOSED)
        else:
            stream.on_headers(head, end_stream)

    def new_stream_from_headers(self, sid, head, end_stream):  # pragma: no cover - abstract
        raise NotImplementedError

    def _on_window_update(self, sid, increment):
        if sid == 0:
            if increment == 0:
                raise H2ConnectionError(http2.E_PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise H2ConnectionError(http2.E_FLOW_CONTROL_ERROR, "connection window overflow")
            if self.blocked:
                waiting, self.blocked = self.blocked, {}
                for stream in waiting.values():
                    if self.send_window <= 0:
                        self.blocked[stream.sid] = stream
                    elif stream.pending is not None:
                        stream.pump()
            return
        stream = self.streams.get(sid)
        if stream is None:
            self._check_closed_stream(sid, "WINDOW_UPDATE")
            return
        if increment == 0:
            self._reset_stream(stream, http2.E_PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._reset_stream(stream, http2.E_FLOW_CONTROL_ERROR)
            return
        if stream.pending is not None:
            stream.pump()

    def _on_settings(self, payload):
        if not self._settings_budget.take(self.loop.time()):
            raise H2ConnectionError(http2.E_ENHANCE_YOUR_CALM,
                                    f"more than {self._settings_budget.rate} SETTINGS frames "
                                    f"per second")
        window_delta = 0
        for ident, value in parse_settings(payload):
            if ident == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(http2.E_FLOW_CONTROL_ERROR, "initial window too large")
                window_delta += value - self.peer_initial_window
                self.peer_initial_window = value
            elif ident == S_MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise H2ConnectionError(http2.E_PROTOCOL_ERROR,
                                            "invalid SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif ident == S_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif ident == S_ENABLE_PUSH:
                if value > 1:
                    raise H2ConnectionError(http2.E_PROTOCOL_ERROR, "invalid SETTINGS_ENABLE_PUSH")
        # The ACK goes out before any DATA that uses a larger window: peers (grpc-core, h2)
        # apply their new window only once they see it acknowledged.
        self.write(settings_frame((), ack=True))
        # Open streams take the new initial window lazily (StreamBase.send_window); only
        # those waiting for their own window may now send.
        if window_delta > 0 and self.window_blocked:
            waiting, self.window_blocked = self.window_blocked, {}
            for stream in waiting.values():
                if stream.pending is not None:
                    stream.pump()

    def _on_ping(self, flags, payload):
        if flags & http2.FLAG_ACK:
            if self._ping_waiters:
                waiter = self._ping_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
            return
        self.write(ping_frame(payload, ack=True))

    def _on_rst_stream(self, sid, code):
        stream = self.streams.pop(sid, None)
        if stream is None:
            self._check_closed_stream(sid, "RST_STREAM")
            if not self.is_client and not self._reset_budget.take(self.loop.time()):
                # A call answered in the turn it arrived in (a unary handler that did not
                # wait) is closed before the client's reset is read: the reset still counts,
                # or opening and resetting streams would cost the attacker nothing again.
                raise H2ConnectionError(http2.E_ENHANCE_YOUR_CALM,
                                        self.reset_budget_exceeded())
            return
        if not self.is_client:
            # Rapid reset (CVE-2023-44487): each stream opened and reset at once costs the
            # server a call set-up while never counting against max_concurrent_streams.
            if not self._reset_budget.take(self.loop.time()):
                self.streams[sid] = stream   # still ours: connection_lost cancels it
                raise H2ConnectionError(http2.E_ENHANCE_YOUR_CALM,
                                        self.reset_budget_exceeded())
        self.forget_stream(stream)
        stream.reset = True
        stream.on_reset(code)
        stream._wake_drain()

    def reset_budget_exceeded(self):
        return (f"more than {self._reset_budget.rate} streams reset or expired on arrival "
                f"per second (grpc.max_resets_per_second)")

    def _on_goaway(self, last_sid, code, debug):
        self.goaway_received = last_sid
        if code != http2.E_NO_ERROR:
            log.info("peer %s sent GOAWAY code %d: %s", self.peername, code,
                     debug.decode("utf-8", "replace"))

    # -- stream bookkeeping --------------------------------------------------------------

    def forget_stream(self, stream):
        """Drop a stream's entries in the per-connection tables (not `streams`)."""
        self.blocked.pop(stream.sid, None)
        self.window_blocked.pop(stream.sid, None)
        if stream.held:
            self.buffered -= stream.held
            stream.held = 0

    def _reset_stream(self, stream, code):
        """Send RST_STREAM and forget the stream."""
        if self.streams.pop(stream.sid, None) is not None:
            self.write(rst_stream_frame(stream.sid, code))
        self.forget_stream(stream)
        stream.reset = True
        stream.on_reset(None)
        stream._wake_drain()

    def stream_done(self, stream):
        """Both sides have closed: drop the stream."""
        self.streams.pop(stream.sid, None)
        self.forget_stream(stream)

    def send_headers(self, stream, block, end_stream=False):
        self.write(header_frames(stream.sid, block, self.peer_max_frame, end_stream))


__all__ = ["MAX_GRPC_MESSAGE", "H2Connection", "StreamBase", "TransportConfig"]
