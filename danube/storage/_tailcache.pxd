# The WAL tail cache's extension type (see _tailcache.pyx).


cdef class TailCache:
    cdef list _slots            # the payload (bytes), or the packed buffer holding it
    cdef Py_ssize_t *_start     # where the payload starts in its packed buffer, -1: bytes
    cdef Py_ssize_t *_len
    cdef Py_ssize_t _cap         # the most it may hold
    cdef Py_ssize_t _size       # the ring's size now (grows up to _cap)
    cdef long long _first       # oldest offset held
    cdef long long _next        # one past the newest

    cdef void _advance(self, long long first_offset, Py_ssize_t n)
    cdef int _room(self, Py_ssize_t n) except -1
