# cython: language_level=3
# HTTP/2 frame codec (RFC 9113 section 4 and 6): parsing with the connection-level checks a
# frame can be judged on alone, and serialisation of every frame the broker sends. Stream
# state, HPACK and flow-control policy live in danube/rpc; this file only turns bytes into
# frames and back, which is the part that runs once per frame on the data path. The frame types,
# flags and the helpers other modules use are declared in http2.pxd.

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcpy, memcmp
from libc.stdint cimport uint8_t, uint32_t

# Error codes (RFC 9113 section 7).
E_NO_ERROR = 0x0
E_PROTOCOL_ERROR = 0x1
E_INTERNAL_ERROR = 0x2
E_FLOW_CONTROL_ERROR = 0x3
E_SETTINGS_TIMEOUT = 0x4
E_STREAM_CLOSED = 0x5
E_FRAME_SIZE_ERROR = 0x6
E_REFUSED_STREAM = 0x7
E_CANCEL = 0x8
E_COMPRESSION_ERROR = 0x9
E_ENHANCE_YOUR_CALM = 0xB

DATA = FT_DATA
HEADERS = FT_HEADERS
PRIORITY = FT_PRIORITY
RST_STREAM = FT_RST_STREAM
SETTINGS = FT_SETTINGS
PUSH_PROMISE = FT_PUSH_PROMISE
PING = FT_PING
GOAWAY = FT_GOAWAY
WINDOW_UPDATE = FT_WINDOW_UPDATE
CONTINUATION = FT_CONTINUATION
FLAG_END_STREAM = FL_END_STREAM
FLAG_ACK = FL_ACK
FLAG_END_HEADERS = FL_END_HEADERS
FLAG_PADDED = FL_PADDED
FLAG_PRIORITY = FL_PRIORITY

CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
cdef bytes _PREFACE = CLIENT_PREFACE
cdef Py_ssize_t _PREFACE_LEN = 24


class H2ConnectionError(Exception):
    """A connection error: the peer broke the protocol and the connection must end with
    GOAWAY carrying `code`."""

    def __init__(self, int code, str message):
        super().__init__(message)
        self.code = code


cdef class FrameReader:
    """Incremental frame parser. `feed(data)` returns the list of complete frames as
    `(type, flags, stream_id, payload, flow_len)` tuples: padding and priority fields are
    already stripped from `payload`, and `flow_len` is what the frame costs in flow control.
    Unknown frame types are dropped, as the RFC requires. Raises H2ConnectionError."""

    def __cinit__(self, unsigned int max_frame_size=16384, bint expect_preface=False):
        self._buf = bytearray()
        self.max_frame_size = max_frame_size
        self.expect_preface = expect_preface

    @property
    def buffered(self):
        return len(self._buf)

    def feed(self, data):
        cdef list out = []
        cdef const uint8_t[::1] view
        cdef Py_ssize_t used
        if self._buf:
            self._buf += data
            # No local memoryview here: the bytearray cannot shrink while one is exported.
            used = self._parse(self._buf, out)
            del self._buf[:used]
        else:
            view = data
            used = self._parse(view, out)
            if used < view.shape[0]:
                self._buf += view[used:]
        return out

    cdef Py_ssize_t _parse(self, const uint8_t[::1] view, list out) except -1:
        cdef Py_ssize_t n = view.shape[0]
        cdef Py_ssize_t pos = 0
        cdef const uint8_t *p
        cdef uint32_t length, sid
        cdef int ftype, flags, pad
        cdef Py_ssize_t start, end
        if n == 0:
            return 0
        p = &view[0]
        if self.expect_preface:
            if n < _PREFACE_LEN:
                if memcmp(p, PyBytes_AS_STRING(_PREFACE), n) != 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "invalid HTTP/2 client preface")
                return 0
            if memcmp(p, PyBytes_AS_STRING(_PREFACE), _PREFACE_LEN) != 0:
                raise H2ConnectionError(E_PROTOCOL_ERROR, "invalid HTTP/2 client preface")
            pos = _PREFACE_LEN
            self.expect_preface = False
        while n - pos >= 9:
            length = (<uint32_t>p[pos] << 16) | (<uint32_t>p[pos + 1] << 8) | p[pos + 2]
            if length > self.max_frame_size:
                raise H2ConnectionError(
                    E_FRAME_SIZE_ERROR,
                    "frame of %d bytes exceeds SETTINGS_MAX_FRAME_SIZE %d"
                    % (length, self.max_frame_size))
            if n - pos - 9 < length:
                break
            ftype = p[pos + 3]
            flags = p[pos + 4]
            sid = _u32(p + pos + 5) & 0x7FFFFFFF
            start = pos + 9
            end = start + length
            pos = end
            if ftype == FT_DATA or ftype == FT_HEADERS:
                if sid == 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "DATA/HEADERS frame on stream 0")
                if flags & FL_PADDED:
                    if length < 1:
                        raise H2ConnectionError(E_FRAME_SIZE_ERROR, "padded frame too short")
                    pad = p[start]
                    start += 1
                    if pad > end - start:
                        raise H2ConnectionError(E_PROTOCOL_ERROR, "padding exceeds frame payload")
                    end -= pad
                if ftype == FT_HEADERS and flags & FL_PRIORITY:
                    if end - start < 5:
                        raise H2ConnectionError(E_FRAME_SIZE_ERROR,
                                                "HEADERS priority block truncated")
                    start += 5
            elif ftype == FT_CONTINUATION:
                if sid == 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "CONTINUATION frame on stream 0")
            elif ftype == FT_SETTINGS:
                if sid != 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "SETTINGS frame on a stream")
                if length % 6 != 0 or (flags & FL_ACK and length != 0):
                    raise H2ConnectionError(E_FRAME_SIZE_ERROR, "bad SETTINGS frame length")
            elif ftype == FT_PING:
                if sid != 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "PING frame on a stream")
                if length != 8:
                    raise H2ConnectionError(E_FRAME_SIZE_ERROR, "PING frame must be 8 bytes")
            elif ftype == FT_GOAWAY:
                if sid != 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "GOAWAY frame on a stream")
                if length < 8:
                    raise H2ConnectionError(E_FRAME_SIZE_ERROR, "GOAWAY frame too short")
            elif ftype == FT_WINDOW_UPDATE:
                if length != 4:
                    raise H2ConnectionError(E_FRAME_SIZE_ERROR, "WINDOW_UPDATE must be 4 bytes")
            elif ftype == FT_RST_STREAM:
                if sid == 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "RST_STREAM on stream 0")
                if length != 4:
                    raise H2ConnectionError(E_FRAME_SIZE_ERROR, "RST_STREAM must be 4 bytes")
            elif ftype == FT_PRIORITY:
                if sid == 0:
                    raise H2ConnectionError(E_PROTOCOL_ERROR, "PRIORITY on stream 0")
                if length != 5:
                    raise H2ConnectionError(E_FRAME_SIZE_ERROR, "PRIORITY must be 5 bytes")
                continue
            elif ftype == FT_PUSH_PROMISE:
                pass
            else:
                continue
            out.append((ftype, flags, sid,
                        PyBytes_FromStringAndSize(<const char *>(p + start), end - start),
                        length))
        return pos


