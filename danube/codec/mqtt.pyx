# cython: language_level=3
"""The MQTT edge's hot path in C: a run of PUBLISH packets to one topic (what a device
stream is) found in the received bytes, and turned into the StreamMessages the WAL stores
plus the PUBACKs they will get, with no Python object per message.

``publish_run`` only recognises; anything it does not vouch for (another packet type, a
packet not complete yet, QoS 2, MQTT 5 properties, a malformed or oversized packet) ends the
run, and danube.mqtt.codec's general decoder reads that packet and says what is wrong
with it."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcmp, memcpy

from cpython cimport array
import array

from danube.codec.protowire cimport _put_varint, _varint_size
from danube.codec.streammsg cimport TAG_SM_PAYLOAD, TAG_SM_PUBLISH_TIME

cdef array.array _ENDS = array.array("Q")


cdef inline Py_ssize_t _header(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                               Py_ssize_t *length) noexcept nogil:
    """Position after the fixed header at ``pos`` (its Remaining Length in ``length``), or
    -1 when the header is incomplete or malformed."""
    cdef Py_ssize_t i = pos + 1, n = 0
    cdef int shift = 0
    cdef uint8_t b
    while True:
        if i >= end or shift > 21:
            return -1
        b = p[i]
        i += 1
        n |= <Py_ssize_t>(b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    length[0] = n
    return i


def publish_run(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t end,
                Py_ssize_t max_packet, bint v5):
    """The complete PUBLISH packets from ``pos`` on that share the first one's topic, at
    QoS 0 or 1, with a valid packet id and (MQTT 5) no properties: ``(count, end position,
    topic bytes, QoS 1 count)``, or None when the packet at ``pos`` is not one."""
    cdef const uint8_t *p = &buf[0] if buf.shape[0] else NULL
    cdef Py_ssize_t count = 0, qos1 = 0, length, body, stop, tlen = -1, tstart = 0, t, q
    cdef Py_ssize_t at = pos
    cdef uint8_t first
    if p == NULL:
        return None
    while at < end:
        first = p[at]
        if first >> 4 != 3:
            break
        q = (first >> 1) & 3
        if q > 1 or first & 0x08:          # QoS 2 or 3, or DUP: the general path
            break
        body = _header(p, at, end, &length)
        if body < 0 or body - at + length > max_packet:
            break
        stop = body + length
        if stop > end or length < 2:
            break
        t = (<Py_ssize_t>p[body] << 8) | p[body + 1]
        if body + 2 + t + (2 if q else 0) + (1 if v5 else 0) > stop:
            break
        if tlen < 0:
            tlen = t
            tstart = body + 2
        elif t != tlen or memcmp(p + body + 2, p + tstart, t) != 0:
            break
        if q and p[body + 2 + t] == 0 and p[body + 3 + t] == 0:
            break                            # packet id 0
        if v5 and p[body + 2 + t + (2 if q else 0)] != 0:
            break                            # properties
        count += 1
        qos1 += q
        at = stop
    if count == 0:
        return None
    return count, at, PyBytes_FromStringAndSize(<const char *>(p + tstart), tlen), qos1


def encode_run(const uint8_t[::1] buf, Py_ssize_t pos, Py_ssize_t count, bint v5,
               bytes prefix, bytes suffix, uint64_t now_ms):
    """The run of ``count`` PUBLISH packets at ``pos`` (as publish_run found it) as
    StreamMessages in canonical field order: ``prefix`` (msg_id), payload (field 3),
    publish_time (field 4) = ``now_ms``, then ``suffix`` (the fields every message of the
    route shares). Returns ``(data, ends, acks)``: the messages back to back, their end
    offsets (array('Q'), for WAL.append_packed) and the PUBACKs of the QoS 1 ones."""
    if buf.shape[0] == 0:
        raise ValueError("empty run")
    cdef const uint8_t *p = &buf[0]
    cdef Py_ssize_t i, at, body, length = 0, t, q, payload, plen, total = 0, nacks = 0
    cdef Py_ssize_t npre = len(prefix), nsuf = len(suffix)
    cdef Py_ssize_t tsize = _varint_size(now_ms)
    cdef const uint8_t *pre = <const uint8_t *>PyBytes_AS_STRING(prefix)
    cdef const uint8_t *suf = <const uint8_t *>PyBytes_AS_STRING(suffix)
    # First pass: sizes, and the bounds the second pass relies on (a caller passing bytes
    # publish_run did not vouch for gets ValueError, never a read past the buffer).
    at = pos
    for i in range(count):
        if at >= buf.shape[0] or p[at] >> 4 != 3 or (p[at] >> 1) & 3 > 1:
            raise ValueError("not a run of PUBLISH packets at QoS 0 or 1")
        body = _header(p, at, buf.shape[0], &length)
        if body < 0 or length < 2 or body + length > buf.shape[0]:
            raise ValueError("not a run of complete PUBLISH packets")
        t = (<Py_ssize_t>p[body] << 8) | p[body + 1]
        q = (p[at] >> 1) & 3
        payload = body + 2 + t + (2 if q else 0) + (1 if v5 else 0)
        plen = body + length - payload
        if plen < 0:
            raise ValueError("a PUBLISH shorter than its topic")
        total += npre + 1 + _varint_size(plen) + plen + 1 + tsize + nsuf
        nacks += q
        at = body + length
    data = PyBytes_FromStringAndSize(NULL, total)
    acks = PyBytes_FromStringAndSize(NULL, nacks * 4)
    cdef array.array ends = array.clone(_ENDS, count, False)
    cdef uint64_t *e = <uint64_t *>ends.data.as_voidptr
    cdef uint8_t *o = <uint8_t *>PyBytes_AS_STRING(data)
    cdef uint8_t *a = <uint8_t *>PyBytes_AS_STRING(acks)
    cdef Py_ssize_t w = 0, k = 0
    at = pos
    for i in range(count):
        body = _header(p, at, buf.shape[0], &length)
        t = (<Py_ssize_t>p[body] << 8) | p[body + 1]
        q = (p[at] >> 1) & 3
        if q:
            a[k] = 0x40
            a[k + 1] = 2
            a[k + 2] = p[body + 2 + t]
            a[k + 3] = p[body + 3 + t]
            k += 4
        payload = body + 2 + t + (2 if q else 0) + (1 if v5 else 0)
        plen = body + length - payload
        memcpy(o + w, pre, npre)
        w += npre
        o[w] = TAG_SM_PAYLOAD
        w += 1
        w += _put_varint(o + w, <uint64_t>plen)
        memcpy(o + w, p + payload, plen)
        w += plen
        o[w] = TAG_SM_PUBLISH_TIME
        w += 1
        w += _put_varint(o + w, now_ms)
        memcpy(o + w, suf, nsuf)
        w += nsuf
        e[i] = w
        at = body + length
    return data, ends, acks
