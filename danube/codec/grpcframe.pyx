# cython: language_level=3
# gRPC length-prefixed messages (PROTOCOL-HTTP2.md: Length-Prefixed-Message =
# Compressed-Flag(1) Message-Length(4, big-endian) Message), split across and packed into
# HTTP/2 DATA frames. Runs once per message, so it is C loops over buffers.

from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.bytes cimport (PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_AS_STRING,
                            PyBytes_GET_SIZE)
from libc.string cimport memcpy
from libc.stdint cimport uint8_t, uint32_t

from danube.codec.http2 cimport (FT_DATA, FL_END_STREAM, _u32, _put_header, _data_frames_size,
                                 _write_data_frames, _write_header_frames)


class GrpcMessageTooLarge(Exception):
    """A length prefix announced a message over the receiver's limit. `head` is the start of
    the message that arrived with its prefix (up to 256 bytes, maybe none): enough for a
    refusal to say whose message it was (a StreamMessage's msg_id comes first)."""

    def __init__(self, size, limit, head=b""):
        super().__init__(
            "received message larger than max (%d vs. %d)" % (size, limit))
        self.size = size
        self.limit = limit
        self.head = head


def grpc_frame(const uint8_t[::1] message, bint compressed=False):
    """One length-prefixed message."""
    cdef Py_ssize_t n = message.shape[0]
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 5 + n)
    cdef uint8_t *o = <uint8_t *>PyBytes_AS_STRING(out)
    _put_prefix(o, compressed, <uint32_t>n)
    if n:
        memcpy(o + 5, &message[0], n)
    return out


cdef Py_ssize_t _check_bytes_list(list messages) except -1:
    cdef Py_ssize_t i, total = 0
    cdef object m
    for i in range(PyList_GET_SIZE(messages)):
        m = <object>PyList_GET_ITEM(messages, i)
        if not PyBytes_Check(m):
            raise TypeError("messages must be bytes, got %s" % type(m).__name__)
        total += 5 + PyBytes_GET_SIZE(m)
    return total


cdef Py_ssize_t _write_prefixed(uint8_t *o, list messages, bint compressed):
    cdef Py_ssize_t i, n, w = 0
    cdef object m
    for i in range(PyList_GET_SIZE(messages)):
        m = <object>PyList_GET_ITEM(messages, i)
        n = PyBytes_GET_SIZE(m)
        _put_prefix(o + w, compressed, <uint32_t>n)
        memcpy(o + w + 5, PyBytes_AS_STRING(m), n)
        w += 5 + n
    return w


def grpc_data_frame_pieces(uint32_t sid, message, Py_ssize_t max_frame,
                           bint end_stream=False):
    """One uncompressed message, length-prefixed and cut into DATA frames of at most
    ``max_frame`` bytes, without copying it: a list of buffers to write in order (a socket's
    writelines): each frame's header (the first followed by the 5-byte gRPC prefix) and a
    memoryview of the message's part. Flow control is the caller's."""
    cdef Py_ssize_t n = len(message), total = n + 5, vpos = 0, chunk, a
    cdef bytes hdr
    cdef uint8_t *o
    cdef list out = []
    if max_frame < 16:
        raise ValueError("max_frame too small")
    view = memoryview(message).cast("B")
    while True:
        chunk = total - vpos
        if chunk > max_frame:
            chunk = max_frame
        last = vpos + chunk == total
        if vpos == 0:
            hdr = PyBytes_FromStringAndSize(NULL, 14)
            o = <uint8_t *>PyBytes_AS_STRING(hdr)
            _put_header(o, <uint32_t>chunk, FT_DATA, FL_END_STREAM if (end_stream and last)
                        else 0, sid)
            _put_prefix(o + 9, False, <uint32_t>n)
            out.append(hdr)
            if chunk > 5:
                out.append(view[0:chunk - 5])
        else:
            hdr = PyBytes_FromStringAndSize(NULL, 9)
            o = <uint8_t *>PyBytes_AS_STRING(hdr)
            _put_header(o, <uint32_t>chunk, FT_DATA, FL_END_STREAM if (end_stream and last)
                        else 0, sid)
            out.append(hdr)
            a = vpos - 5
            out.append(view[a:a + chunk])
        vpos += chunk
        if last:
            return out