def parse_settings(const uint8_t[::1] payload):
    """SETTINGS payload -> list of (identifier, value)."""
    cdef list out = []
    cdef Py_ssize_t i
    for i in range(0, payload.shape[0] - 5, 6):
        out.append(((<int>payload[i] << 8) | payload[i + 1], _u32(&payload[i + 2])))
    return out


def parse_u32(const uint8_t[::1] payload, Py_ssize_t pos=0):
    """Big-endian u32 at `pos` (WINDOW_UPDATE increments, RST_STREAM and GOAWAY codes)."""
    if payload.shape[0] < pos + 4:
        raise ValueError("payload too short for a 32-bit field")
    return _u32(&payload[pos])


cpdef bytes frame(int ftype, int flags, uint32_t sid, const uint8_t[::1] payload=None):
    """One frame, whole."""
    cdef Py_ssize_t n = payload.shape[0] if payload is not None else 0
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 9 + n)
    cdef uint8_t *o = <uint8_t *>PyBytes_AS_STRING(out)
    _put_header(o, <uint32_t>n, ftype, flags, sid)
    if n:
        memcpy(o + 9, &payload[0], n)
    return out


def settings_frame(settings, bint ack=False):
    cdef bytearray body = bytearray()
    for ident, value in settings:
        body += (<int>ident).to_bytes(2, "big") + (<uint32_t>value).to_bytes(4, "big")
    return frame(FT_SETTINGS, FL_ACK if ack else 0, 0, bytes(body))


def window_update_frame(uint32_t sid, uint32_t increment):
    return frame(FT_WINDOW_UPDATE, 0, sid, (increment & 0x7FFFFFFF).to_bytes(4, "big"))


def rst_stream_frame(uint32_t sid, uint32_t code):
    return frame(FT_RST_STREAM, 0, sid, code.to_bytes(4, "big"))


def goaway_frame(uint32_t last_sid, uint32_t code, bytes debug=b""):
    return frame(FT_GOAWAY, 0, 0, (last_sid & 0x7FFFFFFF).to_bytes(4, "big")
                 + code.to_bytes(4, "big") + debug)


def ping_frame(bytes opaque, bint ack=False):
    return frame(FT_PING, FL_ACK if ack else 0, 0, opaque)


cdef Py_ssize_t _write_data_frames(uint8_t *o, uint32_t sid, const uint8_t *src, Py_ssize_t n,
                                   Py_ssize_t max_frame, bint end_stream) noexcept nogil:
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t chunk
    cdef Py_ssize_t w = 0
    while True:
        chunk = n - pos
        if chunk > max_frame:
            chunk = max_frame
        _put_header(o + w, <uint32_t>chunk, FT_DATA,
                    FL_END_STREAM if (end_stream and pos + chunk == n) else 0, sid)
        if chunk:
            memcpy(o + w + 9, src + pos, chunk)
        w += 9 + chunk
        pos += chunk
        if pos >= n:
            return w


