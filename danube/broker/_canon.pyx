# cython: language_level=3
# StreamMessage bytes in canonical form, built in C without protobuf objects: each singular
# field at most once, fields in number order, msg_id merged into one. Python's protobuf
# merges a repeated embedded message as the spec says, but other decoders (protobufjs keeps
# only the last msg_id) do not, so what the broker sends must not depend on merging.
#
# The form is what prost (upstream's encoder) writes for the decoded message: the merged
# values (a later scalar occurrence wins, msg_id occurrences merge field by field), zero
# values of plain scalars left out, proto3 `optional` fields kept when present, unknown
# fields and known numbers with the wrong wire type dropped (prost keeps neither).

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy

from danube.codec.protowire cimport (_WT_VARINT, _WT_LEN, _varint_size, _put_varint,
                                     _read_field)
from danube.codec.streammsg cimport *

# Wire type of each StreamMessage field by number (streammsg.pxd); -1: not a field of ours.
cdef int[SM_LAST_FIELD + 1] _SM_WT
_SM_WT[0] = -1
_SM_WT[SM_REQUEST_ID] = _WT_VARINT
_SM_WT[SM_MSG_ID] = _WT_LEN
_SM_WT[SM_PAYLOAD] = _WT_LEN
_SM_WT[SM_PUBLISH_TIME] = _WT_VARINT
_SM_WT[SM_PRODUCER_NAME] = _WT_LEN
_SM_WT[SM_SUBSCRIPTION_NAME] = _WT_LEN
_SM_WT[SM_ATTRIBUTES] = _WT_LEN
_SM_WT[SM_SCHEMA_ID] = _WT_VARINT
_SM_WT[SM_SCHEMA_VERSION] = _WT_VARINT
_SM_WT[SM_ROUTING_KEY] = _WT_LEN


cdef inline bint _decode_id(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                     _Decoded *d) noexcept nogil:
    cdef uint64_t field, value
    cdef uint64_t last = 0
    cdef int wt
    cdef Py_ssize_t vstart
    while pos < end:
        if not _read_field(p, end, &pos, &field, &wt, &value, &vstart):
            return False
        if field == MID_PRODUCER_ID and wt == _WT_VARINT:
            d.pid = value
            d.has_pid = True
        elif field == MID_TOPIC_OFFSET and wt == _WT_VARINT:
            d.off = value
            d.has_off = True
        elif (field == MID_TOPIC_NAME or field == MID_BROKER_ADDR) and wt == _WT_LEN:
            if field == MID_TOPIC_NAME:
                d.tn.p, d.tn.n, d.tn.present = p + vstart, <Py_ssize_t>value, True
            else:
                d.ba.p, d.ba.n, d.ba.present = p + vstart, <Py_ssize_t>value, True
        else:
            d.canonical = False
            continue
        if field <= last or value == 0:
            d.canonical = False
        last = field
    return True


cdef bint _decode(const uint8_t *p, Py_ssize_t n, _Decoded *d) noexcept nogil:
    """Index a serialized StreamMessage into ``d``. False if it is not well-formed."""
    cdef Py_ssize_t pos = 0, fstart, vstart = 0
    cdef uint64_t field, value, last = 0
    cdef int wt, i
    for i in range(SM_LAST_FIELD + 1):
        d.start[i] = -1
    d.attrs_first = -1
    d.attrs_end = d.attrs_bytes = 0
    d.attrs_split = d.has_id = d.has_pid = d.has_off = False
    d.pid = d.off = 0
    d.tn.present = d.ba.present = False
    d.tn.n = d.ba.n = 0
    d.canonical = True
    while pos < n:
        fstart = pos
        if not _read_field(p, n, &pos, &field, &wt, &value, &vstart):
            return False
        if field > SM_LAST_FIELD or _SM_WT[field] != wt:
            d.canonical = False
            continue
        if field < last or (field == last and field != SM_ATTRIBUTES):
            d.canonical = False
        last = field
        if field == SM_MSG_ID:
            if d.has_id:
                d.canonical = False
            d.has_id = True
            if not _decode_id(p, vstart, vstart + <Py_ssize_t>value, d):
                return False
        elif field == SM_ATTRIBUTES:
            if d.attrs_first < 0:
                d.attrs_first = fstart
            elif d.attrs_end != fstart:
                d.attrs_split = True
            d.attrs_end = pos
            d.attrs_bytes += pos - fstart
        else:
            d.start[field] = fstart
            d.end[field] = pos
            d.zero[field] = value == 0
            if value == 0 and field < SM_FIRST_OPTIONAL:
                d.canonical = False
    return True


