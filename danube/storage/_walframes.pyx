# cython: language_level=3
"""WAL frame codec, and the per-message helpers of the mmap WAL (``danube.storage.wal``).

The CRC is the codec layer's (``danube/codec/crc32c.pxd``), compiled in through cimport.

Over 500 lines, one frame format: its writers (``encode_*``, ``measure_frames``) and readers
(``scan_frames``, ``read_*``, ``walk_frames``) share the inline helpers that lay out and check a
header (``_write_frame``, ``_frame_crc``, the little-endian accessors), which Cython inlines
within one module, and side by side the writer and the reader of the format stay in step.

A WAL segment is a sequence of frames, each a 16-byte little-endian header followed by the
payload::

    0        8             12            16
    +--------+-------------+-------------+----------------------+
    | offset | payload_len | crc32c      | payload              |
    | u64 LE | u32 LE      | u32 LE      | payload_len bytes    |
    +--------+-------------+-------------+----------------------+

* ``offset`` is the message offset; frames of a segment carry consecutive offsets.
* ``payload_len`` is at most ``MAX_PAYLOAD`` (1 GiB - 1); a larger value is corruption.
* ``crc32c`` is CRC-32C (Castagnoli) of the first 12 header bytes (offset and length) followed
  by the payload. Covering the header matters for recovery: a header torn after its offset
  field, in a zero-filled file, would otherwise read as a valid frame with an empty payload
  (the CRC of nothing is 0) and a message would vanish without an error.

Segments may be preallocated (an mmap'd file filled with zeros), so a header of 16 zero bytes
means "end of data"; no real frame has that header, because its CRC covers the 12 zero bytes
and so is never 0.

Recovery runs ``scan_frames`` over a segment and truncates it at ``valid_end``: the position
just past the last complete, CRC-clean, offset-continuous frame. Everything here works on any
buffer-protocol object (bytes, bytearray, memoryview, mmap, array, numpy arrays), and the loops run
in C with the GIL released for large inputs.
"""

from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE,
                             PyBUF_WRITABLE, PyBUF_FORMAT, PyBUF_ND)
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_CheckExact, \
    PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy

from array import array as _array

from danube.codec.crc32c cimport danube_crc32c_update

cdef extern from *:
    """
    static inline uint64_t danube_wal_get_le64(const unsigned char *p) {
        uint64_t v = 0;
        int i;
        for (i = 7; i >= 0; i--) v = (v << 8) | p[i];
        return v;
    }
    static inline uint32_t danube_wal_get_le32(const unsigned char *p) {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
               ((uint32_t)p[3] << 24);
    }
    static inline void danube_wal_put_le64(unsigned char *p, uint64_t v) {
        int i;
        for (i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
    }
    static inline void danube_wal_put_le32(unsigned char *p, uint32_t v) {
        p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
        p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
    }
    """
    uint64_t danube_wal_get_le64(const unsigned char *p) noexcept nogil
    uint32_t danube_wal_get_le32(const unsigned char *p) noexcept nogil
    void danube_wal_put_le64(unsigned char *p, uint64_t v) noexcept nogil
    void danube_wal_put_le32(unsigned char *p, uint32_t v) noexcept nogil


cdef enum:
    _HDR = 16
    _MAX_PAYLOAD = (1 << 30) - 1
    _NOGIL_MIN = 65536          # release the GIL when touching more bytes than this
    _CLEAN = 0
    _TORN = 1
    _CORRUPT = 2
    _GAP = 3

HEADER_SIZE = _HDR
"""Size of the frame header in bytes."""
MAX_PAYLOAD = _MAX_PAYLOAD
"""Largest payload a frame may carry (1 GiB - 1); longer length fields are corruption."""

SCAN_CLEAN = _CLEAN
"""scan_frames status: data ended cleanly (at ``end``, or at zero padding)."""
SCAN_TORN = _TORN
"""scan_frames status: the last frame is incomplete (header or payload runs past ``end``)."""
SCAN_CORRUPT = _CORRUPT
"""scan_frames status: CRC mismatch (or a length field above MAX_PAYLOAD)."""
SCAN_GAP = _GAP
"""scan_frames status: offset discontinuity."""


class FrameError(ValueError):
    """A frame is truncated or corrupt (raised by read_frame)."""