def data_frames(uint32_t sid, const uint8_t[::1] data, Py_ssize_t start, Py_ssize_t length,
                Py_ssize_t max_frame, bint end_stream=False):
    """`data[start:start+length]` as DATA frames of at most `max_frame` bytes; one empty
    frame when length is 0 (used to carry END_STREAM)."""
    if start < 0 or length < 0 or start + length > data.shape[0]:
        raise ValueError("data range out of bounds")
    if max_frame < 1:
        raise ValueError("max_frame must be positive")
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _data_frames_size(length, max_frame))
    cdef const uint8_t *src = &data[start] if length else NULL
    _write_data_frames(<uint8_t *>PyBytes_AS_STRING(out), sid, src, length, max_frame, end_stream)
    return out


cdef Py_ssize_t _write_header_frames(uint8_t *o, uint32_t sid, const uint8_t *src, Py_ssize_t n,
                                     Py_ssize_t max_frame, bint end_stream) noexcept nogil:
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t chunk
    cdef Py_ssize_t w = 0
    cdef int ftype = FT_HEADERS
    cdef int flags
    while True:
        chunk = n - pos
        if chunk > max_frame:
            chunk = max_frame
        flags = FL_END_STREAM if (end_stream and ftype == FT_HEADERS) else 0
        if pos + chunk == n:
            flags |= FL_END_HEADERS
        _put_header(o + w, <uint32_t>chunk, ftype, flags, sid)
        if chunk:
            memcpy(o + w + 9, src + pos, chunk)
        w += 9 + chunk
        pos += chunk
        ftype = FT_CONTINUATION
        if pos >= n:
            return w


def header_frames(uint32_t sid, const uint8_t[::1] block, Py_ssize_t max_frame,
                  bint end_stream=False):
    """An HPACK block as HEADERS plus as many CONTINUATION frames as it needs."""
    cdef Py_ssize_t n = block.shape[0]
    cdef bytes out = PyBytes_FromStringAndSize(NULL, _data_frames_size(n, max_frame))
    _write_header_frames(<uint8_t *>PyBytes_AS_STRING(out), sid, &block[0] if n else NULL, n,
                         max_frame, end_stream)
    return out


cdef inline Py_ssize_t _hpack_skip_int(const uint8_t[::1] block, Py_ssize_t i, int prefix_mask,
                                       Py_ssize_t *value) noexcept nogil:
    # Returns the position after an HPACK integer starting at i, or -1 if truncated.
    cdef Py_ssize_t n = block.shape[0]
    cdef Py_ssize_t v = block[i] & prefix_mask
    cdef int shift = 0
    i += 1
    if v == prefix_mask:
        while True:
            if i >= n or shift > 28:
                return -1
            v += (block[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not (block[i - 1] & 0x80):
                break
    value[0] = v
    return i


#: The last index of HPACK's static table (RFC 7541 Appendix A); above it, the dynamic table.
DEF _HPACK_STATIC_LAST = 61


def hpack_table_neutral(const uint8_t[::1] block):
    """True when decoding this HPACK block cannot change the decoder's dynamic table: it
    holds only indexed fields and literals without indexing or never indexed (RFC 7541 6.1,
    6.2.2, 6.2.3), and no table-size update. Such a block decodes to the same fields for as
    long as the table is unchanged, so its result can be cached by the block's bytes."""
    return _hpack_walk(block, False)


def hpack_static_only(const uint8_t[::1] block):
    """``hpack_table_neutral``, and every index (of a field or of a literal's name) is in
    the static table: the block decodes to the same fields on every connection, whatever
    its dynamic table holds (danube.rpc.headers shares their parsed form)."""
    return _hpack_walk(block, True)


cdef bint _hpack_walk(const uint8_t[::1] block, bint static_only) noexcept:
    cdef Py_ssize_t n = block.shape[0]
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t v = 0
    cdef int k
    cdef uint8_t b
    if n == 0:
        return False
    while i < n:
        b = block[i]
        if b & 0x80:
            i = _hpack_skip_int(block, i, 0x7F, &v)
            if static_only and not 0 < v <= _HPACK_STATIC_LAST:
                return False
        elif b & 0xE0 == 0x00 or b & 0xF0 == 0x10:
            i = _hpack_skip_int(block, i, 0x0F, &v)
            if i < 0 or static_only and v > _HPACK_STATIC_LAST:
                return False
            # A literal name (index 0) then the value: two length-prefixed strings, or one.
            for k in range(2 if v == 0 else 1):
                if i >= n:
                    return False
                i = _hpack_skip_int(block, i, 0x7F, &v)
                if i < 0 or i + v > n:
                    return False
                i += v
        else:
            return False
        if i < 0:
            return False
    return True