cdef inline void _pick(_Str *out, _Str *own, int mode, _Str *stamp) noexcept nogil:
    if mode == ID_SET or (mode == ID_DEFAULT and not own.present):
        out[0] = stamp[0]
    elif mode == ID_CLEAR:
        out.n = 0
    else:
        out[0] = own[0]


cdef inline Py_ssize_t _str_size(Py_ssize_t n) noexcept nogil:
    return 1 + _varint_size(<uint64_t>n) + n if n else 0


cdef void _resolve(_Decoded *d, _Stamp *s, _Id *out) noexcept nogil:
    out.present = d.has_id or s.makes_id
    out.pid = s.pid if s.set_pid else d.pid
    out.off = s.off if s.set_off else d.off
    _pick(&out.tn, &d.tn, s.tn_mode, &s.tn)
    _pick(&out.ba, &d.ba, s.ba_mode, &s.ba)
    out.inner = _str_size(out.tn.n) + _str_size(out.ba.n)
    if out.pid:
        out.inner += 1 + _varint_size(out.pid)
    if out.off:
        out.inner += 1 + _varint_size(out.off)


cdef inline bint _kept(_Decoded *d, int f) noexcept nogil:
    return d.start[f] >= 0 and (f >= SM_FIRST_OPTIONAL or not d.zero[f])


cdef Py_ssize_t _canon_size(_Decoded *d, _Stamp *s, _Id *mid) noexcept nogil:
    cdef Py_ssize_t size = d.attrs_bytes
    cdef int f
    _resolve(d, s, mid)
    if mid.present:
        size += 1 + _varint_size(<uint64_t>mid.inner) + mid.inner
    for f in range(1, SM_LAST_FIELD + 1):
        if f == SM_MSG_ID or f == SM_ATTRIBUTES:
            continue
        if f == SM_PRODUCER_NAME and s.set_pn:
            size += _str_size(s.pn.n)
        elif _kept(d, f):
            size += d.end[f] - d.start[f]
    return size


cdef inline Py_ssize_t _put_str(uint8_t *o, uint8_t tag, _Str *v) noexcept nogil:
    if not v.n:
        return 0
    o[0] = tag
    cdef Py_ssize_t w = 1 + _put_varint(o + 1, <uint64_t>v.n)
    memcpy(o + w, v.p, v.n)
    return w + v.n


cdef Py_ssize_t _canon_write(const uint8_t *p, Py_ssize_t n, _Decoded *d, _Stamp *s,
                             _Id *mid, uint8_t *o) noexcept nogil:
    """Write the canonical form (``_canon_size`` bytes, which resolved ``mid``)."""
    cdef Py_ssize_t w = 0, pos, fstart, vstart = 0
    cdef uint64_t field, value
    cdef int f, wt
    for f in range(1, SM_LAST_FIELD + 1):
        if f == SM_MSG_ID:
            if not mid.present:
                continue
            o[w] = TAG_SM_MSG_ID
            w += 1
            w += _put_varint(o + w, <uint64_t>mid.inner)
            if mid.pid:
                o[w] = TAG_MID_PRODUCER_ID
                w += 1
                w += _put_varint(o + w, mid.pid)
            w += _put_str(o + w, TAG_MID_TOPIC_NAME, &mid.tn)
            w += _put_str(o + w, TAG_MID_BROKER_ADDR, &mid.ba)
            if mid.off:
                o[w] = TAG_MID_TOPIC_OFFSET
                w += 1
                w += _put_varint(o + w, mid.off)
        elif f == SM_ATTRIBUTES:
            if d.attrs_first < 0:
                continue
            if not d.attrs_split:
                memcpy(o + w, p + d.attrs_first, d.attrs_end - d.attrs_first)
                w += d.attrs_end - d.attrs_first
                continue
            pos = d.attrs_first
            while pos < n:      # well-formed: _decode read it all
                fstart = pos
                _read_field(p, n, &pos, &field, &wt, &value, &vstart)
                if field == SM_ATTRIBUTES and wt == _WT_LEN:
                    memcpy(o + w, p + fstart, pos - fstart)
                    w += pos - fstart
        elif f == SM_PRODUCER_NAME and s.set_pn:
            w += _put_str(o + w, TAG_SM_PRODUCER_NAME, &s.pn)
        elif _kept(d, f):
            memcpy(o + w, p + d.start[f], d.end[f] - d.start[f])
            w += d.end[f] - d.start[f]
    return w


