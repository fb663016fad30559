# cython: language_level=3
# A reliable topic's stored messages as columns, for TopicHistory.ReadRange's columnar
# batches (protocol/DanubeExt.proto, ColumnBatch): each column is the buffers of an Arrow
# array (validity bitmap, int32 offsets, data), little-endian, so a reader builds its arrays
# on them without copying and no message ever becomes a Python object on either side. The
# batch is written here as the serialized ReadRangeBatch: one decode of each message, one
# copy of its bytes, and no protobuf object for the broker to build and serialize.
#
# Values are the decoded message's, as protobuf gives them: the last occurrence of a field
# wins, absent strings are "", attributes are a map (a key sent twice keeps its first place
# and its last value, as Python's protobuf and prost build it).

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memcmp, memset

from danube.broker._canon cimport _Decoded, _decode
from danube.codec.protowire cimport (_WT_LEN, _get_varint, _put_varint, _read_field,
                                     _varint_size)
from danube.codec.streammsg cimport (SM_ATTRIBUTES, SM_PAYLOAD, SM_PUBLISH_TIME,
                                     SM_PRODUCER_NAME, SM_SCHEMA_ID, SM_SCHEMA_VERSION,
                                     SM_ROUTING_KEY, ENTRY_KEY, ENTRY_VALUE)


cdef struct _Entry:
    const uint8_t *k
    Py_ssize_t kn
    const uint8_t *v
    Py_ssize_t vn


cdef struct _Entries:
    _Entry *e
    Py_ssize_t n
    Py_ssize_t cap


cdef inline void _le32(uint8_t *o, uint64_t v) noexcept nogil:
    o[0] = <uint8_t>v
    o[1] = <uint8_t>(v >> 8)
    o[2] = <uint8_t>(v >> 16)
    o[3] = <uint8_t>(v >> 24)


cdef inline void _le64(uint8_t *o, uint64_t v) noexcept nogil:
    _le32(o, v)
    _le32(o + 4, v >> 32)


cdef inline bint _field_bytes(const uint8_t *p, _Decoded *d, int f, const uint8_t **v,
                              Py_ssize_t *n) noexcept nogil:
    """The value of LEN field ``f`` (its last occurrence); empty when absent."""
    cdef Py_ssize_t pos = d.start[f]
    cdef uint64_t tag, length
    v[0] = p
    n[0] = 0
    if pos < 0:
        return False
    _get_varint(p, d.end[f], &pos, &tag)
    _get_varint(p, d.end[f], &pos, &length)
    v[0] = p + pos
    n[0] = <Py_ssize_t>length
    return True


cdef inline bint _field_varint(const uint8_t *p, _Decoded *d, int f, uint64_t *v) noexcept nogil:
    cdef Py_ssize_t pos = d.start[f]
    cdef uint64_t tag
    v[0] = 0
    if pos < 0:
        return False
    _get_varint(p, d.end[f], &pos, &tag)
    _get_varint(p, d.end[f], &pos, v)
    return True


cdef int _attributes(const uint8_t *p, Py_ssize_t n, _Decoded *d, _Entries *out) except -1:
    """The message's attributes into ``out`` (map semantics). Raises on a malformed entry."""
    cdef Py_ssize_t pos, epos, eend, vstart = 0, i
    cdef uint64_t field, value
    cdef int wt
    cdef _Entry entry
    cdef _Entry *grown
    out.n = 0
    if d.attrs_first < 0:
        return 0
    pos = d.attrs_first
    while pos < d.attrs_end:
        _read_field(p, n, &pos, &field, &wt, &value, &vstart)   # well-formed: _decode read it
        if field != SM_ATTRIBUTES or wt != _WT_LEN:
            continue
        entry.k = entry.v = p
        entry.kn = entry.vn = 0
        epos = vstart
        eend = vstart + <Py_ssize_t>value
        while epos < eend:
            if not _read_field(p, eend, &epos, &field, &wt, &value, &vstart):
                raise ValueError("malformed attributes entry")
            if wt == _WT_LEN and field == ENTRY_KEY:
                entry.k, entry.kn = p + vstart, <Py_ssize_t>value
            elif wt == _WT_LEN and field == ENTRY_VALUE:
                entry.v, entry.vn = p + vstart, <Py_ssize_t>value
        for i in range(out.n):
            if out.e[i].kn == entry.kn and memcmp(out.e[i].k, entry.k, entry.kn) == 0:
                out.e[i].v, out.e[i].vn = entry.v, entry.vn
                break
        else:
            if out.n == out.cap:
                grown = <_Entry *>PyMem_Realloc(out.e, (out.cap * 2 + 8) * sizeof(_Entry))
                if grown == NULL:
                    raise MemoryError()
                out.e = grown
                out.cap = out.cap * 2 + 8
            out.e[out.n] = entry
            out.n += 1
    return 0


