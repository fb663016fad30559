# The CRC-32C arithmetic, for any extension module to cimport: the functions are static inline
# in _crc32c.h, so each caller compiles them in (no call through a module boundary), and there
# is still one implementation. A module that cimports this needs danube/codec on its include
# path (setup.py gives it to every extension).

from libc.stdint cimport uint32_t

cdef extern from "_crc32c.h" nogil:
    uint32_t danube_crc32c_update(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t danube_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n)
    int danube_crc32c_hw_available()
