# Consumers' outboxes and the subscriptions' fan-out objects (see _fanout.pyx).

from danube.broker._canon cimport DeliveryStamp


cdef class Outbox:
    cdef bytearray _buf
    cdef public Py_ssize_t limit
    cdef public Py_ssize_t count
    cdef public object on_ready
    cdef public bint enabled
    cdef public unsigned long long delivered
    cdef public unsigned long long delivered_bytes
    cdef public unsigned long long dropped
    cdef readonly bint batched
    cdef Py_ssize_t _open

    cpdef bint offer(self, bytes message, DeliveryStamp stamp=*) except -1
    cdef Py_ssize_t _reserve(self, Py_ssize_t n) except -1
    cdef void _close_batch(self) noexcept


cdef class Fanout:
    cdef public list outboxes
    cdef public unsigned long long dropped

    cpdef bint dispatch(self, bytes message, object key)


cdef class ActiveFanout(Fanout):
    pass


cdef class RoundRobinFanout(Fanout):
    cdef Py_ssize_t _next


cdef class KeySharedFanout(Fanout):
    cdef list _ring_hashes
    cdef list _ring_owner
    cdef list _matchers
    cdef dict _cache
    cdef public int vnodes
    cdef public unsigned long long unroutable