cdef struct _Row:
    uint64_t offset
    uint64_t publish_time
    uint64_t schema_id
    uint64_t schema_version
    const uint8_t *payload
    const uint8_t *key
    const uint8_t *producer
    Py_ssize_t payload_n
    Py_ssize_t key_n
    Py_ssize_t producer_n
    Py_ssize_t entries_end      # index past the row's last entry in the batch's entries
    bint has_key
    bint has_id
    bint has_version


# ColumnBatch's fields, by number (DanubeExt.proto).
cdef enum:
    _CB_COUNT = 1
    _CB_TOPIC_OFFSETS = 2
    _CB_PUBLISH_TIMES
    _CB_PAYLOAD_OFFSETS
    _CB_PAYLOADS
    _CB_KEY_VALIDITY
    _CB_KEY_OFFSETS
    _CB_KEYS
    _CB_PRODUCER_OFFSETS
    _CB_PRODUCERS
    _CB_ATTR_OFFSETS
    _CB_ATTR_KEY_OFFSETS
    _CB_ATTR_KEYS
    _CB_ATTR_VALUE_OFFSETS
    _CB_ATTR_VALUES
    _CB_ID_VALIDITY
    _CB_IDS
    _CB_VERSION_VALIDITY
    _CB_VERSIONS
    _CB_FIELDS = 20
    _RRB_COLUMNS = 2            # ReadRangeBatch.columns


cdef inline Py_ssize_t _len_field_size(int field, Py_ssize_t n) noexcept nogil:
    if n == 0:
        return 0
    return (1 if field < 16 else 2) + _varint_size(<uint64_t>n) + n


cdef inline uint8_t *_len_header(uint8_t *o, int field, Py_ssize_t n) noexcept nogil:
    cdef uint64_t tag = (<uint64_t>field << 3) | _WT_LEN
    o += _put_varint(o, tag)
    return o + _put_varint(o, <uint64_t>n)


cdef inline void _set_bit(uint8_t *bitmap, Py_ssize_t row) noexcept nogil:
    bitmap[row >> 3] |= <uint8_t>(1 << (row & 7))


cdef int _index(list messages, _Row *rows, _Entries *entries) except -1:
    """Decode every message once into ``rows``, its attributes into ``entries``."""
    cdef Py_ssize_t row, size, i, first
    cdef _Decoded d
    cdef _Entries one
    cdef _Entry *grown
    cdef const uint8_t *p
    cdef _Row *r
    cdef object pair
    cdef bytes stored
    one.e = NULL
    one.n = one.cap = 0
    try:
        for row in range(len(messages)):
            pair = messages[row]
            stored = (<tuple>pair)[1]
            p = <const uint8_t *>PyBytes_AS_STRING(stored)
            size = PyBytes_GET_SIZE(stored)
            if not _decode(p, size, &d):
                raise ValueError(f"the message at offset {pair[0]} is not well-formed "
                                 f"protobuf")
            r = &rows[row]
            r.offset = <uint64_t>(<tuple>pair)[0]
            _field_varint(p, &d, SM_PUBLISH_TIME, &r.publish_time)
            _field_bytes(p, &d, SM_PAYLOAD, &r.payload, &r.payload_n)
            r.has_key = _field_bytes(p, &d, SM_ROUTING_KEY, &r.key, &r.key_n)
            _field_bytes(p, &d, SM_PRODUCER_NAME, &r.producer, &r.producer_n)
            r.has_id = _field_varint(p, &d, SM_SCHEMA_ID, &r.schema_id)
            r.has_version = _field_varint(p, &d, SM_SCHEMA_VERSION, &r.schema_version)
            if d.attrs_first >= 0:
                _attributes(p, size, &d, &one)
                if entries.n + one.n > entries.cap:
                    grown = <_Entry *>PyMem_Realloc(
                        entries.e, (entries.cap * 2 + one.n) * sizeof(_Entry))
                    if grown == NULL:
                        raise MemoryError()
                    entries.e = grown
                    entries.cap = entries.cap * 2 + one.n
                memcpy(entries.e + entries.n, one.e, one.n * sizeof(_Entry))
                entries.n += one.n
            r.entries_end = entries.n
    finally:
        PyMem_Free(one.e)
    return 0


