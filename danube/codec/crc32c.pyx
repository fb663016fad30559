# cython: language_level=3
# CRC-32C (Castagnoli), the checksum of WAL frames and of anything else the broker stores.
# The arithmetic lives in _crc32c.h beside this file (SSE4.2 instruction when the CPU has it,
# slicing-by-8 otherwise), declared for cimport in crc32c.pxd; this file only exposes it to
# Python over the buffer protocol.

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport uint32_t

# Inputs above this size are checksummed with the GIL released (at ~20 GB/s, 64 KiB takes a
# few microseconds; below that the release/reacquire costs more than it frees).
cdef enum:
    _CRC32C_NOGIL_MIN = 65536


cdef inline uint32_t _crc32c_buffer(object data, uint32_t value, bint software) except? 0:
    cdef Py_buffer view
    cdef uint32_t crc
    # PyBUF_SIMPLE: any C-contiguous exporter (bytes, bytearray, memoryview, mmap, array,
    # numpy); read-only exporters are fine. Non-buffers raise TypeError, non-contiguous
    # buffers BufferError -- the same contract as zlib.crc32.
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len > _CRC32C_NOGIL_MIN:
            with nogil:
                if software:
                    crc = danube_crc32c_sw(value, <const unsigned char *>view.buf, <size_t>view.len)
                else:
                    crc = danube_crc32c_update(value, <const unsigned char *>view.buf,
                                               <size_t>view.len)
        elif software:
            crc = danube_crc32c_sw(value, <const unsigned char *>view.buf, <size_t>view.len)
        else:
            crc = danube_crc32c_update(value, <const unsigned char *>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


def crc32c(data, unsigned int value=0):
    """CRC-32C (Castagnoli; iSCSI/ext4 parameters) of ``data``, any C-contiguous buffer.

    ``value`` is a previous result to continue from, so
    ``crc32c(b, crc32c(a)) == crc32c(a + b)`` (same convention as ``zlib.crc32``).
    Uses the SSE4.2 CRC32 instruction when available; releases the GIL above 64 KiB.
    """
    return _crc32c_buffer(data, value, False)


def crc32c_software(data, unsigned int value=0):
    """``crc32c`` forced onto the portable slicing-by-8 path (for tests and benchmarks)."""
    return _crc32c_buffer(data, value, True)


def crc32c_hardware_available():
    """True if ``crc32c`` uses the CPU's CRC32 instruction (x86 SSE4.2)."""
    return danube_crc32c_hw_available() != 0
