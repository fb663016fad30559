# Protobuf wire primitives (wire types, varints) for the modules that read or write protobuf
# bytes in C: the batch encoder here, the broker's stamping and canonical rewrite. Only
# inline functions, so this .pxd has no module behind it: each caller compiles them in.

from libc.stdint cimport uint8_t, uint64_t

cdef enum:
    _WT_VARINT = 0
    _WT_I64 = 1
    _WT_LEN = 2
    _WT_SGROUP = 3
    _WT_EGROUP = 4
    _WT_I32 = 5


cdef inline Py_ssize_t _varint_size(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline Py_ssize_t _put_varint(uint8_t *o, uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 0
    while v >= 0x80:
        o[n] = <uint8_t>((v & 0x7F) | 0x80)
        v >>= 7
        n += 1
    o[n] = <uint8_t>v
    return n + 1


cdef inline bint _get_varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos,
                             uint64_t *out) noexcept nogil:
    # As upb: at most 10 bytes, the bits beyond 64 ignored.
    cdef uint64_t v = 0
    cdef Py_ssize_t i = pos[0]
    cdef int shift = 0
    cdef uint8_t b
    while i < end and shift < 70:
        b = p[i]
        i += 1
        v |= <uint64_t>(b & 0x7F) << shift
        if b < 0x80:
            pos[0] = i
            out[0] = v
            return True
        shift += 7
    return False
