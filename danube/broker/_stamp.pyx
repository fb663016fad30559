# cython: language_level=3
# StreamMessage bytes amended without protobuf objects, for the batched publish path where
# per-message Python work is the bottleneck. Stamping relies on protobuf's wire rules: for a
# singular scalar field the last occurrence wins, and occurrences of an embedded message
# field are merged. So appending `msg_id { topic_offset: N }` to serialized bytes stamps the
# offset into the message's msg_id, keeping the fields the producer set. Such frames are
# only for the WAL: delivery rewrites them in canonical form (_canon.pyx), which merges the
# same way, so no client's decoder has to.

# The batched publish path (danube_ext.BatchProducer) without a Python object per message:
# the client encodes a whole MessageBatchRaw in one call (danube/codec/msgbatch.pyx), the
# broker indexes the received body in one call (MessageBatchView) and stamps every message
# into one packed buffer that the WAL frames as it is.

from cpython cimport array as _carray
from cpython.bytes cimport (PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE,
                            PyBytes_CheckExact)
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy
import array as _array

from danube.codec.protowire cimport (_WT_VARINT, _WT_LEN, _varint_size, _put_varint,
                                     _read_plain_field)
from danube.codec.streammsg cimport *
from danube.codec.utf8 cimport utf8_valid

cdef _carray.array _U64_ARRAY = _array.array("Q")

cdef enum:
    _OK = 0
    _MALFORMED = 1
    _NOT_UTF8 = 2


cdef int _walk_strings(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, uint64_t a,
                       uint64_t b) noexcept nogil:
    """p[pos:end] as a message's fields: _MALFORMED unless well formed, _NOT_UTF8 if field
    ``a`` or ``b`` (length-delimited: strings) is not UTF-8."""
    cdef uint64_t field, value
    cdef int wt
    cdef Py_ssize_t start
    while pos < end:
        if not _read_plain_field(p, end, &pos, &field, &wt, &value, &start):
            return _MALFORMED
        if wt == _WT_LEN and (field == a or field == b) and \
                not utf8_valid(p + start, <Py_ssize_t>value):
            return _NOT_UTF8
    return _OK


cdef int _walk_stream_message(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                              Py_ssize_t *payload_len, bint *has_msg_id,
                              uint64_t *bad_field) noexcept nogil:
    """Check a serialized StreamMessage as protobuf would parse it: well formed, its msg_id
    and attribute entries too, and its strings UTF-8 (else _NOT_UTF8, the field's number in
    ``bad_field``: 2 for msg_id's strings, 7 for an attribute's). Finds its payload's
    length (the last occurrence wins, as protobuf merges) and whether it has a msg_id."""
    cdef uint64_t field, value
    cdef int wt, status
    cdef Py_ssize_t start
    payload_len[0] = 0
    has_msg_id[0] = False
    while pos < end:
        if not _read_plain_field(p, end, &pos, &field, &wt, &value, &start):
            return _MALFORMED
        if wt != _WT_LEN:
            continue
        status = _OK
        if field == SM_MSG_ID:
            has_msg_id[0] = True
            status = _walk_strings(p, start, start + <Py_ssize_t>value, MID_TOPIC_NAME,
                                   MID_BROKER_ADDR)
        elif field == SM_ATTRIBUTES:
            status = _walk_strings(p, start, start + <Py_ssize_t>value, ENTRY_KEY,
                                   ENTRY_VALUE)
        elif field == SM_PRODUCER_NAME or field == SM_SUBSCRIPTION_NAME or \
                field == SM_ROUTING_KEY:
            if not utf8_valid(p + start, <Py_ssize_t>value):
                status = _NOT_UTF8
        elif field == SM_PAYLOAD:
            payload_len[0] = <Py_ssize_t>value
        if status != _OK:
            bad_field[0] = field
            return status
    return _OK


_STRING_FIELDS = {SM_MSG_ID: "msg_id (topic_name or broker_addr)",
                  SM_PRODUCER_NAME: "producer_name", SM_SUBSCRIPTION_NAME: "subscription_name",
                  SM_ATTRIBUTES: "an attributes entry", SM_ROUTING_KEY: "routing_key"}


