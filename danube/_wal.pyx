# cython: language_level=3
"""WAL frame codec (grows into the mmap WAL in the reliable-dispatch issue)."""