def frame_size(Py_ssize_t payload_len):
    """Bytes a frame with a payload of ``payload_len`` bytes occupies (header included)."""
    if payload_len < 0 or payload_len > _MAX_PAYLOAD:
        raise ValueError(f"payload length {payload_len} out of range 0..{_MAX_PAYLOAD}")
    return _HDR + payload_len


cdef inline uint32_t _frame_crc(const unsigned char *frame, size_t n) noexcept nogil:
    return danube_crc32c_update(danube_crc32c_update(0, frame, 12), frame + _HDR, n)


cdef inline void _write_frame(unsigned char *dst, uint64_t offset, const unsigned char *payload,
                              Py_ssize_t n) noexcept nogil:
    # Copy first and checksum the copy: the stored CRC then matches the stored bytes even if
    # a mutable source (bytearray) changes underneath, and the copy is hot in cache.
    if n:
        memcpy(dst + _HDR, payload, <size_t>n)
    danube_wal_put_le64(dst, offset)
    danube_wal_put_le32(dst + 8, <uint32_t>n)
    danube_wal_put_le32(dst + 12, _frame_crc(dst, <size_t>n))



cdef inline int _check_payload(uint64_t offset, Py_ssize_t n) except -1:
    if n > _MAX_PAYLOAD:
        raise ValueError(f"payload of {n} bytes exceeds MAX_PAYLOAD ({_MAX_PAYLOAD})")
    return 0