cdef uint8_t *_var_column(uint8_t *o, int offsets_field, int data_field, Py_ssize_t rows,
                          Py_ssize_t data_n, _Row *r, int which) noexcept nogil:
    """Write a row column's offsets and data fields (payload, key or producer)."""
    cdef Py_ssize_t i, at = 0
    cdef const uint8_t *v
    cdef Py_ssize_t n
    o = _len_header(o, offsets_field, 4 * (rows + 1))
    _le32(o, 0)
    for i in range(rows):
        at += r[i].payload_n if which == 0 else r[i].key_n if which == 1 else r[i].producer_n
        _le32(o + 4 * (i + 1), <uint64_t>at)
    o += 4 * (rows + 1)
    if data_n == 0:
        return o
    o = _len_header(o, data_field, data_n)
    for i in range(rows):
        if which == 0:
            v, n = r[i].payload, r[i].payload_n
        elif which == 1:
            v, n = r[i].key, r[i].key_n
        else:
            v, n = r[i].producer, r[i].producer_n
        memcpy(o, v, n)
        o += n
    return o


cdef uint8_t *_entry_column(uint8_t *o, int offsets_field, int data_field, _Entries *e,
                            Py_ssize_t data_n, bint values) noexcept nogil:
    cdef Py_ssize_t i, at = 0
    o = _len_header(o, offsets_field, 4 * (e.n + 1))
    _le32(o, 0)
    for i in range(e.n):
        at += e.e[i].vn if values else e.e[i].kn
        _le32(o + 4 * (i + 1), <uint64_t>at)
    o += 4 * (e.n + 1)
    if data_n == 0:
        return o
    o = _len_header(o, data_field, data_n)
    for i in range(e.n):
        if values:
            memcpy(o, e.e[i].v, e.e[i].vn)
            o += e.e[i].vn
        else:
            memcpy(o, e.e[i].k, e.e[i].kn)
            o += e.e[i].kn
    return o


cdef uint8_t *_bitmap(uint8_t *o, int field, Py_ssize_t rows, Py_ssize_t size, _Row *r,
                      int which) noexcept nogil:
    cdef Py_ssize_t i
    cdef bint present
    if size == 0:
        return o
    o = _len_header(o, field, size)
    memset(o, 0, size)
    for i in range(rows):
        present = r[i].has_key if which == 1 else r[i].has_id if which == 2 \
            else r[i].has_version
        if present:
            _set_bit(o, i)
    return o + size


