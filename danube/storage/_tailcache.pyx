# cython: language_level=3
"""The newest payloads of a WAL by offset (TailCache), for ``danube.storage.wal``: readers near
the head are served from memory without touching the segments. Packed batches are checked with
the frame codec's ``_ends_ptr``, as ``encode_frames_packed`` checks them."""

from cpython.buffer cimport PyBuffer_Release
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_CheckExact, \
    PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport uint64_t

from danube.storage._walframes cimport _ends_ptr

#: The ring's first size (it doubles up to the capacity as the log holds more).
cdef enum:
    INITIAL = 16


cdef class TailCache:
    """The newest ``capacity`` payloads of a log, by offset (a ring indexed by offset modulo
    its size). Readers near the head are served from here without touching the segments.
    Payloads appended as bytes objects are served as those very objects, without a copy;
    payloads appended packed in one buffer (``extend_packed``) are kept as a reference to
    that buffer and copied out only when read.

    The ring starts with room for ``INITIAL`` payloads and doubles, up to ``capacity``, as
    the log holds more: a broker with a hundred thousand quiet topics pays for a few slots
    each, not ``capacity`` (24 KiB at the default 1,024)."""

    def __cinit__(self, Py_ssize_t capacity, long long next_offset=0):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        cdef Py_ssize_t size = capacity if capacity < INITIAL else INITIAL
        self._start = <Py_ssize_t *>PyMem_Malloc((size + 1) * sizeof(Py_ssize_t))
        self._len = <Py_ssize_t *>PyMem_Malloc((size + 1) * sizeof(Py_ssize_t))
        if self._start == NULL or self._len == NULL:
            raise MemoryError()
        self._size = size

    def __dealloc__(self):
        PyMem_Free(self._start)
        PyMem_Free(self._len)

    def __init__(self, Py_ssize_t capacity, long long next_offset=0):
        self._cap = capacity
        self._slots = [None] * self._size
        self._first = self._next = next_offset

    cdef int _room(self, Py_ssize_t n) except -1:
        """Grow the ring (up to the capacity) so that it can hold what it holds plus ``n``."""
        cdef Py_ssize_t held = self._next - self._first, want, i, old, new
        cdef long long o
        if held + n <= self._size or self._size >= self._cap:
            return 0
        want = self._size * 2
        if want < held + n:
            want = held + n
        if want > self._cap:
            want = self._cap
        cdef Py_ssize_t *start = <Py_ssize_t *>PyMem_Malloc((want + 1) * sizeof(Py_ssize_t))
        cdef Py_ssize_t *length = <Py_ssize_t *>PyMem_Malloc((want + 1) * sizeof(Py_ssize_t))
        if start == NULL or length == NULL:
            PyMem_Free(start)
            PyMem_Free(length)
            raise MemoryError()
        slots = [None] * want
        for o in range(self._first, self._next):
            old = o % self._size
            new = o % want
            slots[new] = self._slots[old]
            start[new] = self._start[old]
            length[new] = self._len[old]
        PyMem_Free(self._start)
        PyMem_Free(self._len)
        self._start, self._len, self._slots, self._size = start, length, slots, want
        return 0

    @property
    def capacity(self):
        return self._cap

    @property
    def first_offset(self):
        """Oldest offset held (== next_offset when empty)."""
        return self._first

    @property
    def next_offset(self):
        return self._next

    def __len__(self):
        return self._next - self._first

    def reset(self, long long next_offset):
        """Drop everything; the next extend must start at ``next_offset``."""
        cdef Py_ssize_t i
        for i in range(self._size):
            self._slots[i] = None
        self._first = self._next = next_offset

    cdef void _advance(self, long long first_offset, Py_ssize_t n):
        self._next = first_offset + n
        if self._next - self._first > self._size:
            self._first = self._next - self._size

    def extend(self, long long first_offset, payloads):
        """Add payloads at ``first_offset, first_offset + 1, ...``; a batch that does not
        continue the cache restarts it. Non-bytes payloads are stored as bytes copies."""
        cdef Py_ssize_t i, n, start, slot
        seq = payloads if type(payloads) is list or type(payloads) is tuple else list(payloads)
        n = len(seq)
        if first_offset != self._next:
            self.reset(first_offset)
        self._room(n)
        cdef list slots = self._slots
        if self._size:
            start = n - self._size if n > self._size else 0
            for i in range(start, n):
                obj = seq[i]
                if not PyBytes_CheckExact(obj):
                    obj = bytes(obj)
                slot = (first_offset + i) % self._size
                slots[slot] = obj
                self._start[slot] = -1
        self._advance(first_offset, n)

    def extend_packed(self, long long first_offset, bytes data, ends):
        """``extend`` with payloads packed back to back in ``data`` (bytes), payload ``i``
        ending at ``ends[i]`` (a uint64 array, as ``encode_frames_packed`` takes)."""
        cdef Py_buffer ev
        cdef const uint64_t *e = _ends_ptr(ends, &ev, PyBytes_GET_SIZE(data))
        cdef Py_ssize_t i, n = ev.shape[0], first, slot
        cdef list slots
        try:
            if first_offset != self._next:
                self.reset(first_offset)
            self._room(n)
            slots = self._slots
            if self._size:
                first = n - self._size if n > self._size else 0
                for i in range(first, n):
                    slot = (first_offset + i) % self._size
                    slots[slot] = data
                    self._start[slot] = <Py_ssize_t>e[i - 1] if i else 0
                    self._len[slot] = <Py_ssize_t>e[i] - self._start[slot]
            self._advance(first_offset, n)
        finally:
            PyBuffer_Release(&ev)

    def read(self, long long from_offset, Py_ssize_t max_messages, long long max_bytes=-1):
        """``[(offset, payload), ...]`` from ``from_offset`` (limits as ``read_frames``), or
        None when ``from_offset`` is older than what the cache holds. Empty at the head."""
        cdef list out = [], slots = self._slots
        cdef long long o = from_offset, nbytes = 0
        cdef Py_ssize_t ln, count = 0, slot
        if from_offset < self._first or from_offset > self._next:
            return None
        while o < self._next and count < max_messages:
            slot = o % self._size
            obj = slots[slot]
            ln = PyBytes_GET_SIZE(obj) if self._start[slot] < 0 else self._len[slot]
            if count and max_bytes >= 0 and nbytes + ln > max_bytes:
                break
            if self._start[slot] >= 0:
                obj = PyBytes_FromStringAndSize(PyBytes_AS_STRING(obj) + self._start[slot], ln)
            out.append((o, obj))
            nbytes += ln
            count += 1
            o += 1
        return out
