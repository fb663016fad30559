# The HTTP/2 frame codec's C interface: frame types and flags, the header read/write helpers
# (inline, so a caller compiles them in) and the frame writers the gRPC framing builds on.

from libc.stdint cimport uint8_t, uint32_t

cdef enum:
    FT_DATA = 0
    FT_HEADERS = 1
    FT_PRIORITY = 2
    FT_RST_STREAM = 3
    FT_SETTINGS = 4
    FT_PUSH_PROMISE = 5
    FT_PING = 6
    FT_GOAWAY = 7
    FT_WINDOW_UPDATE = 8
    FT_CONTINUATION = 9

cdef enum:
    FL_END_STREAM = 0x1
    FL_ACK = 0x1
    FL_END_HEADERS = 0x4
    FL_PADDED = 0x8
    FL_PRIORITY = 0x20


cdef inline uint32_t _u32(const uint8_t *p) nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline void _put_header(uint8_t *p, uint32_t length, int ftype, int flags,
                             uint32_t sid) noexcept nogil:
    p[0] = (length >> 16) & 0xFF
    p[1] = (length >> 8) & 0xFF
    p[2] = length & 0xFF
    p[3] = <uint8_t>ftype
    p[4] = <uint8_t>flags
    p[5] = (sid >> 24) & 0x7F
    p[6] = (sid >> 16) & 0xFF
    p[7] = (sid >> 8) & 0xFF
    p[8] = sid & 0xFF


cdef inline Py_ssize_t _data_frames_size(Py_ssize_t n, Py_ssize_t max_frame) noexcept nogil:
    cdef Py_ssize_t frames = (n + max_frame - 1) // max_frame if n else 1
    return n + 9 * frames


cdef Py_ssize_t _write_data_frames(uint8_t *o, uint32_t sid, const uint8_t *src, Py_ssize_t n,
                                   Py_ssize_t max_frame, bint end_stream) noexcept nogil

cdef Py_ssize_t _write_header_frames(uint8_t *o, uint32_t sid, const uint8_t *src, Py_ssize_t n,
                                     Py_ssize_t max_frame, bint end_stream) noexcept nogil


cdef class FrameReader:
    cdef bytearray _buf
    cdef public unsigned int max_frame_size
    cdef public bint expect_preface

    cdef Py_ssize_t _parse(self, const uint8_t[::1] view, list out) except -1
