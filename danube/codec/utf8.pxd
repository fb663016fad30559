# UTF-8 as protobuf and Avro require of a string: no overlong forms, no surrogates, nothing
# above U+10FFFF. For the modules that check strings in C without decoding them: the
# batched publish path's StreamMessages (broker/_stamp.pyx) and Avro datums
# (schema/_avrocheck.pyx). Only an inline function, so this .pxd has no module behind it.

from libc.stdint cimport uint8_t, uint64_t


cdef inline bint utf8_valid(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i = 0
    cdef uint8_t c
    cdef int more
    cdef uint64_t cp
    while i < n:
        c = p[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            more, cp = 1, c & 0x1F
        elif 0xE0 <= c <= 0xEF:
            more, cp = 2, c & 0x0F
        elif 0xF0 <= c <= 0xF4:
            more, cp = 3, c & 0x07
        else:
            return False
        i += 1
        while more:
            if i >= n or (p[i] & 0xC0) != 0x80:
                return False
            cp = (cp << 6) | (p[i] & 0x3F)
            i += 1
            more -= 1
        if cp > 0x10FFFF or (0xD800 <= cp <= 0xDFFF):
            return False
        if (cp < 0x800 and c >= 0xE0) or (cp < 0x10000 and c >= 0xF0):
            return False                      # overlong
    return True