cdef class MessageBatchView:
    """A serialized danube_ext.MessageBatch (or MessageBatchRaw: the same bytes), checked
    and indexed in C by ``parse_message_batch``: its scalar fields, and where each message
    lies in ``body``. Every message's top level (and msg_id) has been checked to be well
    formed protobuf, so what is stored and delivered parses."""

    def __dealloc__(self):
        PyMem_Free(self._start)
        PyMem_Free(self._len)
        PyMem_Free(self._has_msg_id)

    def __len__(self):
        return self.count

    cdef int _add(self, Py_ssize_t start, Py_ssize_t length, bint has_msg_id) except -1:
        cdef Py_ssize_t cap
        cdef void *a
        cdef void *b
        cdef void *c
        if self.count == self._cap:
            cap = self._cap * 2 if self._cap else 64
            a = PyMem_Realloc(self._start, cap * sizeof(Py_ssize_t))
            if a == NULL:
                raise MemoryError()
            self._start = <Py_ssize_t *>a
            b = PyMem_Realloc(self._len, cap * sizeof(Py_ssize_t))
            if b == NULL:
                raise MemoryError()
            self._len = <Py_ssize_t *>b
            c = PyMem_Realloc(self._has_msg_id, cap)
            if c == NULL:
                raise MemoryError()
            self._has_msg_id = <uint8_t *>c
            self._cap = cap
        self._start[self.count] = start
        self._len[self.count] = length
        self._has_msg_id[self.count] = has_msg_id
        self.count += 1
        return 0

    def messages(self):
        """The messages as a list of bytes (for paths that parse them one by one)."""
        cdef Py_ssize_t i
        cdef const char *base = PyBytes_AS_STRING(self.body)
        cdef list out = []
        for i in range(self.count):
            out.append(PyBytes_FromStringAndSize(base + self._start[i], self._len[i]))
        return out

    cdef void _schema_fields(self, Py_ssize_t i, bint *has_id, uint64_t *schema_id,
                             uint64_t *version, Py_ssize_t *pstart,
                             Py_ssize_t *plen) noexcept:
        # The message's schema_id, schema_version and payload, the last occurrence of each
        # winning, as protobuf merges; well formed (parse_message_batch).
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(self.body)
        cdef Py_ssize_t pos = self._start[i], end = pos + self._len[i], start = 0
        cdef uint64_t field, value
        cdef int wt
        has_id[0] = False
        schema_id[0] = version[0] = 0
        pstart[0] = plen[0] = 0
        while pos < end:
            if not _read_plain_field(p, end, &pos, &field, &wt, &value, &start):
                return
            if wt == _WT_VARINT and field == SM_SCHEMA_ID:
                has_id[0] = True
                schema_id[0] = value
            elif wt == _WT_VARINT and field == SM_SCHEMA_VERSION:
                version[0] = value
            elif wt == _WT_LEN and field == SM_PAYLOAD:
                pstart[0] = start
                plen[0] = <Py_ssize_t>value

    def schema_mismatch(self, unsigned long long schema_id):
        """(index, its schema_id or None when it has none) of the first message whose
        schema_id is not ``schema_id``; (-1, None) when every message carries it."""
        cdef Py_ssize_t i, ps, pl
        cdef bint has_id
        cdef uint64_t sid, version
        for i in range(self.count):
            self._schema_fields(i, &has_id, &sid, &version, &ps, &pl)
            if not has_id:
                return i, None
            if sid != schema_id:
                return i, sid
        return -1, None

    def distinct_versions(self):
        """The schema_versions the messages carry (0: none), each once."""
        cdef Py_ssize_t i, ps, pl
        cdef bint has_id
        cdef uint64_t sid, version, last = 0
        out = set()
        for i in range(self.count):
            self._schema_fields(i, &has_id, &sid, &version, &ps, &pl)
            # Batches mostly carry one version: a set entry only where it changes.
            if i == 0 or version != last:
                out.add(version)
                last = version
        return out

    def payloads_and_versions(self, bint payloads=True):
        """([payload bytes] (empty unless ``payloads``), [schema_version, 0 when absent])."""
        cdef Py_ssize_t i, ps, pl
        cdef bint has_id
        cdef uint64_t sid, version
        cdef const char *base = PyBytes_AS_STRING(self.body)
        cdef list out = [], versions = []
        for i in range(self.count):
            self._schema_fields(i, &has_id, &sid, &version, &ps, &pl)
            versions.append(version)
            if payloads:
                out.append(PyBytes_FromStringAndSize(base + ps, pl))
        return out, versions

    def stamp(self, unsigned long long first_offset, bytes msg_id_fields,
              bytes own_id_fields=b"", bytes extra=b""):
        """Every message with ``extra`` (serialized top-level fields, e.g. producer_name)
        and ``msg_id { <msg_id_fields> [<own_id_fields>] topic_offset: first_offset+i }``
        appended, which protobuf merges into the message; ``own_id_fields`` only go to
        messages that came with a msg_id of their own (to override what it says, e.g. a
        topic_name the stored frame would otherwise keep). Returns ``(data, ends)``: the
        stamped messages back to back in one bytes object, and an ``array('Q')`` of where
        each one ends in it."""
        cdef Py_ssize_t i, n = self.count, rn, inner, w = 0, total = 0
        cdef Py_ssize_t fn = len(msg_id_fields), bn = len(own_id_fields), en = len(extra)
        cdef uint64_t offset
        cdef bint own
        cdef const uint8_t *src = <const uint8_t *>PyBytes_AS_STRING(self.body)
        cdef uint8_t *o
        cdef _carray.array ends
        cdef unsigned long long *e
        if n and first_offset + <unsigned long long>(n - 1) < first_offset:
            raise ValueError("offsets would overflow 64 bits")
        for i in range(n):
            inner = fn + 1 + _varint_size(first_offset + i)
            if self._has_msg_id[i]:
                inner += bn
            total += self._len[i] + en + 1 + _varint_size(inner) + inner
        ends = _carray.clone(_U64_ARRAY, n, False)
        e = ends.data.as_ulonglongs
        out = PyBytes_FromStringAndSize(NULL, total)
        o = <uint8_t *>PyBytes_AS_STRING(out)
        for i in range(n):
            offset = first_offset + i
            own = self._has_msg_id[i]
            rn = self._len[i]
            memcpy(o + w, src + self._start[i], rn)
            w += rn
            if en:
                memcpy(o + w, PyBytes_AS_STRING(extra), en)
                w += en
            inner = fn + 1 + _varint_size(offset) + (bn if own else 0)
            o[w] = TAG_SM_MSG_ID
            w += 1
            w += _put_varint(o + w, inner)
            if fn:
                memcpy(o + w, PyBytes_AS_STRING(msg_id_fields), fn)
                w += fn
            if own and bn:
                memcpy(o + w, PyBytes_AS_STRING(own_id_fields), bn)
                w += bn
            o[w] = TAG_MID_TOPIC_OFFSET
            w += 1
            w += _put_varint(o + w, offset)
            e[i] = w
        return out, ends


