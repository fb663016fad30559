"""One gRPC call on the server (ServerStream): its request as it arrives, the handler's task,
the deadline, the responses and the status, and the handler's `context` API in grpc.aio's
ServicerContext shapes.

Over 500 lines, one class: the transport side of a call and the handler's context are one
object (the handler's `context` is the stream, as grpc.aio's is the call), and splitting a
__slots__ class over modules would take a base class on the per-message paths.
"""

import asyncio
import collections
import logging
import time
import types

from danube.codec import http2
from danube.codec.grpcframe import (CompressedMessage, GrpcDeframer, GrpcMessageTooLarge,
                                    grpc_frame, grpc_frame_many, unary_response)
from danube.codec.http2 import rst_stream_frame
from danube.rpc import compression
from danube.rpc.headers import (encode_headers, metadata_from_headers, metadata_to_headers,
                                percent_encode)
from danube.rpc.method import Kind
from danube.rpc.status import RpcError, StatusCode
from danube.rpc.stream import StreamBase

# The server's logger, named as before ServerStream had a module of its own: log settings
# refer to it.
log = logging.getLogger("danube.rpc.server")

# (method, exception type) pairs already logged with a traceback. A handler bug that a client
# can trigger at will would otherwise write a full traceback per call; the methods are the
# registered ones and the types finite, so the set stays small.
_failures_logged = set()


def _log_handler_failure(method_name, exc):
    key = (method_name, type(exc))
    summary = f"{type(exc).__name__}: {exc}"[:500]
    if key in _failures_logged:
        log.debug("handler for %s failed again: %s", method_name, summary, exc_info=exc)
        return
    _failures_logged.add(key)
    log.error("handler for %s failed: %s (answered INTERNAL; later failures of this kind are "
              "logged at debug)", method_name, summary, exc_info=exc)


@types.coroutine
def _resumed(coro, waiting):
    """Carry on, inside a task, a coroutine whose first step ran outside one and is now
    suspended on `waiting` (what that step yielded): the task waits on it as if the
    coroutine had yielded it to the task itself, then passes every later step through, so
    the coroutine cannot tell the difference, cancellation included (the task cancels
    the future it waits on, and the coroutine sees CancelledError where it awaits)."""
    send, throw = coro.send, coro.throw
    while True:
        try:
            value = yield waiting
        except BaseException as exc:  # noqa: BLE001 - thrown in by the task: pass it on
            step, arg = throw, exc
        else:
            step, arg = send, value
        try:
            waiting = step(arg)
        except StopIteration as done:
            return done.value


_RESPONSE_HEADERS = encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
_TRAILERS_OK = encode_headers([(b"grpc-status", b"0")])


