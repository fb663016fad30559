# cython: language_level=3
# The server's path for a unary call that arrives alone: one socket read holding exactly the
# call's HEADERS and its DATA, and the WINDOW_UPDATEs grpc-core sends with them (what grpcio
# and the official Danube clients send for an Ack or a SendMessage, one call in flight per
# connection). Such a read is handled here in one C function, from the bytes to the handler
# to the one buffer of the response, instead of the ~40 Python calls of the general path
# (FrameReader, _handle_frames, _on_headers_frame, new_stream_from_headers,
# ServerStream.start/on_data/_end_of_requests/_run_unary/_send_unary, stream_done, flush).
# bench.rpc_capacity's lone section measures it.
#
# The rule that keeps it safe: this path only takes input whose every effect it reproduces
# exactly, and hands anything else, untouched, to the general path, which then does all the
# checking as before. It gives up (returns False, nothing changed) unless the connection is in
# its plain state (no partial frame buffered, no header block open, no backlog, no GOAWAY, not
# closing), the read is precisely HEADERS (END_HEADERS, no padding or priority) + DATA
# (END_STREAM, no padding) of one new client stream within the concurrent-stream limit, with
# only WINDOW_UPDATEs (non-zero, no overflow, none while another stream waits for the
# connection window) of the connection or of that stream besides them, the
# header block was decoded before on this connection and is cached (so the HPACK state cannot
# change), the method is a registered unary-unary one, the request is one whole uncompressed
# message within the method's size limit and the windows, and the deadline has not passed on
# arrival. Every limit of issue 17 is therefore applied either here, identically, or by the
# general path for the input this path refuses.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint32_t

from danube.codec.http2 cimport (FT_DATA, FT_HEADERS, FT_WINDOW_UPDATE, FL_END_STREAM,
                                 FL_END_HEADERS, _u32, FrameReader)
from danube.codec.grpcframe cimport _unary_response

import logging
import types

from danube.codec import http2
from danube.codec.http2 import H2ConnectionError, window_update_frame
from danube.rpc.status import RpcError, StatusCode

from cpython.ref cimport PyObject

cdef extern from "Python.h":
    ctypedef enum PySendResult:
        PYGEN_RETURN
        PYGEN_ERROR
        PYGEN_NEXT
    PySendResult PyIter_Send(object iter, object arg, PyObject **presult) except? PYGEN_ERROR

cdef extern from "time.h" nogil:
    ctypedef int clockid_t
    cdef struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(clockid_t clk_id, timespec *tp)
    clockid_t CLOCK_MONOTONIC

log = logging.getLogger("danube.rpc")
_Coroutine = types.CoroutineType

cdef inline double _monotonic() noexcept nogil:
    # time.monotonic()'s clock, without the call.
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef enum:
    _MAX_FRAMES = 8                 # well under the general path's FRAMES_PER_TURN
cdef long long _MAX_WINDOW = 2**31 - 1


cdef inline uint32_t _u24(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 16) | (<uint32_t>p[1] << 8) | p[2]


cdef class _Route:
    """What the path needs of one cached request head, read once: the head's attributes
    and its method's, and the key of its OK count."""
    cdef object path, method, handler, deserialize, serialize, count_key, timeout
    cdef bint usable


cdef enum:
    _MAX_ROUTES = 1024      # heads are the decoder's cached ones (512 at most at a time)
MAX_ROUTES = _MAX_ROUTES