def columnar_batch(list messages):
    """``messages``: [(offset, stored StreamMessage bytes)], as a TopicLogReader reads
    them. Returns a serialized danube_ext.ReadRangeBatch holding them as its ColumnBatch.
    Raises ValueError on a message that is not well-formed protobuf."""
    cdef Py_ssize_t rows = len(messages), i, body = 0
    cdef Py_ssize_t payload_n = 0, key_n = 0, producer_n = 0, akey_n = 0, aval_n = 0
    cdef Py_ssize_t keys_null = 0, ids_null = 0, versions_null = 0
    cdef Py_ssize_t bitmap = (rows + 7) >> 3
    cdef Py_ssize_t size[_CB_FIELDS]
    cdef _Row *r = NULL
    cdef _Entries e
    cdef uint8_t *o
    cdef uint8_t *start
    e.e = NULL
    e.n = e.cap = 0
    try:
        r = <_Row *>PyMem_Malloc(max(rows, 1) * sizeof(_Row))
        if r == NULL:
            raise MemoryError()
        _index(messages, r, &e)
        for i in range(rows):
            payload_n += r[i].payload_n
            key_n += r[i].key_n
            producer_n += r[i].producer_n
            keys_null += not r[i].has_key
            ids_null += not r[i].has_id
            versions_null += not r[i].has_version
        for i in range(e.n):
            akey_n += e.e[i].kn
            aval_n += e.e[i].vn
        memset(size, 0, sizeof(size))
        size[_CB_TOPIC_OFFSETS] = size[_CB_PUBLISH_TIMES] = size[_CB_IDS] = 8 * rows
        size[_CB_VERSIONS] = 4 * rows
        size[_CB_PAYLOAD_OFFSETS] = size[_CB_KEY_OFFSETS] = size[_CB_PRODUCER_OFFSETS] = \
            size[_CB_ATTR_OFFSETS] = 4 * (rows + 1)
        size[_CB_PAYLOADS], size[_CB_KEYS], size[_CB_PRODUCERS] = payload_n, key_n, producer_n
        size[_CB_ATTR_KEY_OFFSETS] = size[_CB_ATTR_VALUE_OFFSETS] = 4 * (e.n + 1)
        size[_CB_ATTR_KEYS], size[_CB_ATTR_VALUES] = akey_n, aval_n
        size[_CB_KEY_VALIDITY] = bitmap if keys_null else 0
        size[_CB_ID_VALIDITY] = bitmap if ids_null else 0
        size[_CB_VERSION_VALIDITY] = bitmap if versions_null else 0
        body = (1 + _varint_size(<uint64_t>rows)) if rows else 0
        for i in range(_CB_TOPIC_OFFSETS, _CB_FIELDS):
            body += _len_field_size(<int>i, size[i])
        out = PyBytes_FromStringAndSize(NULL, 1 + _varint_size(<uint64_t>body) + body)
        o = start = <uint8_t *>PyBytes_AS_STRING(out)
        o = _len_header(o, _RRB_COLUMNS, body)
        if rows:
            o[0] = (_CB_COUNT << 3)
            o += 1 + _put_varint(o + 1, <uint64_t>rows)
            o = _len_header(o, _CB_TOPIC_OFFSETS, 8 * rows)
            for i in range(rows):
                _le64(o + 8 * i, r[i].offset)
            o = _len_header(o + 8 * rows, _CB_PUBLISH_TIMES, 8 * rows)
            for i in range(rows):
                _le64(o + 8 * i, r[i].publish_time)
            o += 8 * rows
        o = _var_column(o, _CB_PAYLOAD_OFFSETS, _CB_PAYLOADS, rows, payload_n, r, 0)
        o = _bitmap(o, _CB_KEY_VALIDITY, rows, size[_CB_KEY_VALIDITY], r, 1)
        o = _var_column(o, _CB_KEY_OFFSETS, _CB_KEYS, rows, key_n, r, 1)
        o = _var_column(o, _CB_PRODUCER_OFFSETS, _CB_PRODUCERS, rows, producer_n, r, 2)
        o = _len_header(o, _CB_ATTR_OFFSETS, 4 * (rows + 1))
        _le32(o, 0)
        for i in range(rows):
            _le32(o + 4 * (i + 1), <uint64_t>r[i].entries_end)
        o += 4 * (rows + 1)
        o = _entry_column(o, _CB_ATTR_KEY_OFFSETS, _CB_ATTR_KEYS, &e, akey_n, False)
        o = _entry_column(o, _CB_ATTR_VALUE_OFFSETS, _CB_ATTR_VALUES, &e, aval_n, True)
        o = _bitmap(o, _CB_ID_VALIDITY, rows, size[_CB_ID_VALIDITY], r, 2)
        if rows:
            o = _len_header(o, _CB_IDS, 8 * rows)
            for i in range(rows):
                _le64(o + 8 * i, r[i].schema_id)
            o += 8 * rows
        o = _bitmap(o, _CB_VERSION_VALIDITY, rows, size[_CB_VERSION_VALIDITY], r, 3)
        if rows:
            o = _len_header(o, _CB_VERSIONS, 4 * rows)
            for i in range(rows):
                _le32(o + 4 * i, r[i].schema_version)
            o += 4 * rows
        if o - start != PyBytes_GET_SIZE(out):
            raise AssertionError(f"ColumnBatch written {o - start} bytes of "
                                 f"{PyBytes_GET_SIZE(out)}")
    finally:
        PyMem_Free(r)
        PyMem_Free(e.e)
    return out


def fitting(list pairs, Py_ssize_t start, Py_ssize_t limit, Py_ssize_t budget,
            Py_ssize_t extra, bint at_least_one):
    """How many of ``pairs[start:]`` (at most ``limit``) fit in ``budget`` bytes, each
    counting its stored bytes plus ``extra``; and the bytes they use. The first always fits
    when ``at_least_one`` (a batch holds one message, however large)."""
    cdef Py_ssize_t i = start, end = min(len(pairs), start + limit), used = 0, size
    while i < end:
        size = PyBytes_GET_SIZE(<bytes>(<tuple>pairs[i])[1]) + extra
        if used + size > budget and not (at_least_one and i == start):
            break
        used += size
        i += 1
    return i - start, used
