# StreamMessage bytes built and amended without protobuf objects, for the batched publish
# path where per-message Python work is the bottleneck. Both rely on protobuf's wire rules:
# for a singular scalar field the last occurrence wins, and occurrences of an embedded
# message field are merged. So appending `msg_id { topic_offset: N }` to serialized bytes
# stamps the offset into the message's msg_id, keeping the fields the producer set.

from libc.stdint cimport uint64_t


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


def stamp_messages(list raws, unsigned long long first_offset, bytes msg_id_fields,
                   bytes extra=b""):
    """Return each serialized StreamMessage in `raws` with `extra` (serialized top-level
    fields, e.g. producer_name) and `msg_id { <msg_id_fields> topic_offset: first_offset+i }`
    appended, which protobuf merges into the message."""
    cdef Py_ssize_t i, n = len(raws), rn, inner, w
    cdef Py_ssize_t fn = len(msg_id_fields), en = len(extra)
    cdef uint64_t offset
    cdef bytes raw, out
    cdef uint8_t *o
    cdef list result = [None] * n
    for i in range(n):
        raw = <bytes?>raws[i]
        rn = PyBytes_GET_SIZE(raw)
        offset = first_offset + i
        inner = fn + 1 + _varint_size(offset)
        out = PyBytes_FromStringAndSize(NULL, rn + en + 1 + _varint_size(inner) + inner)
        o = <uint8_t *>PyBytes_AS_STRING(out)
        memcpy(o, PyBytes_AS_STRING(raw), rn)
        w = rn
        if en:
            memcpy(o + w, PyBytes_AS_STRING(extra), en)
            w += en
        o[w] = 0x12                        # field 2 (msg_id), length-delimited
        w += 1
        w += _put_varint(o + w, inner)
        if fn:
            memcpy(o + w, PyBytes_AS_STRING(msg_id_fields), fn)
            w += fn
        o[w] = 0x28                        # MsgID field 5 (topic_offset), varint
        w += 1
        _put_varint(o + w, offset)
        result[i] = out
    return result


def encode_stream_messages(list payloads, unsigned long long first_request_id,
                           unsigned long long publish_time, bytes msg_id, bytes producer_name):
    """Serialized StreamMessages {request_id, msg_id, payload, publish_time, producer_name}
    for plain payloads (no attributes, key or schema), identical to what protobuf encodes."""
    cdef Py_ssize_t i, n = len(payloads), pn, w, size
    cdef Py_ssize_t mn = len(msg_id), nn = len(producer_name)
    cdef uint64_t rid
    cdef bytes payload, out
    cdef uint8_t *o
    cdef list result = [None] * n
    for i in range(n):
        payload = <bytes?>payloads[i]
        pn = PyBytes_GET_SIZE(payload)
        rid = first_request_id + i
        size = 0
        if rid:
            size += 1 + _varint_size(rid)
        if mn:
            size += 1 + _varint_size(mn) + mn
        if pn:
            size += 1 + _varint_size(pn) + pn
        if publish_time:
            size += 1 + _varint_size(publish_time)
        if nn:
            size += 1 + _varint_size(nn) + nn
        out = PyBytes_FromStringAndSize(NULL, size)
        o = <uint8_t *>PyBytes_AS_STRING(out)
        w = 0
        if rid:
            o[w] = 0x08
            w += 1 + _put_varint(o + w + 1, rid)
        if mn:
            o[w] = 0x12
            w += 1
            w += _put_varint(o + w, mn)
            memcpy(o + w, PyBytes_AS_STRING(msg_id), mn)
            w += mn
        if pn:
            o[w] = 0x1A
            w += 1
            w += _put_varint(o + w, pn)
            memcpy(o + w, PyBytes_AS_STRING(payload), pn)
            w += pn
        if publish_time:
            o[w] = 0x20
            w += 1 + _put_varint(o + w + 1, publish_time)
        if nn:
            o[w] = 0x2A
            w += 1
            w += _put_varint(o + w, nn)
            memcpy(o + w, PyBytes_AS_STRING(producer_name), nn)
            w += nn
        result[i] = out
    return result
