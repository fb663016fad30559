# gRPC length-prefixed framing's C interface: the 5-byte prefix writer (inline, for the
# broker's outboxes, which frame messages straight into their buffers) and the deframer.

from libc.stdint cimport uint8_t, uint32_t


cdef inline void _put_prefix(uint8_t *o, bint compressed, uint32_t n) noexcept nogil:
    o[0] = 1 if compressed else 0
    o[1] = (n >> 24) & 0xFF
    o[2] = (n >> 16) & 0xFF
    o[3] = (n >> 8) & 0xFF
    o[4] = n & 0xFF


# A whole unary response (HEADERS, the length-prefixed message in DATA, trailers) in one
# buffer; the lone-call path of danube/rpc builds it from C pointers.
cdef bytes _unary_response(uint32_t sid, const uint8_t *headers, Py_ssize_t hn,
                           const uint8_t *message, Py_ssize_t mn, const uint8_t *trailers,
                           Py_ssize_t tn, Py_ssize_t max_frame, bint compressed)


cdef class GrpcDeframer:
    cdef bytearray _buf
    cdef public Py_ssize_t max_message
    cdef public bint any_compressed
    cdef bytes _msg             # the large message being assembled, or None
    cdef Py_ssize_t _msg_len
    cdef Py_ssize_t _have       # bytes of _msg filled so far

    cdef bint _start(self, const uint8_t[::1] view, Py_ssize_t pos) except -1
    cdef Py_ssize_t _split(self, const uint8_t[::1] view, list out) except -1
