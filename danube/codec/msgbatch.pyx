# cython: language_level=3
# The client's half of the batched publish path (danube_ext.BatchProducer): a whole
# MessageBatchRaw encoded in one call, without a protobuf object per message. The broker's
# half, which indexes the received body and stamps every message, is danube/broker/_stamp.pyx.

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport (PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE,
                            PyBytes_CheckExact)
from cpython.unicode cimport PyUnicode_Check, PyUnicode_AsUTF8AndSize
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy

from danube.codec.protowire cimport _varint_size, _put_varint


def encode_message_batch(payloads_seq, unsigned long long request_id,
                         unsigned long long producer_id, unsigned long long first_request_id,
                         unsigned long long publish_time, bint offsets_as_range=False):
    """A serialized danube_ext.MessageBatchRaw (identical to what protobuf encodes) of plain
    payloads (bytes-like, or str sent as UTF-8) as StreamMessages {request_id:
    first_request_id + i, payload, publish_time}: no msg_id or producer_name, which the
    broker stamps."""
    cdef Py_ssize_t i, n, size = 0, w = 0, pn, mlen
    cdef uint64_t rid
    cdef Py_buffer view
    cdef Py_ssize_t *lens = NULL
    cdef const uint8_t *src
    cdef uint8_t *o
    cdef object obj
    cdef bytes out
    cdef list payloads = payloads_seq if type(payloads_seq) is list else list(payloads_seq)
    n = len(payloads)
    if n and first_request_id + <unsigned long long>(n - 1) < first_request_id:
        raise ValueError("request ids would overflow 64 bits")
    lens = <Py_ssize_t *>PyMem_Malloc((n + 1) * sizeof(Py_ssize_t))
    if lens == NULL:
        raise MemoryError()
    try:
        if request_id:
            size += 1 + _varint_size(request_id)
        if producer_id:
            size += 1 + _varint_size(producer_id)
        if offsets_as_range:
            size += 2
        for i in range(n):
            obj = payloads[i]
            if PyBytes_CheckExact(obj):
                pn = PyBytes_GET_SIZE(obj)
            elif PyUnicode_Check(obj):
                PyUnicode_AsUTF8AndSize(obj, &pn)
            else:
                PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
                pn = view.len
                PyBuffer_Release(&view)
            lens[i] = pn
            rid = first_request_id + i
            mlen = 0
            if rid:
                mlen += 1 + _varint_size(rid)
            if pn:
                mlen += 1 + _varint_size(pn) + pn
            if publish_time:
                mlen += 1 + _varint_size(publish_time)
            size += 1 + _varint_size(mlen) + mlen
        out = PyBytes_FromStringAndSize(NULL, size)
        o = <uint8_t *>PyBytes_AS_STRING(out)
        if request_id:
            o[w] = 0x08
            w += 1 + _put_varint(o + w + 1, request_id)
        if producer_id:
            o[w] = 0x10
            w += 1 + _put_varint(o + w + 1, producer_id)
        for i in range(n):
            obj = payloads[i]
            pn = lens[i]
            rid = first_request_id + i
            mlen = 0
            if rid:
                mlen += 1 + _varint_size(rid)
            if pn:
                mlen += 1 + _varint_size(pn) + pn
            if publish_time:
                mlen += 1 + _varint_size(publish_time)
            o[w] = 0x1A                        # MessageBatchRaw field 3 (messages)
            w += 1
            w += _put_varint(o + w, mlen)
            if rid:
                o[w] = 0x08
                w += 1 + _put_varint(o + w + 1, rid)
            if pn:
                o[w] = 0x1A
                w += 1
                w += _put_varint(o + w, pn)
                if PyBytes_CheckExact(obj):
                    memcpy(o + w, PyBytes_AS_STRING(obj), pn)
                elif PyUnicode_Check(obj):
                    memcpy(o + w, PyUnicode_AsUTF8AndSize(obj, NULL), pn)
                else:
                    # Copied under a fresh export: a payload resized since it was measured
                    # is an error, never a write past the buffer.
                    PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
                    try:
                        if view.len != pn:
                            raise ValueError(f"payload {i} changed size while being encoded")
                        memcpy(o + w, view.buf, pn)
                    finally:
                        PyBuffer_Release(&view)
                w += pn
            if publish_time:
                o[w] = 0x20
                w += 1 + _put_varint(o + w + 1, publish_time)
        if offsets_as_range:
            o[w] = 0x20                        # MessageBatchRaw field 4, varint
            o[w + 1] = 1
            w += 2
    finally:
        PyMem_Free(lens)
    return out