class ServerStream(StreamBase):
    """One call on the server. It is also the handler's `context`."""

    __slots__ = ("head", "method", "deframer", "requests", "task", "headers_sent", "deadline",
                 "_timer", "deadline_hit", "finished", "_inbox_waiter", "_deferred_credit",
                 "_trailing", "_initial", "_code", "_details", "_resp_encoding",
                 "_inbox_bytes", "_metadata", "_idle_tick", "_idle_bucket")

    def __init__(self, sid, conn, head, method, whole=False):
        StreamBase.__init__(self, sid, conn)    # not super(): one call per call counts here
        self.head = head
        self.method = method
        if whole:
            # The lone-call path (_lone.pyx) had the whole request: nothing more is read.
            self.deframer = None
            self.closed_remote = True
        else:
            self.deframer = GrpcDeframer(method.max_request or conn.config.max_message_size)
        # A unary request is one message (on_data refuses a second): a list, a tenth of an
        # empty deque's size, keeps each open stream cheaper.
        self.requests = collections.deque() if method.client_streaming else []
        self.task = None
        self.headers_sent = False
        self.deadline = None
        self._timer = None
        self.deadline_hit = False
        self.finished = False
        self._inbox_waiter = None
        self._inbox_bytes = 0
        self._deferred_credit = 0
        self._trailing = None
        self._initial = None
        self._code = None
        self._details = None
        server = conn.server
        self._resp_encoding = (None if server.default_compression is None
                               else server.response_encoding(head))
        self._metadata = None
        self._idle_tick = 0
        self._idle_bucket = None      # the IdleStreams bucket holding us while we wait

    # -- frames from the client ----------------------------------------------------------

    def on_data(self, payload, end_stream):
        if self.finished:
            self.credit(len(payload))
            return
        try:
            messages = self.deframer.feed(payload)
        except GrpcMessageTooLarge as exc:
            # Answered from the length prefix alone: the body is never buffered, the
            # trailers go out now and the RST_STREAM after them stops the client; what it
            # already sent is dropped on arrival, its connection window credited.
            method = self.method
            if method.refuse is not None and exc.size > method.own_limit:
                refusal = method.refuse(exc.size, exc.head)
                self.fail_early(refusal.code, refusal.details)
            else:
                self.fail_early(StatusCode.RESOURCE_EXHAUSTED, str(exc))
            return
        except ValueError as exc:
            self.fail_early(StatusCode.INTERNAL, str(exc))
            return
        if payload and self._idle_bucket is not None:
            self._idle_tick = self.conn.server.idle_streams.tick
        if messages or not self.method.client_streaming and self.requests:
            if not self.method.client_streaming and (
                    len(self.requests) + len(messages) > 1 or self.deframer.pending):
                # A unary or server-streaming request is one message (as grpc-go and
                # grpc-java enforce). Refusing the second one at once, rather than at the
                # end of the request, keeps a client from queueing unbounded tiny messages
                # (each a Python object several times its wire size); the stream is gone,
                # so nothing more it sends is kept or credited to its stream window.
                self.fail_early(StatusCode.INTERNAL, "received more than one request message")
                return
            self.requests.extend(messages)
        if self.method.client_streaming:
            # Credit what the handler has taken; hold back once a window's worth is queued.
            self._inbox_bytes += len(payload)
            if self._inbox_bytes < self.conn.config.stream_window:
                self.credit(len(payload))
            else:
                self._deferred_credit += len(payload)
        else:
            # A unary request is buffered whole anyway, bounded by the message-size limit.
            self.credit(len(payload))
        if end_stream:
            self._end_of_requests()
        elif messages and self._inbox_waiter is not None:
            self._wake_inbox()

    def on_headers(self, head, end_stream):
        # Trailers from a client are only valid as the end of its stream.
        if end_stream:
            self._end_of_requests()
        else:
            self.conn._reset_stream(self, http2.E_PROTOCOL_ERROR)

    def _end_of_requests(self):
        self.closed_remote = True
        self._stop_waiting()
        if self.deframer.pending:
            self.fail_early(StatusCode.INTERNAL, "truncated gRPC message at end of stream")
            return
        if self.task is None and not self.finished:
            self.start_task()       # a unary call may be answered (and done with) in it
            return
        self._wake_inbox()
        if self.closed_local and self.pending is None:
            self.conn.stream_done(self)

    def on_reset(self, code):
        self.closed_remote = self.closed_local = True
        self.finished = True
        self._cancel_timer()
        self._stop_waiting()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._wake_inbox()

    def on_connection_lost(self, exc):
        self.reset = True
        self.on_reset(None)

    # -- running the handler -------------------------------------------------------------

    def start(self, end_stream):
        head = self.head
        if head.timeout is not None:
            conn = self.conn
            # Measured with the clock itself: the loop's time is cached per turn (and in
            # milliseconds under uvloop), so it cannot see a 1n deadline pass.
            if head.timeout <= time.monotonic() - conn.received_at:
                self._expired_on_arrival(conn)
                return
            self.deadline = conn.loop.time() + head.timeout
            # The timer is armed once this input is handled, and only if the call is still
            # running then: a unary call whose request came whole is usually answered in
            # the same turn, and a timer made and cancelled for each such call was about a
            # tenth of its cost (grpcio sends grpc-timeout on every call).
            conn.arm_deadline_later(self)
        if end_stream:
            self._end_of_requests()
            return
        idle = self.conn.server.idle_streams
        if idle is not None:
            idle.add(self)
        if self.method.client_streaming:
            self.start_task()

    def _expired_on_arrival(self, conn):
        """The call's deadline had passed when it arrived (grpc-timeout: 1n): answered at
        once, with no handler, timer or task. Such a call is abandoned by its client before
        the server could work on it, as a reset stream is, and counts against the same
        per-connection budget: a peer sending tens of thousands a second would otherwise
        take the event loop from everyone else while asking for nothing."""
        if not conn._reset_budget.take(conn.loop.time()):
            raise http2.H2ConnectionError(http2.E_ENHANCE_YOUR_CALM,
                                          conn.reset_budget_exceeded())
        self.fail_early(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _stop_waiting(self):
        bucket = self._idle_bucket
        if bucket is not None:
            bucket.discard(self)
            self._idle_bucket = None

    def on_idle_timeout(self):
        """No request bytes for grpc.stream_idle_timeout_ms while the request is still open:
        fail the call and reset the stream so the client stops sending and the slot is free."""
        if self.finished or self.closed_remote:
            return
        timeout_ms = round(self.conn.server.idle_streams.timeout * 1000)
        self._abandon_output()
        self.fail_early(StatusCode.CANCELLED,
                        f"request stalled: no request data for {timeout_ms} ms",
                        http2.E_CANCEL)

    def start_task(self):
        if self.method.kind is Kind.UNARY_UNARY:
            self._run_unary()
        else:
            self.task = self.conn.loop.create_task(self._run())

    def _run_unary(self):
        """A unary call, started where its request completed (in the connection's input
        callback) rather than in a task of its own: a handler that answers without waiting
        for anything (Ack, a non-reliable SendMessage, most reads) is answered in the same
        event-loop turn, its response in the socket write that ends the turn. Only a
        handler that suspends gets a task, which resumes it where it stopped (_resumed).
        That saves a task and two loop turns per call (bench.rpc_capacity, lone calls: 1.18x
        less server CPU per call with 8 busy connections, nothing measurable with 200, where
        a turn serves many connections anyway). The handler's first step runs with no
        current task (asyncio.current_task() is None there)."""
        method = self.method
        server = self.conn.server
        server.active_calls += 1
        try:
            coro = method.handler(self._single_request(), self)
            step = getattr(coro, "send", None)
            if step is None:                        # not a coroutine: any awaitable
                self.task = self.conn.loop.create_task(self._finish_unary(coro))
                return
            try:
                waiting = step(None)
            except StopIteration as done:
                self._send_unary(done.value)
            else:
                self.task = self.conn.loop.create_task(
                    self._finish_unary(_resumed(coro, waiting)))
                return
        except BaseException as exc:  # noqa: BLE001 - _failed re-raises what is not a call's
            self._failed(exc)
        self._call_ended(server)

    async def _finish_unary(self, awaitable):
        server = self.conn.server
        try:
            self._send_unary(await awaitable)
        except BaseException as exc:  # noqa: BLE001 - _failed re-raises what is not a call's
            self._failed(exc)
        finally:
            self._call_ended(server)

    def _failed(self, exc):
        """A handler's call ended with `exc`: answer the status it stands for."""
        if isinstance(exc, RpcError):
            self.finish(exc.code, exc.details, exc.trailing_metadata)
        elif isinstance(exc, asyncio.CancelledError):
            if self.deadline_hit:
                self.finish(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            elif not self.reset:
                self.finish(StatusCode.UNAVAILABLE, "server is shutting down")
        elif isinstance(exc, Exception):
            if self.reset or self.finished:
                return
            _log_handler_failure(self.method.name, exc)
            self.finish(StatusCode.INTERNAL,
                        f"Exception calling application: {type(exc).__name__}: {exc}")
        else:
            raise exc           # KeyboardInterrupt, SystemExit: not the call's to answer

    def _call_ended(self, server):
        server.active_calls -= 1
        self._cancel_timer()
        if server.active_calls == 0 and server.idle_waiter is not None:
            server.idle_waiter.set()

    def arm_deadline(self):
        if not self.finished and self._timer is None:
            self._timer = self.conn.loop.call_at(self.deadline, self._on_deadline)

    def _on_deadline(self):
        self._timer = None
        if self.finished:
            return
        self.deadline_hit = True
        # Answer here rather than from the handler's CancelledError: a task cancelled before
        # its first step never runs its body, so a deadline that passes before the handler
        # starts (grpc-timeout: 1n with the request in the same write) would leave the call
        # unanswered and its stream slot taken for good.
        self._abandon_output()
        self.fail_early(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _abandon_output(self):
        """Drop response DATA still waiting for a flow-control window (the call is being
        failed, so the client would get it too late anyway) so that the status goes out now
        and the stream is freed even if the client never opens its window. A message
        already half-sent cannot be cut short inside a gRPC stream: then the stream is
        reset (CANCEL) instead, which also frees it."""
        pending = self.pending
        if pending is None or self.finished:
            return
        if any(type(item) is not bytes and item[1] for item in pending):
            conn = self.conn
            conn.server.rpc_counts[self.method.name, int(StatusCode.CANCELLED)] += 1
            self.closed_local = True
            conn._reset_stream(self, http2.E_CANCEL)
            conn.note_reset(self.sid)
            return
        self.pending = None
        self.pending_bytes = 0
        self.conn.blocked.pop(self.sid, None)

    def _cancel_timer(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _run(self):
        method = self.method
        kind = method.kind
        server = self.conn.server
        server.active_calls += 1
        try:
            if kind is Kind.STREAM_UNARY:
                response = await method.handler(self._request_iterator(), self)
                self._send_unary(response)
                return
            request = (self._single_request() if kind is Kind.UNARY_STREAM
                       else self._request_iterator())
            result = method.handler(request, self)
            if hasattr(result, "__aiter__"):
                async for item in result:
                    await self.write(item)
            else:
                await result
            self.finish(self._code or StatusCode.OK, self._details or "")
        except RpcError as exc:
            self.finish(exc.code, exc.details, exc.trailing_metadata)
        except asyncio.CancelledError:
            if self.deadline_hit:
                self.finish(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            elif not self.reset:
                self.finish(StatusCode.UNAVAILABLE, "server is shutting down")
        except Exception as exc:  # noqa: BLE001 - a handler bug fails only its call
            if self.reset or self.finished:
                return
            _log_handler_failure(method.name, exc)
            self.finish(StatusCode.INTERNAL,
                        f"Exception calling application: {type(exc).__name__}: {exc}")
        finally:
            server.active_calls -= 1
            self._cancel_timer()
            if server.active_calls == 0 and server.idle_waiter is not None:
                server.idle_waiter.set()

    def _decode(self, data):
        if type(data) is CompressedMessage:
            data = compression.decompress(self.head.encoding or "identity", data,
                                          self.conn.config.max_message_size)
        deserialize = self.method.deserialize
        if deserialize is None:
            return data
        try:
            return deserialize(data)
        except RpcError:
            raise
        except Exception as exc:  # noqa: BLE001 - any parser error is the client's fault
            raise RpcError(StatusCode.INTERNAL, f"failed to parse request message: {exc}")

    def _single_request(self):
        # A second message was refused as it arrived (on_data); none is left to check here.
        if not self.requests:
            raise RpcError(StatusCode.INTERNAL, "expected exactly one request message, got 0")
        return self._decode(self.requests.pop())

    async def _request_iterator(self):
        while True:
            if self.requests:
                data = self.requests.popleft()
                self._inbox_bytes -= len(data) + 5
                if (self._deferred_credit
                        and self._inbox_bytes < self.conn.config.stream_window // 2):
                    credit, self._deferred_credit = self._deferred_credit, 0
                    self.credit(credit)
                    self.conn.flush()
                yield self._decode(data)
                continue
            if self.closed_remote or self.finished:
                return
            self._inbox_waiter = self.conn.loop.create_future()
            await self._inbox_waiter

    def _wake_inbox(self):
        waiter = self._inbox_waiter
        if waiter is not None:
            self._inbox_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- sending -------------------------------------------------------------------------

    def _serialize(self, message):
        serialize = self.method.serialize
        data = message if serialize is None else serialize(message)
        if len(data) > self.conn.config.max_message_size:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED,
                           f"response message larger than max ({len(data)} vs. "
                           f"{self.conn.config.max_message_size})")
        return data

    def _frame(self, data):
        if self._resp_encoding:
            return grpc_frame(compression.compress(self._resp_encoding, data), True)
        return grpc_frame(data)

    def _send_initial_headers(self):
        self.headers_sent = True
        if self._initial is None and self._resp_encoding is None:
            block = _RESPONSE_HEADERS
        else:
            fields = [(b":status", b"200"), (b"content-type", b"application/grpc")]
            if self._resp_encoding:
                fields.append((b"grpc-encoding", self._resp_encoding.encode()))
            fields.extend(metadata_to_headers(self._initial))
            block = encode_headers(fields)
        self.conn.send_headers(self, block)

    def _send_unary(self, response):
        if self.finished:
            return
        data = self._serialize(response)
        conn = self.conn
        n = len(data) + 5
        if (not self.headers_sent and self._initial is None and self._trailing is None
                and self._resp_encoding is None and self._code is None and self.pending is None
                and n <= self.send_window and n <= conn.send_window):
            conn.write(unary_response(self.sid, _RESPONSE_HEADERS, data, _TRAILERS_OK,
                                      conn.peer_max_frame))
            conn.server.rpc_counts[self.method.name, 0] += 1
            self.send_window -= n
            conn.send_window -= n
            self.headers_sent = True
            self._closed_by_us()
            return
        if not self.headers_sent:
            self._send_initial_headers()
        self.send_data(self._frame(data))
        self.finish(self._code or StatusCode.OK, self._details or "")

    async def write(self, message):
        """Send one response message on a streaming call, waiting if the client or the
        socket is not keeping up."""
        if self.finished:
            raise RpcError(StatusCode.CANCELLED, "call already finished")
        data = self._serialize(message)
        if not self.headers_sent:
            self._send_initial_headers()
        if not self.send_data(self._frame(data)) or self.conn.write_paused:
            await self.drain()

    async def write_batch(self, messages):
        """Send many already-serialised messages (bytes) at once: one framing pass and one
        buffer, for the dispatch paths that move messages in batches."""
        if self.finished:
            raise RpcError(StatusCode.CANCELLED, "call already finished")
        if not self.headers_sent:
            self._send_initial_headers()
        if self._resp_encoding:
            body = b"".join(self._frame(m) for m in messages)
        else:
            body = grpc_frame_many(messages)
        if not self.send_data(body) or self.conn.write_paused:
            await self.drain()

    def start_response(self):
        """Send the response headers now (a stream that will be fed from outside its
        handler, like a consumer's delivery stream)."""
        if not self.headers_sent:
            self._send_initial_headers()

    @property
    def blocked(self):
        """True while writes would only queue: a flow-control window or the socket is full."""
        return self.pending is not None or self.conn.write_paused

    def send_framed(self, data):
        """Send bytes that are already length-prefixed gRPC messages; returns False when some
        of it waits for a window or the socket is over its high-water mark."""
        if not self.headers_sent:
            self._send_initial_headers()
        return self.send_data(data) and not self.conn.write_paused

    def finish(self, code, details="", trailing_metadata=None, rst_code=http2.E_NO_ERROR):
        """End the call with a status, after any queued messages; `rst_code` is the
        RST_STREAM code that follows if the client has not finished its request."""
        if self.finished:
            return
        trailing = trailing_metadata if trailing_metadata else self._trailing
        fields = []
        if not self.headers_sent:
            # Trailers-only response.
            fields = [(b":status", b"200"), (b"content-type", b"application/grpc")]
            self.headers_sent = True
        fields.append((b"grpc-status", b"%d" % code))
        if details:
            fields.append((b"grpc-message", percent_encode(details)))
        if trailing:
            try:
                fields.extend(metadata_to_headers(trailing))
            except ValueError as exc:
                log.warning("dropping invalid trailing metadata on %s: %s", self.method.name, exc)
        block = _TRAILERS_OK if len(fields) == 1 and code == 0 else encode_headers(fields)
        conn = self.conn
        conn.server.rpc_counts[self.method.name, int(code)] += 1
        self.send_raw_after_data(http2.header_frames(self.sid, block, conn.peer_max_frame, True))
        self._closed_by_us(rst_code)

    def _closed_by_us(self, rst_code=http2.E_NO_ERROR):
        self.finished = True
        self.closed_local = True
        self._cancel_timer()
        self._stop_waiting()
        if not self.closed_remote:
            # The client is still sending: tell it to stop (RFC 9113 8.1).
            self.send_raw_after_data(rst_stream_frame(self.sid, rst_code))
            self.closed_remote = True
            self.conn.note_reset(self.sid)
        if self.pending is None:
            self.conn.stream_done(self)

    def fail_early(self, code, details, rst_code=http2.E_NO_ERROR):
        """Fail the call from the transport side (bad input, deadline, stalled request);
        the handler, if running or about to, is cancelled."""
        if self.finished:
            return
        self.finish(code, details, None, rst_code)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def pump(self):
        drained = super().pump()
        if drained and self.closed_local and self.closed_remote:
            self.conn.stream_done(self)
        return drained

    # -- the handler's context API (grpc.aio ServicerContext-like) ---------------------

    def invocation_metadata(self):
        if self._metadata is None:
            self._metadata = metadata_from_headers(self.head.fields)
        return self._metadata

    def peer(self):
        peer = self.conn.peername
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"ipv{6 if ':' in peer[0] else 4}:{peer[0]}:{peer[1]}"
        return str(peer)

    def peer_certificate(self):
        ssl_obj = self.conn.transport.get_extra_info("ssl_object")
        return ssl_obj.getpeercert() if ssl_obj is not None else None

    def time_remaining(self):
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self.conn.loop.time())

    def cancelled(self):
        return self.reset

    def set_trailing_metadata(self, metadata):
        self._trailing = tuple(metadata)

    async def send_initial_metadata(self, metadata):
        if self.headers_sent:
            raise RuntimeError("initial metadata already sent")
        self._initial = tuple(metadata)
        self._send_initial_headers()

    def set_code(self, code):
        self._code = StatusCode(code)

    def set_details(self, details):
        self._details = details

    def set_compression(self, encoding):
        """Compress responses with `encoding` ("gzip"/"deflate"), if the client accepts it."""
        if self.headers_sent:
            raise RuntimeError("compression must be chosen before the first response")
        self._resp_encoding = compression.pick_response_encoding(encoding,
                                                                 self.head.accept_encoding)

    async def abort(self, code, details="", trailing_metadata=()):
        raise RpcError(code, details, trailing_metadata)

    @property
    def method_name(self):
        return self.method.name