cdef inline void _no_stamp(_Stamp *s) noexcept nogil:
    s.tn_mode = s.ba_mode = ID_KEEP
    s.tn.n = s.ba.n = s.pn.n = 0
    s.tn.present = s.ba.present = s.pn.present = False
    s.set_pid = s.set_off = s.set_pn = s.makes_id = False
    s.pid = s.off = 0


cdef inline _Str _str_of(bytes b) noexcept:
    cdef _Str v
    v.p = <const uint8_t *>PyBytes_AS_STRING(b)
    v.n = PyBytes_GET_SIZE(b)
    v.present = True
    return v


cdef class DeliveryStamp:
    """What a reliable topic's stored messages are delivered with: the topic's name and the
    broker's address in msg_id, where the message does not say otherwise. The WAL and the
    durable tier leave them out of every frame (they are the same for all of a topic's
    messages)."""

    def __init__(self, topic_name, broker_addr):
        self.topic_name = topic_name.encode() if isinstance(topic_name, str) else bytes(topic_name)
        self.broker_addr = broker_addr.encode() if isinstance(broker_addr, str) \
            else bytes(broker_addr)
        _no_stamp(&self._s)
        self._s.tn_mode = self._s.ba_mode = ID_DEFAULT
        self._s.tn = _str_of(self.topic_name)
        self._s.ba = _str_of(self.broker_addr)
        self._s.makes_id = True


cdef inline _Stamp *_stamp_of(DeliveryStamp stamp, _Stamp *none) noexcept:
    if stamp is None:
        _no_stamp(none)
        return none
    return &stamp._s


def canonical_stream_message(bytes data not None, DeliveryStamp stamp=None):
    """``data`` (a serialized StreamMessage) in canonical form, stamped with ``stamp`` if
    given. Without a stamp, bytes already canonical come back as the same object. Raises
    ValueError if ``data`` is not well-formed protobuf."""
    cdef _Decoded d
    cdef _Stamp none
    cdef _Id mid
    cdef _Stamp *s = _stamp_of(stamp, &none)
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data), size
    if not _decode(p, n, &d):
        raise ValueError("malformed StreamMessage")
    if d.canonical and stamp is None:
        return data
    size = _canon_size(&d, s, &mid)
    out = PyBytes_FromStringAndSize(NULL, size)
    _canon_write(p, n, &d, s, &mid, <uint8_t *>PyBytes_AS_STRING(out))
    return out


def routing_key(bytes data not None):
    """The key a KeyShared subscription routes ``data`` (a serialized StreamMessage) by, as
    protobuf reads it: ``routing_key`` when present (proto3 optional: even if empty), else
    ``producer_name`` ('' when absent); the last occurrence of a field wins. ValueError if
    ``data`` is not well-formed or the string is not UTF-8 (as protobuf refuses it)."""
    cdef _Decoded d
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos, vstart = 0
    cdef uint64_t field, value
    cdef int wt, f
    if not _decode(p, PyBytes_GET_SIZE(data), &d):
        raise ValueError("malformed StreamMessage")
    f = SM_ROUTING_KEY if d.start[SM_ROUTING_KEY] >= 0 else SM_PRODUCER_NAME
    if d.start[f] < 0:
        return ""
    pos = d.start[f]
    _read_field(p, d.end[f], &pos, &field, &wt, &value, &vstart)    # read once already
    return PyUnicode_DecodeUTF8(<const char *>p + vstart, <Py_ssize_t>value, NULL)