cdef class LoneCalls:
    """A ServerConnection's lone-call path. `data_received(data)` is the connection's input
    callback: a read this path can take whole is answered here, any other goes to the
    connection's general path (`conn.take_input`)."""

    cdef object conn, server, loop, reader, methods, streams, head_cache, rpc_counts
    cdef object stream_cls, unary_kind, resumed, general, headers, trailers
    cdef dict routes
    cdef Py_ssize_t max_streams, half_window, max_message, recv_window
    cdef object transport
    cdef public unsigned long long taken       # calls answered or started on this path

    def __init__(self, conn, stream_cls, unary_kind, resumed, headers, trailers):
        self.conn = conn
        self.server = conn.server
        self.loop = conn.loop
        self.reader = conn.reader
        self.methods = conn.server.methods
        self.streams = conn.streams
        self.head_cache = conn.decoder._cache
        self.rpc_counts = conn.server.rpc_counts
        self.stream_cls = stream_cls
        self.unary_kind = unary_kind
        self.resumed = resumed
        self.general = conn.take_input
        self.headers = headers
        self.trailers = trailers
        config = conn.config
        self.max_streams = config.max_concurrent_streams
        # A request this large makes the general path credit the stream window at once.
        self.half_window = config.stream_window // 2
        self.max_message = config.max_message_size
        # The connection's receive window as connection_made sets it (it never changes).
        self.recv_window = max(config.connection_window, 65535)
        self.transport = None
        self.routes = {}

    cdef _Route _route(self, head):
        """The head's route, made on its first call (the head objects are the decoder's
        cached ones, so the same object comes back for the same block)."""
        cdef _Route route = self.routes.get(head)
        if route is not None and self.methods.get(route.path) is route.method:
            return route
        route = _Route()
        route.usable = False
        route.path = head.path
        route.method = method = self.methods.get(head.path)
        if (head.http_error is None and head.error is None and method is not None
                and method.kind is self.unary_kind):
            route.usable = True
            route.handler = method.handler
            route.deserialize = method.deserialize
            route.serialize = method.serialize
            route.count_key = (method.name, 0)
            route.timeout = head.timeout
        if len(self.routes) >= _MAX_ROUTES:
            self.routes.clear()
        self.routes[head] = route
        return route

    def data_received(self, bytes data):
        if not self._take(data):
            self.general(data)

    @property
    def routes_held(self):
        """Routes kept (bounded by _MAX_ROUTES)."""
        return len(self.routes)

    def forget(self):
        """Drop the references back to the connection (it is gone)."""
        self.conn = self.general = self.streams = None

    cdef bint _take(self, bytes data) except -1:
        conn = self.conn
        if conn is None:
            return False
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t hlen = 0, dpos = -1, dlen = 0, mlen, pos = 0, length
        cdef uint32_t sid = 0, fsid, inc
        cdef int ftype, flags, frames = 0
        # WINDOW_UPDATE increments the read carries: the connection's before and after the
        # DATA (the general path answers the call at the DATA, between the two), the stream's.
        cdef long long conn_before = 0, conn_after = 0, stream_inc = 0
        cdef FrameReader reader = <FrameReader>self.reader
        cdef uint32_t max_frame = reader.max_frame_size
        # The frames: HEADERS first, one DATA ending the stream, and WINDOW_UPDATEs of the
        # connection or of this stream around them (grpc-core sends one of its stream's with
        # every call, and now and then one of the connection's).
        if n < 23 or p[3] != FT_HEADERS or p[4] != FL_END_HEADERS:
            return False
        while pos < n:
            if n - pos < 9 or frames == _MAX_FRAMES:
                return False
            length = _u24(p + pos)
            if length > max_frame or n - pos - 9 < length:
                return False
            frames += 1
            ftype = p[pos + 3]
            flags = p[pos + 4]
            fsid = _u32(p + pos + 5) & 0x7FFFFFFF
            if pos == 0:
                sid = fsid
                hlen = length
            elif ftype == FT_DATA:
                if dpos >= 0 or flags != FL_END_STREAM or fsid != sid or length < 5:
                    return False
                dpos = pos
                dlen = length
            elif ftype == FT_WINDOW_UPDATE:
                inc = _u32(p + pos + 9) & 0x7FFFFFFF
                if length != 4 or inc == 0:
                    return False
                if fsid == 0:
                    if dpos < 0:
                        conn_before += inc
                    else:
                        conn_after += inc
                elif fsid == sid and dpos < 0:
                    stream_inc += inc
                else:
                    return False
            else:
                return False
            pos += 9 + length
        if dpos < 0:
            return False
        # The message: one, whole, uncompressed.
        mlen = _u32(p + dpos + 10)
        if p[dpos + 9] != 0 or mlen != dlen - 5 or dlen >= self.half_window:
            return False
        if reader.expect_preface or len(reader._buf):
            return False
        if (conn._lingering or conn.closed or conn._backlog or conn._header_block is not None
                or conn.goaway_last is not None):
            return False
        if sid % 2 == 0 or sid <= conn.last_peer_stream or len(self.streams) >= self.max_streams:
            return False
        if conn_before or conn_after:
            # Streams waiting for the connection window would be pumped: the general path's.
            if conn.blocked or conn.send_window + conn_before + conn_after > _MAX_WINDOW:
                return False
        cdef long long stream_window = conn.peer_initial_window + stream_inc
        if stream_window > _MAX_WINDOW:
            return False
        recv_unacked = conn.recv_unacked
        if dlen > self.recv_window - recv_unacked:
            return False
        head = self.head_cache.get(PyBytes_FromStringAndSize(<const char *>p + 9, hlen))
        if head is None:
            return False
        cdef _Route route = self._route(head)
        if not route.usable:
            return False
        limit = route.method.max_request     # read each time: Server.limit_requests sets it
        if mlen > (self.max_message if limit is None else <Py_ssize_t>limit):
            return False
        timeout = route.timeout
        if timeout is not None:
            received_at = _monotonic()
            if <double>timeout <= _monotonic() - received_at:
                return False            # expired on arrival: the general path's answer
        # Taken: from here on this is the call's handling, as the general path does it.
        conn.last_peer_stream = sid
        conn.recv_unacked = recv_unacked + dlen
        self.taken += 1
        # Not marked _in_receive: what the handler writes through conn.write is flushed
        # below (or by the flush it schedules, finding nothing left).
        suspended = False
        try:
            stream = self.stream_cls(sid, conn, head, route.method, True)
            if stream_inc:
                stream._send_window += stream_inc
            if conn_before:
                conn.send_window += conn_before
            if timeout is not None:
                stream.deadline = self.loop.time() + timeout
            self.streams[sid] = stream
            suspended = self._run(stream, route,
                                  PyBytes_FromStringAndSize(<const char *>p + dpos + 14, mlen),
                                  sid, stream_window)
            if conn_after:
                conn.send_window += conn_after
            if conn.recv_unacked >= self.recv_window // 4:
                conn.write(window_update_frame(0, conn.recv_unacked))
                conn.recv_unacked = 0
        except H2ConnectionError as exc:
            conn.protocol_error(exc.code, str(exc))
        except Exception:  # noqa: BLE001 - as the general path: one connection, not the server
            log.exception("internal error handling input from %s", conn.peername)
            conn.protocol_error(http2.E_INTERNAL_ERROR, "internal error")
        if conn._out:
            conn.flush()
        if suspended and timeout is not None:
            stream.arm_deadline()
        return True

    cdef bint _run(self, stream, _Route route, bytes message, uint32_t sid,
                   long long stream_window) except -1:
        """Run the handler where its request completed (ServerStream._run_unary, inlined):
        True when it suspended and carries on in a task."""
        cdef PyObject *result = NULL
        cdef PySendResult status
        server = self.server
        server.active_calls += 1
        try:
            deserialize = route.deserialize
            if deserialize is None:
                request = message
            else:
                try:
                    request = deserialize(message)
                except RpcError:
                    raise
                except Exception as exc:  # noqa: BLE001 - any parser error is the client's
                    raise RpcError(StatusCode.INTERNAL,
                                   f"failed to parse request message: {exc}")
            coro = route.handler(request, stream)
            if type(coro) is not _Coroutine and not hasattr(coro, "send"):   # any awaitable
                stream.task = self.loop.create_task(stream._finish_unary(coro))
                return True
            status = PyIter_Send(coro, None, &result)
            value = <object>result
            Py_XDECREF_(result)
            if status == PYGEN_NEXT:
                stream.task = self.loop.create_task(
                    stream._finish_unary(self.resumed(coro, value)))
                return True
            if not self._answer(stream, route, value, sid, stream_window):
                stream._send_unary(value)
        except BaseException as exc:  # noqa: BLE001 - _failed re-raises what is not a call's
            stream._failed(exc)
        server.active_calls -= 1
        # No deadline timer to cancel: it is armed only for a call that suspended.
        if server.active_calls == 0 and server.idle_waiter is not None:
            server.idle_waiter.set()
        return False

    cdef bint _answer(self, stream, _Route route, response, uint32_t sid,
                      long long stream_window) except -1:
        """The plain OK answer (ServerStream._send_unary's first branch) in one buffer; False
        when the call needs the general answer (metadata, compression, a status set by the
        handler, a window too small, a response over the size limit...)."""
        conn = self.conn
        # Initial metadata and queued DATA imply headers_sent; _details goes out only with
        # a _code (as in _send_unary).
        if (stream.finished or stream.headers_sent or stream._trailing is not None
                or stream._resp_encoding is not None or stream._code is not None):
            return False
        serialize = route.serialize
        data = response if serialize is None else serialize(response)
        if type(data) is not bytes:
            return False
        cdef Py_ssize_t mn = PyBytes_GET_SIZE(data)
        cdef Py_ssize_t wn = mn + 5
        # The stream's window is what its creation and this read's WINDOW_UPDATEs made it
        # (only input changes it, and the handler ran inside this input).
        cdef long long conn_window = conn.send_window
        if mn > self.max_message or wn > stream_window or wn > conn_window:
            return False
        cdef bytes headers = self.headers, trailers = self.trailers
        out = _unary_response(sid, <const uint8_t *>PyBytes_AS_STRING(headers),
                              PyBytes_GET_SIZE(headers),
                              <const uint8_t *>PyBytes_AS_STRING(data), mn,
                              <const uint8_t *>PyBytes_AS_STRING(trailers),
                              PyBytes_GET_SIZE(trailers), conn.peer_max_frame, False)
        if conn._out or conn.closed:
            conn.write(out)
        else:
            transport = self.transport
            if transport is None:
                transport = self.transport = conn.transport
            if not transport.is_closing():
                transport.write(out)
        counts = self.rpc_counts
        key = route.count_key
        counts[key] = counts.get(key, 0) + 1
        stream._send_window = stream_window - wn
        conn.send_window = conn_window - wn
        stream.headers_sent = True
        # _closed_by_us and stream_done, for a stream whose request has ended, that never
        # waited for a window or request bytes and has no timer yet.
        stream.finished = True
        stream.closed_local = True
        streams = self.streams
        streams.pop(sid, None)
        if not streams:
            conn._active_at = self.loop.time()
            if conn.goaway_last is not None:
                conn.close()
        return True


cdef extern from *:
    """
    static inline void Py_XDECREF_(PyObject *o) { Py_XDECREF(o); }
    """
    void Py_XDECREF_(PyObject *o)
