# The WAL frame codec's C interface (see _walframes.pyx for the frame format): the check of a
# packed batch's end positions, which the tail cache (_tailcache.pyx) shares.

from libc.stdint cimport uint64_t


cdef const uint64_t *_ends_ptr(obj, Py_buffer *view, Py_ssize_t data_len) except NULL
