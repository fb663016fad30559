# A received danube_ext.MessageBatch, indexed in C (see _stamp.pyx).

from libc.stdint cimport uint8_t, uint64_t


cdef class MessageBatchView:
    cdef readonly bytes body
    cdef readonly unsigned long long request_id
    cdef readonly unsigned long long producer_id
    cdef readonly bint offsets_as_range
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t max_payload     # the largest payload (0 when empty)
    cdef readonly Py_ssize_t payload_bytes   # all payloads together
    cdef Py_ssize_t *_start
    cdef Py_ssize_t *_len
    cdef uint8_t *_has_msg_id
    cdef Py_ssize_t _cap

    cdef int _add(self, Py_ssize_t start, Py_ssize_t length, bint has_msg_id) except -1
    cdef void _schema_fields(self, Py_ssize_t i, bint *has_id, uint64_t *schema_id,
                             uint64_t *version, Py_ssize_t *pstart,
                             Py_ssize_t *plen) noexcept
