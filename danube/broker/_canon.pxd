# The canonical rewrite's C interface, for the outboxes (_fanout.pyx) that rewrite a reliable
# topic's stored frames as they frame them for a consumer.

from libc.stdint cimport uint8_t, uint64_t

from danube.codec.streammsg cimport SM_LAST_FIELD

# What a stamp does to msg_id.topic_name / msg_id.broker_addr.
cdef enum:
    ID_KEEP = 0        # what the message says
    ID_DEFAULT = 1     # the stamp's value where no msg_id of the message sets the field
    ID_SET = 2         # the stamp's value
    ID_CLEAR = 3       # empty (left out)

cdef struct _Str:
    const uint8_t *p
    Py_ssize_t n
    bint present


cdef struct _Decoded:
    # Top-level fields other than msg_id and attributes: the last occurrence (tag
    # included), start -1 when absent.
    Py_ssize_t start[SM_LAST_FIELD + 1]
    Py_ssize_t end[SM_LAST_FIELD + 1]
    bint zero[SM_LAST_FIELD + 1]
    # attributes (map entries, repeated field 7): where the first starts and the last ends,
    # whether other fields come between them, and their bytes in all.
    Py_ssize_t attrs_first
    Py_ssize_t attrs_end
    Py_ssize_t attrs_bytes
    bint attrs_split
    # msg_id, every occurrence merged.
    bint has_id
    bint has_pid
    bint has_off
    uint64_t pid
    uint64_t off
    _Str tn
    _Str ba
    # The bytes are already in canonical form.
    bint canonical


cdef struct _Stamp:
    int tn_mode
    int ba_mode
    _Str tn
    _Str ba
    bint set_pid
    bint set_off
    uint64_t pid
    uint64_t off
    bint set_pn          # producer_name
    _Str pn
    bint makes_id        # a message without msg_id gets one


cdef struct _Id:
    bint present
    uint64_t pid
    uint64_t off
    _Str tn
    _Str ba
    Py_ssize_t inner      # encoded size of its fields


cdef bint _decode(const uint8_t *p, Py_ssize_t n, _Decoded *d) noexcept nogil
cdef Py_ssize_t _canon_size(_Decoded *d, _Stamp *s, _Id *mid) noexcept nogil
cdef Py_ssize_t _canon_write(const uint8_t *p, Py_ssize_t n, _Decoded *d, _Stamp *s,
                             _Id *mid, uint8_t *o) noexcept nogil


cdef class DeliveryStamp:
    cdef readonly bytes topic_name
    cdef readonly bytes broker_addr
    cdef _Stamp _s
