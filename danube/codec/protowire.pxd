# Protobuf wire primitives (wire types, varints, one field at a time) for the modules that
# read or write protobuf bytes in C: the batch encoder here, and the broker's stamping,
# canonical rewrite and columnar reads. Only inline functions, so this .pxd has no module
# behind it: each caller compiles them in.

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


cdef inline bint _skip_group(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos,
                             uint64_t field, int depth) noexcept nogil:
    # Groups are deprecated and never ours, but protobuf accepts them as unknown fields, so
    # a frame that protobuf parsed may hold one: skip it rather than call the frame broken.
    cdef uint64_t tag, v
    cdef int wt
    if depth > 64:
        return False
    while True:
        if not _get_varint(p, end, pos, &tag):
            return False
        wt = <int>(tag & 7)
        if tag >> 3 == 0:
            return False
        if wt == _WT_EGROUP:
            return (tag >> 3) == field
        if wt == _WT_SGROUP:
            if not _skip_group(p, end, pos, tag >> 3, depth + 1):
                return False
        elif wt == _WT_VARINT:
            if not _get_varint(p, end, pos, &v):
                return False
        elif wt == _WT_LEN:
            if not _get_varint(p, end, pos, &v) or v > <uint64_t>(end - pos[0]):
                return False
            pos[0] += <Py_ssize_t>v
        elif wt == _WT_I64 or wt == _WT_I32:
            v = 8 if wt == _WT_I64 else 4
            if v > <uint64_t>(end - pos[0]):
                return False
            pos[0] += <Py_ssize_t>v
        else:
            return False


cdef inline bint _field(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, uint64_t *field,
                        int *wt, uint64_t *value, Py_ssize_t *vstart, bint groups) noexcept nogil:
    """One field: its number, wire type and value (varint), or where its bytes start and
    how many (LEN, in ``value``). Fixed-width fields are skipped, and groups when ``groups``
    (else a group is malformed). False if malformed."""
    cdef uint64_t tag, n
    if not _get_varint(p, end, pos, &tag):
        return False
    field[0] = tag >> 3
    wt[0] = <int>(tag & 7)
    if field[0] == 0 or field[0] > 0x1FFFFFFF:
        return False
    if wt[0] == _WT_VARINT:
        return _get_varint(p, end, pos, value)
    if wt[0] == _WT_LEN:
        if not _get_varint(p, end, pos, &n) or n > <uint64_t>(end - pos[0]):
            return False
        vstart[0] = pos[0]
        value[0] = n
        pos[0] += <Py_ssize_t>n
        return True
    if wt[0] == _WT_SGROUP:
        return groups and _skip_group(p, end, pos, field[0], 1)
    if wt[0] == _WT_I64:
        n = 8
    elif wt[0] == _WT_I32:
        n = 4
    else:
        return False
    if n > <uint64_t>(end - pos[0]):
        return False
    pos[0] += <Py_ssize_t>n
    return True


cdef inline bint _read_field(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos,
                             uint64_t *field, int *wt, uint64_t *value,
                             Py_ssize_t *vstart) noexcept nogil:
    # Messages others wrote (stored frames): protobuf accepts groups as unknown fields, so
    # they are skipped.
    return _field(p, end, pos, field, wt, value, vstart, True)


cdef inline bint _read_plain_field(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos,
                                   uint64_t *field, int *wt, uint64_t *value,
                                   Py_ssize_t *vstart) noexcept nogil:
    # Requests in our own batch format, where no message has a group: one is malformed.
    return _field(p, end, pos, field, wt, value, vstart, False)