def parse_message_batch(data):
    """Index a serialized danube_ext.MessageBatch / MessageBatchRaw (any bytes-like) as a
    MessageBatchView. Raises ValueError if the batch or one of its messages is not
    well-formed protobuf, or a message's string is not UTF-8 (what SendMessage refuses, and
    what no client could decode). Unknown fields are skipped, as protobuf does."""
    cdef MessageBatchView v = MessageBatchView.__new__(MessageBatchView)
    cdef bytes body = data if PyBytes_CheckExact(data) else bytes(data)
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(body)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(body), pos = 0, start, plen
    cdef uint64_t field, value, bad_field = 0
    cdef int wt, status
    cdef bint has_msg_id
    v.body = body
    while pos < end:
        if not _read_plain_field(p, end, &pos, &field, &wt, &value, &start):
            raise ValueError(f"malformed MessageBatch at byte {pos}")
        if wt == _WT_VARINT:
            if field == 1:
                v.request_id = value
            elif field == 2:
                v.producer_id = value
            elif field == 4:
                v.offsets_as_range = value != 0
        elif wt == _WT_LEN and field == 3:
            status = _walk_stream_message(p, start, start + <Py_ssize_t>value, &plen,
                                          &has_msg_id, &bad_field)
            if status == _MALFORMED:
                raise ValueError(f"malformed StreamMessage {v.count} of the batch (at byte "
                                 f"{start})")
            if status == _NOT_UTF8:
                raise ValueError(f"StreamMessage {v.count} of the batch: "
                                 f"{_STRING_FIELDS[bad_field]} is not valid UTF-8")
            v._add(start, <Py_ssize_t>value, has_msg_id)
            v.payload_bytes += plen
            if plen > v.max_payload:
                v.max_payload = plen
    return v

