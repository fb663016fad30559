"""One HTTP/2 stream's flow control, shared by the server's and the client's calls: DATA
queued against the stream's and the connection's send windows and moved out as they open, and
received bytes credited back to the peer in batches.

A change of the peer's SETTINGS_INITIAL_WINDOW_SIZE is applied lazily (each stream's window is
kept against the initial window it last saw), so that no operation walks the open streams.
"""

import collections

from danube.codec.grpcframe import grpc_data_frame_pieces
from danube.codec.http2 import data_frames, window_update_frame


class StreamBase:
    """Send-side flow control and receive-side crediting for one HTTP/2 stream."""

    __slots__ = ("sid", "conn", "_send_window", "_window_base", "pending", "pending_bytes",
                 "recv_unacked", "closed_local", "closed_remote", "reset", "_drain_waiter",
                 "held", "__weakref__")

    def __init__(self, sid, conn):
        self.sid = sid
        self.conn = conn
        self._send_window = self._window_base = conn.peer_initial_window
        self.held = 0                # bytes counted in conn.buffered (ServerConnection)
        self.pending = None          # deque of [payload, pos, end_stream] or bytes (raw frames)
        self.pending_bytes = 0
        self.recv_unacked = 0
        self.closed_local = False
        self.closed_remote = False
        self.reset = False
        self._drain_waiter = None

    # The stream's send window, applying any change of the peer's initial window since it was
    # last read: SETTINGS_INITIAL_WINDOW_SIZE adjusts every stream's window (RFC 9113
    # 6.9.2), and doing that here instead of walking the streams makes a SETTINGS frame cost
    # the same with 16,000 streams open as with one.
    @property
    def send_window(self):
        base = self.conn.peer_initial_window
        if base != self._window_base:
            self._send_window += base - self._window_base
            self._window_base = base
        return self._send_window

    @send_window.setter
    def send_window(self, value):
        # Callers compute `value` from the getter, so it is against the current base.
        self._send_window = value
        self._window_base = self.conn.peer_initial_window

    # -- sending -------------------------------------------------------------------------

    def send_data(self, payload, end_stream=False):
        """Queue DATA (already length-prefixed gRPC messages), sending what the windows allow
        now. Returns True when nothing is left waiting for a window."""
        conn = self.conn
        n = len(payload)
        if self.pending is None and n <= self.send_window and n <= conn.send_window:
            conn.write(data_frames(self.sid, payload, 0, n, conn.peer_max_frame, end_stream))
            self.send_window -= n
            conn.send_window -= n
            return True
        if self.pending is None:
            self.pending = collections.deque()
        self.pending.append([payload, 0, end_stream])
        self.pending_bytes += n
        return self.pump()

    def send_message_pieces(self, message, end_stream=False):
        """Send one uncompressed gRPC message without copying it into frames, when nothing
        is queued and the windows cover it; returns False (nothing sent) otherwise."""
        conn = self.conn
        n = len(message) + 5
        if self.pending is not None or n > self.send_window or n > conn.send_window:
            return False
        conn.write_many(grpc_data_frame_pieces(self.sid, message, conn.peer_max_frame,
                                               end_stream), n)
        self.send_window -= n
        conn.send_window -= n
        return True

    def send_raw_after_data(self, frames):
        """Write frames (trailers, RST_STREAM) in order after any DATA still queued."""
        if self.pending is None:
            self.conn.write(frames)
        else:
            self.pending.append(frames)

    def pump(self):
        """Move queued DATA out as far as the windows allow."""
        conn = self.conn
        pending = self.pending
        while pending:
            item = pending[0]
            if type(item) is bytes:
                conn.write(item)
                pending.popleft()
                continue
            payload, pos, end = item
            remaining = len(payload) - pos
            allowed = min(remaining, self.send_window, conn.send_window)
            if allowed <= 0 and remaining > 0:
                # Wait for whichever window is shut: a stream window reopens through its own
                # WINDOW_UPDATE or a larger SETTINGS_INITIAL_WINDOW_SIZE (which wakes only
                # the streams in window_blocked), the connection window through `blocked`.
                if conn.send_window <= 0:
                    conn.blocked[self.sid] = self
                if self.send_window <= 0:
                    conn.window_blocked[self.sid] = self
                return False
            last = allowed == remaining
            conn.write(data_frames(self.sid, payload, pos, allowed, conn.peer_max_frame,
                                   end and last))
            self.send_window -= allowed
            conn.send_window -= allowed
            self.pending_bytes -= allowed
            if last:
                pending.popleft()
            else:
                item[1] = pos + allowed
        self.pending = None
        conn.blocked.pop(self.sid, None)
        conn.window_blocked.pop(self.sid, None)
        if self._drain_waiter is not None:
            if conn.write_paused:
                conn.drain_waiters.add(self)
            else:
                self._wake_drain()
        return True

    async def drain(self):
        """Wait until this stream's queued DATA has been handed to the socket and the socket
        is not over its high-water mark: the writer's backpressure."""
        while (self.pending is not None or self.conn.write_paused) and not self.reset:
            if self.conn.closed:
                raise ConnectionError("connection closed")
            waiter = self._drain_waiter
            if waiter is None or waiter.done():
                waiter = self._drain_waiter = self.conn.loop.create_future()
                if self.conn.write_paused:
                    self.conn.drain_waiters.add(self)
            await waiter

    def _wake_drain(self):
        waiter = self._drain_waiter
        self._drain_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- receiving -----------------------------------------------------------------------

    def credit(self, n):
        """Return `n` received bytes to the peer's stream window once the application has
        them; batched so small messages don't each cost a WINDOW_UPDATE."""
        self.recv_unacked += n
        if self.recv_unacked >= self.conn.config.stream_window // 2 and not self.closed_remote:
            self.conn.write(window_update_frame(self.sid, self.recv_unacked))
            self.recv_unacked = 0

    # Subclasses implement these.
    def on_data(self, payload, end_stream):  # pragma: no cover - abstract
        raise NotImplementedError

    def on_headers(self, fields, end_stream):  # pragma: no cover - abstract
        raise NotImplementedError

    def on_reset(self, code):  # pragma: no cover - abstract
        raise NotImplementedError

    def on_connection_lost(self, exc):  # pragma: no cover - abstract
        raise NotImplementedError
