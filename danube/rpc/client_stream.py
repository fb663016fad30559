"""One gRPC call on the client (ClientStream): the request messages sent under flow control,
the response messages read as the application takes them, the status, and the deadline."""

import asyncio
import collections

from danube.codec import http2
from danube.codec.grpcframe import (CompressedMessage, GrpcDeframer, GrpcMessageTooLarge,
                                    grpc_frame, grpc_frame_many)
from danube.rpc import compression
from danube.rpc.headers import metadata_from_headers
from danube.rpc.status import RpcError, StatusCode, http_status_to_grpc
from danube.rpc.stream import StreamBase

#: A message at least this large is written without being copied into DATA frames (headers
#: and memoryviews of it go to the socket in one writev).
PIECES_MIN = 32768


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
        self.status = (StatusCode(code) if code in StatusCode._value2member_map_
                       else StatusCode.UNKNOWN)
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