def grpc_frame_many(list messages, bint compressed=False):
    """Many serialised messages (a list of bytes) as one buffer of length-prefixed
    messages: the batch a stream writes in one go."""
    cdef Py_ssize_t total = _check_bytes_list(messages)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    _write_prefixed(<uint8_t *>PyBytes_AS_STRING(out), messages, compressed)
    return out


def grpc_data_frames_many(uint32_t sid, list messages, Py_ssize_t max_frame,
                          bint end_stream=False):
    """Length-prefixed messages already cut into DATA frames, for a sender that knows the
    flow-control window covers them all. Returns (frames, flow-controlled byte count)."""
    cdef Py_ssize_t total = _check_bytes_list(messages)
    cdef bytes body = PyBytes_FromStringAndSize(NULL, total)
    _write_prefixed(<uint8_t *>PyBytes_AS_STRING(body), messages, False)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _data_frames_size(total, max_frame))
    _write_data_frames(<uint8_t *>PyBytes_AS_STRING(out), sid,
                       <const uint8_t *>PyBytes_AS_STRING(body), total, max_frame, end_stream)
    return out, total


def unary_response(uint32_t sid, const uint8_t[::1] headers, const uint8_t[::1] message,
                   const uint8_t[::1] trailers, Py_ssize_t max_frame, bint compressed=False):
    """A whole unary response in one buffer: HEADERS, the message in DATA frames, and the
    trailers as HEADERS with END_STREAM. The caller has checked the send windows."""
    cdef Py_ssize_t hn = headers.shape[0], mn = message.shape[0], tn = trailers.shape[0]
    return _unary_response(sid, &headers[0] if hn else NULL, hn, &message[0] if mn else NULL,
                           mn, &trailers[0] if tn else NULL, tn, max_frame, compressed)


cdef bytes _unary_response(uint32_t sid, const uint8_t *headers, Py_ssize_t hn,
                           const uint8_t *message, Py_ssize_t mn, const uint8_t *trailers,
                           Py_ssize_t tn, Py_ssize_t max_frame, bint compressed):
    cdef Py_ssize_t body = 5 + mn
    cdef Py_ssize_t size = (_data_frames_size(hn, max_frame) + _data_frames_size(body, max_frame)
                            + _data_frames_size(tn, max_frame))
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t *o = <uint8_t *>PyBytes_AS_STRING(out)
    cdef Py_ssize_t w = 0
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t chunk
    cdef uint8_t prefix[5]
    w += _write_header_frames(o, sid, headers, hn, max_frame, False)
    # The prefix and the message go out as one logical DATA payload without first
    # concatenating them in a temporary buffer.
    _put_prefix(prefix, compressed, <uint32_t>mn)
    while pos < body:
        chunk = body - pos
        if chunk > max_frame:
            chunk = max_frame
        _put_header(o + w, <uint32_t>chunk, FT_DATA, 0, sid)
        w += 9
        _copy_prefixed(o + w, prefix, message, pos, chunk)
        w += chunk
        pos += chunk
    w += _write_header_frames(o + w, sid, trailers, tn, max_frame, True)
    return out[:w] if w != size else out


cdef inline void _copy_prefixed(uint8_t *dst, const uint8_t *prefix, const uint8_t *msg,
                                Py_ssize_t pos, Py_ssize_t n) noexcept nogil:
    # Copy bytes [pos, pos+n) of the virtual buffer prefix(5) + msg.
    cdef Py_ssize_t k
    while n > 0 and pos < 5:
        dst[0] = prefix[pos]
        dst += 1
        pos += 1
        n -= 1
    if n > 0:
        memcpy(dst, msg + (pos - 5), n)


class CompressedMessage(bytes):
    """A received message whose compressed flag was set: still in the stream's
    grpc-encoding, to be decompressed by the caller."""
    __slots__ = ()