def encode_frame(unsigned long long offset, payload):
    """Return the frame for ``payload`` (any buffer) at ``offset`` as bytes."""
    cdef Py_buffer view
    cdef unsigned char *dst
    PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE)
    try:
        _check_payload(offset, view.len)
        out = PyBytes_FromStringAndSize(NULL, _HDR + view.len)
        dst = <unsigned char *>PyBytes_AS_STRING(out)
        if view.len > _NOGIL_MIN:
            with nogil:
                _write_frame(dst, offset, <const unsigned char *>view.buf, view.len)
        else:
            _write_frame(dst, offset, <const unsigned char *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


cdef struct _Src:
    Py_buffer view          # for bytes only .buf and .len are filled in
    bint exported           # view holds a buffer export to release


cdef Py_ssize_t _encode(out, Py_ssize_t pos, unsigned long long first_offset, payloads,
                        uint64_t *index, Py_ssize_t index_room,
                        uint64_t index_base) except -1:
    """Frame ``payloads`` into ``out`` at ``pos``; store each frame's position, counted from
    ``index_base`` at ``pos``, in ``index`` (when not NULL, room for ``index_room``
    entries). Returns the end position."""
    cdef Py_buffer outv
    cdef _Src *src = NULL
    cdef Py_ssize_t n, i, acquired = 0, total = 0, p
    cdef unsigned char *base
    cdef object obj
    seq = payloads if type(payloads) is tuple else tuple(payloads)
    n = len(seq)
    PyObject_GetBuffer(out, &outv, PyBUF_WRITABLE)
    try:
        if pos < 0 or pos > outv.len:
            raise ValueError(f"position {pos} out of range for a buffer of {outv.len} bytes")
        if n == 0:
            return pos
        if first_offset + <unsigned long long>(n - 1) < first_offset:
            raise ValueError("frame offsets would overflow 64 bits")
        if index != NULL and n > index_room:
            raise ValueError(f"index has room for {index_room} positions, {n} frames given")
        src = <_Src *>PyMem_Malloc(n * sizeof(_Src))
        if src == NULL:
            raise MemoryError()
        for i in range(n):
            obj = seq[i]
            if PyBytes_CheckExact(obj):
                # Immutable and kept alive by `seq`: no buffer export needed.
                src[i].view.buf = PyBytes_AS_STRING(obj)
                src[i].view.len = PyBytes_GET_SIZE(obj)
                src[i].exported = False
            else:
                PyObject_GetBuffer(obj, &src[i].view, PyBUF_SIMPLE)
                src[i].exported = True
            acquired = i + 1
            _check_payload(first_offset + <unsigned long long>i, src[i].view.len)
            total += _HDR + src[i].view.len
        if total > outv.len - pos:
            raise ValueError(f"{n} frames need {total} bytes but only {outv.len - pos} are "
                             f"free after position {pos}")
        base = <unsigned char *>outv.buf
        p = pos
        if total > _NOGIL_MIN:
            with nogil:
                for i in range(n):
                    if index != NULL:
                        index[i] = index_base + <uint64_t>(p - pos)
                    _write_frame(base + p, first_offset + <unsigned long long>i,
                                 <const unsigned char *>src[i].view.buf, src[i].view.len)
                    p += _HDR + src[i].view.len
        else:
            for i in range(n):
                if index != NULL:
                    index[i] = index_base + <uint64_t>(p - pos)
                _write_frame(base + p, first_offset + <unsigned long long>i,
                             <const unsigned char *>src[i].view.buf, src[i].view.len)
                p += _HDR + src[i].view.len
        return p
    finally:
        if src != NULL:
            for i in range(acquired):
                if src[i].exported:
                    PyBuffer_Release(&src[i].view)
            PyMem_Free(src)
        PyBuffer_Release(&outv)


def encode_frames_into(out, Py_ssize_t pos, unsigned long long first_offset, payloads):
    """Write one frame per payload into the writable buffer ``out`` starting at ``pos``.

    Frames get offsets ``first_offset, first_offset + 1, ...``. Returns the position just past
    the last frame. Raises ValueError, writing nothing, if the frames do not fit (or ``pos``
    is out of range, or a payload is too large). ``payloads`` is a list (or any sequence) of
    buffers; bytes take a fast path.
    """
    return _encode(out, pos, first_offset, payloads, NULL, 0, 0)


cdef struct _Scan:
    uint64_t *offsets
    uint64_t *positions
    Py_ssize_t count
    Py_ssize_t cap
    Py_ssize_t valid_end
    int status
    bint oom


cdef inline bint _all_zero(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if p[i]:
            return False
    return True


cdef void _scan(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end,
                long long expect_offset, _Scan *st) noexcept nogil:
    cdef Py_ssize_t rem, newcap
    cdef uint64_t off, next_off = <uint64_t>expect_offset
    cdef uint32_t ln, crc
    cdef bint check_offset = expect_offset >= 0
    cdef uint64_t *tmp
    while True:
        rem = end - pos
        if rem == 0:
            st.status = _CLEAN
            break
        if rem < _HDR:
            # Zeros short of a header are padding; anything else is a header cut short.
            st.status = _CLEAN if _all_zero(buf + pos, rem) else _TORN
            break
        off = danube_wal_get_le64(buf + pos)
        ln = danube_wal_get_le32(buf + pos + 8)
        crc = danube_wal_get_le32(buf + pos + 12)
        if off == 0 and ln == 0 and crc == 0:
            st.status = _CLEAN          # preallocated, never written
            break
        if ln > _MAX_PAYLOAD:
            st.status = _CORRUPT
            break
        if <Py_ssize_t>ln > rem - _HDR:
            st.status = _TORN
            break
        if check_offset and off != next_off:
            st.status = _GAP
            break
        if _frame_crc(buf + pos, ln) != crc:
            st.status = _CORRUPT
            break
        if st.count == st.cap:
            newcap = st.cap * 2
            tmp = <uint64_t *>realloc(st.offsets, newcap * sizeof(uint64_t))
            if tmp == NULL:
                st.oom = True
                break
            st.offsets = tmp
            tmp = <uint64_t *>realloc(st.positions, newcap * sizeof(uint64_t))
            if tmp == NULL:
                st.oom = True
                break
            st.positions = tmp
            st.cap = newcap
        st.offsets[st.count] = off
        st.positions[st.count] = <uint64_t>pos
        st.count += 1
        check_offset = True
        next_off = off + 1
        pos += _HDR + ln
    st.valid_end = pos


cdef object _to_uint64_array(const uint64_t *src, Py_ssize_t n):
    cdef Py_buffer view
    arr = _array("Q", (0,)) * n
    if n:
        PyObject_GetBuffer(arr, &view, PyBUF_WRITABLE)
        memcpy(view.buf, src, <size_t>n * sizeof(uint64_t))
        PyBuffer_Release(&view)
    return arr


def scan_frames(buffer, Py_ssize_t start=0, Py_ssize_t end=-1, long long expect_offset=-1):
    """Walk the frames of ``buffer[start:end]`` and report how far the data is good.

    ``start`` must be a frame boundary; ``end < 0`` means the end of the buffer. With
    ``expect_offset >= 0`` the first frame must carry that offset; in any case each later
    frame must carry the previous offset + 1.

    Returns ``(offsets, positions, valid_end, status)``: uint64 arrays with the offset and the
    header position of every good frame, the position just past the last good frame, and

    * ``SCAN_CLEAN`` (0): the data ends at ``end``, or in zero padding (an all-zero header,
      or fewer than 16 bytes left that are all zero);
    * ``SCAN_TORN`` (1): the frame at ``valid_end`` is cut short by ``end``;
    * ``SCAN_CORRUPT`` (2): the frame at ``valid_end`` fails its CRC (or its length field
      exceeds MAX_PAYLOAD);
    * ``SCAN_GAP`` (3): the frame at ``valid_end`` breaks offset continuity.

    Scanning stops at the first bad frame; recovery truncates the segment at ``valid_end``.
    """
    cdef Py_buffer view
    cdef _Scan st
    st.offsets = NULL
    st.positions = NULL
    st.count = 0
    st.valid_end = start
    st.status = _CLEAN
    st.oom = False
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        if end < 0:
            end = view.len
        if start < 0 or start > end or end > view.len:
            raise ValueError(f"bad range [{start}, {end}) for a buffer of {view.len} bytes")
        # A guess that avoids most regrowth for small/medium messages, capped for huge
        # (mostly zero-padded) segments.
        st.cap = min((end - start) // 256 + 16, 1 << 16)
        st.offsets = <uint64_t *>malloc(st.cap * sizeof(uint64_t))
        st.positions = <uint64_t *>malloc(st.cap * sizeof(uint64_t))
        if st.offsets == NULL or st.positions == NULL:
            raise MemoryError()
        if end - start > _NOGIL_MIN:
            with nogil:
                _scan(<const unsigned char *>view.buf, start, end, expect_offset, &st)
        else:
            _scan(<const unsigned char *>view.buf, start, end, expect_offset, &st)
        if st.oom:
            raise MemoryError()
        offsets = _to_uint64_array(st.offsets, st.count)
        positions = _to_uint64_array(st.positions, st.count)
    finally:
        free(st.offsets)
        free(st.positions)
        PyBuffer_Release(&view)
    return offsets, positions, st.valid_end, st.status


def read_frame(buffer, Py_ssize_t pos):
    """Decode the frame at ``pos``: returns ``(offset, payload_bytes, next_pos)``.

    Raises FrameError (a ValueError) if the frame is truncated, has an impossible length,
    fails its CRC, or is an all-zero header (end of data); ValueError if ``pos`` is out of
    range.
    """
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef uint64_t off
    cdef uint32_t ln, crc, actual
    cdef Py_ssize_t avail
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or pos > view.len:
            raise ValueError(f"position {pos} out of range for a buffer of {view.len} bytes")
        avail = view.len - pos
        if avail < _HDR:
            raise FrameError(f"truncated frame header at position {pos}: {avail} of "
                             f"{_HDR} bytes present")
        p = <const unsigned char *>view.buf + pos
        off = danube_wal_get_le64(p)
        ln = danube_wal_get_le32(p + 8)
        crc = danube_wal_get_le32(p + 12)
        if off == 0 and ln == 0 and crc == 0:
            raise FrameError(f"no frame at position {pos}: all-zero header (end of data)")
        if ln > _MAX_PAYLOAD:
            raise FrameError(f"corrupt frame at position {pos} (offset {off}): payload length "
                             f"{ln} exceeds MAX_PAYLOAD ({_MAX_PAYLOAD})")
        if <Py_ssize_t>ln > avail - _HDR:
            raise FrameError(f"truncated frame at position {pos} (offset {off}): payload of "
                             f"{ln} bytes but only {avail - _HDR} present")
        if ln > _NOGIL_MIN:
            with nogil:
                actual = _frame_crc(p, ln)
        else:
            actual = _frame_crc(p, ln)
        if actual != crc:
            raise FrameError(f"CRC mismatch in frame at position {pos} (offset {off}): stored "
                             f"0x{crc:08x}, computed 0x{actual:08x}")
        payload = PyBytes_FromStringAndSize(<const char *>p + _HDR, ln)
    finally:
        PyBuffer_Release(&view)
    return off, payload, pos + _HDR + ln


# ---------------------------------------------------------------- WAL storage helpers
#
# What danube.storage's WAL needs per message, kept here so Python runs once per batch:
# measuring a batch against the room left in a segment, framing it into the mmap while
# recording each frame's position and reading a run of frames back out. (The hot-tail cache is
# _tailcache.pyx.)

cdef uint64_t *_index_ptr(obj, Py_buffer *view, Py_ssize_t at, Py_ssize_t n) except NULL:
    """Borrow ``obj[at:at + n]`` of a writable, contiguous uint64 array (``array('Q')`` or
    numpy) as a pointer. The caller releases ``view``."""
    PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_ND)
    fmt = (<bytes>view.format).lstrip(b"<=@") if view.format != NULL else b"B"
    if view.itemsize != 8 or fmt not in (b"Q", b"L") or view.ndim != 1:
        PyBuffer_Release(view)
        raise TypeError(f"index must be a 1-D uint64 array, got format {fmt!r}")
    if at < 0 or at > view.shape[0]:
        PyBuffer_Release(view)
        raise ValueError(f"index position {at} out of range for {view.shape[0]} entries")
    return <uint64_t *>view.buf + at


def encode_frames_indexed(out, Py_ssize_t pos, unsigned long long first_offset, payloads,
                          index, Py_ssize_t index_at, long long index_base=-1):
    """``encode_frames_into`` that also records where each frame starts.

    ``index`` is a writable 1-D uint64 array (``array('Q')`` or numpy); the header position of
    frame ``i`` is stored at ``index[index_at + i]``: its position in ``out``, or with
    ``index_base >= 0`` its position counted from ``index_base`` at ``pos`` (for frames
    encoded in a buffer that is then written to a file at ``index_base``). Raises
    ValueError, writing nothing, if the index has no room for every frame or the frames do
    not fit in ``out``. Returns the end position.
    """
    cdef Py_buffer iv
    cdef uint64_t *ip = _index_ptr(index, &iv, index_at, 0)
    try:
        return _encode(out, pos, first_offset, payloads, ip, iv.shape[0] - index_at,
                       <uint64_t>(index_base if index_base >= 0 else pos))
    finally:
        PyBuffer_Release(&iv)


cdef uint64_t _NO_ENDS = 0


cdef const uint64_t *_ends_ptr(obj, Py_buffer *view, Py_ssize_t data_len) except NULL:
    """Borrow a 1-D uint64 array of end positions (``array('Q')`` or numpy) as a pointer,
    after checking the ends never go back, stay within ``data_len`` and make no payload over
    MAX_PAYLOAD. The caller releases ``view``; an empty array gives a dummy pointer."""
    cdef const uint64_t *e
    cdef uint64_t prev = 0
    cdef Py_ssize_t i, n
    PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_ND)
    try:
        fmt = (<bytes>view.format).lstrip(b"<=@") if view.format != NULL else b"B"
        if view.itemsize != 8 or fmt not in (b"Q", b"L") or view.ndim != 1:
            raise TypeError(f"ends must be a 1-D uint64 array, got format {fmt!r}")
        n = view.shape[0]
        e = <const uint64_t *>view.buf
        for i in range(n):
            if e[i] < prev or e[i] > <uint64_t>data_len:
                raise ValueError(f"end {i} ({e[i]}) out of order or past the data "
                                 f"({data_len} bytes)")
            if e[i] - prev > _MAX_PAYLOAD:
                raise ValueError(f"payload {i} of {e[i] - prev} bytes exceeds MAX_PAYLOAD "
                                 f"({_MAX_PAYLOAD})")
            prev = e[i]
    except BaseException:
        PyBuffer_Release(view)
        raise
    return e if n else &_NO_ENDS


def encode_frames_packed(out, Py_ssize_t pos, unsigned long long first_offset, data, ends,
                         index, Py_ssize_t index_at, long long index_base=-1):
    """``encode_frames_indexed`` for payloads packed back to back in one buffer: payload
    ``i`` is ``data[ends[i - 1]:ends[i]]`` (from 0 for the first), ``ends`` a 1-D uint64
    array (``array('Q')`` or numpy). The frames take ``16 * len(ends) + ends[-1]`` bytes.
    Raises ValueError, writing nothing, if they do not fit or the ends are inconsistent."""
    cdef Py_buffer outv, dv, ev, iv
    cdef const uint64_t *e
    cdef uint64_t *ip
    cdef Py_ssize_t n, i, total, p
    cdef uint64_t start, ibase
    cdef unsigned char *base
    cdef const unsigned char *src
    PyObject_GetBuffer(data, &dv, PyBUF_SIMPLE)
    try:
        e = _ends_ptr(ends, &ev, dv.len)
        try:
            n = ev.shape[0]
            ip = _index_ptr(index, &iv, index_at, 0)
            try:
                if n > iv.shape[0] - index_at:
                    raise ValueError(f"index has room for {iv.shape[0] - index_at} "
                                     f"positions, {n} frames given")
                if n and first_offset + <unsigned long long>(n - 1) < first_offset:
                    raise ValueError("frame offsets would overflow 64 bits")
                PyObject_GetBuffer(out, &outv, PyBUF_WRITABLE)
                try:
                    if pos < 0 or pos > outv.len:
                        raise ValueError(f"position {pos} out of range for a buffer of "
                                         f"{outv.len} bytes")
                    total = _HDR * n + (<Py_ssize_t>e[n - 1] if n else 0)
                    if total > outv.len - pos:
                        raise ValueError(f"{n} frames need {total} bytes but only "
                                         f"{outv.len - pos} are free after position {pos}")
                    base = <unsigned char *>outv.buf
                    src = <const unsigned char *>dv.buf
                    p = pos
                    start = 0
                    ibase = <uint64_t>(index_base if index_base >= 0 else pos)
                    with nogil:
                        for i in range(n):
                            ip[i] = ibase + <uint64_t>(p - pos)
                            _write_frame(base + p, first_offset + <unsigned long long>i,
                                         src + start, <Py_ssize_t>(e[i] - start))
                            p += _HDR + <Py_ssize_t>(e[i] - start)
                            start = e[i]
                    return p
                finally:
                    PyBuffer_Release(&outv)
            finally:
                PyBuffer_Release(&iv)
        finally:
            PyBuffer_Release(&ev)
    finally:
        PyBuffer_Release(&dv)


def measure_frames(payloads, Py_ssize_t room):
    """Size up a batch before writing it: returns ``(total, n_fit, all_bytes)``.

    ``total`` is the bytes all its frames take, ``n_fit`` how many leading frames fit in
    ``room`` bytes, ``all_bytes`` whether every payload is an exact ``bytes`` object. Raises
    ValueError for a payload over MAX_PAYLOAD, TypeError for a non-buffer.
    """
    cdef Py_buffer view
    cdef Py_ssize_t i, n, ln, total = 0, n_fit = -1
    cdef bint all_bytes = True
    seq = payloads if type(payloads) is list or type(payloads) is tuple else list(payloads)
    n = len(seq)
    for i in range(n):
        obj = seq[i]
        if PyBytes_CheckExact(obj):
            ln = PyBytes_GET_SIZE(obj)
        else:
            PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
            ln = view.len
            PyBuffer_Release(&view)
            all_bytes = False
        if ln > _MAX_PAYLOAD:
            raise ValueError(f"payload {i} of {ln} bytes exceeds MAX_PAYLOAD ({_MAX_PAYLOAD})")
        total += _HDR + ln
        if n_fit < 0 and total > room:
            n_fit = i
    return total, (n if n_fit < 0 else n_fit), all_bytes


def read_frames(buffer, Py_ssize_t pos, Py_ssize_t end, long long first_offset,
                Py_ssize_t max_messages, long long max_bytes=-1, bint verify=False):
    """Read consecutive frames of ``buffer[pos:end]`` as a list of ``(offset, payload)``.

    ``pos`` must be the start of the frame carrying ``first_offset``; each frame's stored
    offset is checked against the expected one. Stops after ``max_messages`` frames, at
    ``end``, or before the frame that would take the payload total over ``max_bytes``
    (``< 0``: no limit) -- but always returns the first frame, however large, so a reader
    makes progress. ``verify`` also checks every CRC. Raises FrameError on a frame that is
    cut short, zero, misnumbered or (with ``verify``) fails its CRC.
    """
    cdef list out = []
    read_frames_into(out, buffer, pos, end, first_offset, max_messages, max_bytes, verify)
    return out


def read_frames_into(list out, buffer, Py_ssize_t pos, Py_ssize_t end, long long first_offset,
                     Py_ssize_t max_messages, long long max_bytes=-1, bint verify=False):
    """``read_frames`` appending to ``out``; returns the payload bytes appended. The limits
    apply to this call; the first frame is exempt from ``max_bytes`` only while ``out`` is
    empty (so a read spanning segments is bounded as a whole)."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef uint64_t off
    cdef uint32_t ln, crc
    cdef long long expect = first_offset, nbytes = 0
    cdef Py_ssize_t count = 0
    cdef bint exempt = len(out) == 0
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or pos > end or end > view.len:
            raise ValueError(f"bad range [{pos}, {end}) for a buffer of {view.len} bytes")
        while count < max_messages and end - pos >= _HDR:
            p = <const unsigned char *>view.buf + pos
            off = danube_wal_get_le64(p)
            ln = danube_wal_get_le32(p + 8)
            crc = danube_wal_get_le32(p + 12)
            if off == 0 and ln == 0 and crc == 0:
                raise FrameError(f"no frame at position {pos}: all-zero header "
                                 f"(expected offset {expect})")
            if <Py_ssize_t>ln > end - pos - _HDR:
                raise FrameError(f"truncated frame at position {pos} (offset {off}): payload "
                                 f"of {ln} bytes runs past {end}")
            if off != <uint64_t>expect:
                raise FrameError(f"frame at position {pos} carries offset {off}, expected "
                                 f"{expect}")
            if max_bytes >= 0 and nbytes + ln > max_bytes and not (exempt and count == 0):
                break
            if verify and _frame_crc(p, ln) != crc:
                raise FrameError(f"CRC mismatch in frame at position {pos} (offset {off})")
            out.append((expect, PyBytes_FromStringAndSize(<const char *>p + _HDR, ln)))
            nbytes += ln
            count += 1
            expect += 1
            pos += _HDR + ln
    finally:
        PyBuffer_Release(&view)
    return nbytes


def walk_frames(buffer, Py_ssize_t pos, Py_ssize_t end, unsigned long long expect_offset,
                Py_ssize_t max_frames=-1):
    """Walk the frame headers of ``buffer[pos:end]`` without reading payloads or checking
    CRCs: where the complete frames end. Cheap (a few ns a frame), for finding the frames of a
    byte range fetched from an uploaded segment, which is then decoded with ``read_frames(...,
    verify=True)``.

    ``pos`` must be the start of the frame carrying ``expect_offset``; each frame must carry
    the previous offset + 1. Stops after ``max_frames`` frames (``< 0``: no limit). Returns
    ``(count, next_pos, status)``: the number of complete frames walked, the position just
    past them, and

    * ``SCAN_CLEAN``: stopped at ``end`` exactly, or after ``max_frames`` frames;
    * ``SCAN_TORN``: the frame at ``next_pos`` (its header or its payload) runs past ``end``;
    * ``SCAN_CORRUPT``: the frame at ``next_pos`` has a length field above MAX_PAYLOAD;
    * ``SCAN_GAP``: the frame at ``next_pos`` carries another offset than expected (an
      all-zero header included).
    """
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef Py_ssize_t count = 0, rem
    cdef uint64_t next_off = expect_offset
    cdef uint32_t ln
    cdef int status = _CLEAN
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        if end < 0:
            end = view.len
        if pos < 0 or pos > end or end > view.len:
            raise ValueError(f"bad range [{pos}, {end}) for a buffer of {view.len} bytes")
        b = <const unsigned char *>view.buf
        with nogil:
            while max_frames < 0 or count < max_frames:
                rem = end - pos
                if rem == 0:
                    break
                if rem < _HDR:
                    status = _TORN
                    break
                ln = danube_wal_get_le32(b + pos + 8)
                if ln > _MAX_PAYLOAD:
                    status = _CORRUPT
                    break
                if danube_wal_get_le64(b + pos) != next_off:
                    status = _GAP
                    break
                if <Py_ssize_t>ln > rem - _HDR:
                    status = _TORN
                    break
                pos += _HDR + ln
                count += 1
                next_off += 1
    finally:
        PyBuffer_Release(&view)
    return count, pos, status


def last_nonzero(buffer, Py_ssize_t start=0):
    """Position just past the last non-zero byte of ``buffer[start:]`` (``start`` if none):
    how far real data reaches beyond a point, e.g. a torn tail before recovery drops it."""
    cdef Py_buffer view
    cdef const unsigned char *b
    cdef Py_ssize_t i
    cdef uint64_t w
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        if start < 0 or start > view.len:
            raise ValueError(f"start {start} out of range for a buffer of {view.len} bytes")
        b = <const unsigned char *>view.buf
        i = view.len
        with nogil:
            while i - start >= 8:
                memcpy(&w, b + i - 8, 8)
                if w:
                    break
                i -= 8
            while i > start and b[i - 1] == 0:
                i -= 1
    finally:
        PyBuffer_Release(&view)
    return i