cdef enum:
    _ASSEMBLE_MIN = 65536       # a message this large is assembled in place as it arrives
    _HEAD_BYTES = 256           # of an oversize message, kept for its refusal


cdef class GrpcDeframer:
    """Reassembles length-prefixed messages from DATA payloads of any size. `feed` returns
    the complete messages as a list: plain `bytes`, or `CompressedMessage` for those whose
    compressed flag was set. A large uncompressed message that spans payloads is copied
    once, into the bytes object it is returned as, as its parts arrive."""

    def __cinit__(self, Py_ssize_t max_message=4 * 1024 * 1024):
        self._buf = bytearray()
        self.max_message = max_message
        self.any_compressed = False
        self._msg = None

    @property
    def pending(self):
        """Bytes of an incomplete message held back (0 at a clean message boundary)."""
        return len(self._buf) + (5 + self._have if self._msg is not None else 0)

    @property
    def reserved(self):
        """Memory held for incomplete input: the buffered bytes, plus the whole announced
        length of a large message being assembled in place (allocated when its prefix
        arrived). The transport caps the sum over a connection's streams with it."""
        return len(self._buf) + (5 + self._msg_len if self._msg is not None else 0)

    def feed(self, data):
        cdef list out = []
        cdef const uint8_t[::1] view = data
        cdef Py_ssize_t used, take, n = view.shape[0]
        if self._msg is not None:
            take = self._msg_len - self._have
            if take > n:
                take = n
            if take:
                memcpy(PyBytes_AS_STRING(self._msg) + self._have, &view[0], take)
            self._have += take
            if self._have < self._msg_len:
                return out
            out.append(self._msg)
            self._msg = None
            if take == n:
                return out
            view = view[take:]
        if self._buf:
            self._buf += view
            # No local memoryview here: the bytearray cannot shrink while one is exported.
            used = self._split(self._buf, out)
            if len(self._buf) - used >= 5 and self._start(self._buf, used):
                self._buf.clear()
            else:
                del self._buf[:used]
        else:
            used = self._split(view, out)
            if used < view.shape[0] and not (view.shape[0] - used >= 5
                                             and self._start(view, used)):
                self._buf += view[used:]
        return out

    cdef bint _start(self, const uint8_t[::1] view, Py_ssize_t pos) except -1:
        """Begin assembling the incomplete message at ``view[pos:]`` (its prefix whole, and
        already checked by _split) in place, if it is large and uncompressed."""
        cdef uint32_t length = _u32(&view[pos + 1])
        cdef Py_ssize_t have = view.shape[0] - pos - 5
        if view[pos] or length < _ASSEMBLE_MIN:
            return False
        self._msg = PyBytes_FromStringAndSize(NULL, length)
        self._msg_len = length
        self._have = have
        if have:
            memcpy(PyBytes_AS_STRING(self._msg), &view[pos + 5], have)
        return True

    cdef Py_ssize_t _split(self, const uint8_t[::1] view, list out) except -1:
        cdef Py_ssize_t n = view.shape[0]
        cdef Py_ssize_t pos = 0
        cdef uint32_t length
        cdef const uint8_t *p
        if n == 0:
            return 0
        p = &view[0]
        while n - pos >= 5:
            length = _u32(p + pos + 1)
            if length > self.max_message:
                raise GrpcMessageTooLarge(length, self.max_message,
                                          PyBytes_FromStringAndSize(
                                              <const char *>(p + pos + 5),
                                              min(n - pos - 5, _HEAD_BYTES)))
            if p[pos] > 1:
                raise ValueError("invalid gRPC compressed flag %d" % p[pos])
            if n - pos - 5 < length:
                break
            if p[pos]:
                self.any_compressed = True
                out.append(CompressedMessage(
                    PyBytes_FromStringAndSize(<const char *>(p + pos + 5), length)))
            else:
                out.append(PyBytes_FromStringAndSize(<const char *>(p + pos + 5), length))
            pos += 5 + length
        return pos
