"""The journal's record layout, written and read.

A journal file is a run of records from position 0, each::

    [u32 magic][u32 length][u32 crc32c][u64 file_seq][u8 kind][u16 key_len]
    [u64 first_offset][u32 count][key][body]

little-endian; ``length`` is the whole record's, header included; ``crc32c`` covers
everything after itself (the rest of the header, the key, the body); ``file_seq`` is the
sequence number of the file the record was written to. A ``FRAMES`` record's body is the
WAL frames of offsets ``first_offset .. first_offset + count - 1`` of the topic whose WAL
directory is ``key`` (relative to the WAL root), exactly as they go into its segment; a
``FORGET`` record (no body) says the directory ``key`` was deleted or set aside, so that
records before it are not replayed into it.

A file ends at the first record that does not check out (a wrong magic, sequence number or
CRC, or a length past the end): zeros after the last record of a fresh file, the old records
of a recycled one (their ``file_seq`` is an older file's), or a record a crash cut short.
"""

from __future__ import annotations

import dataclasses
import struct

from danube.codec.crc32c import crc32c

MAGIC = 0x314A4E44          # b"DNJ1"
FRAMES = 1
FORGET = 2
HEADER = struct.Struct("<IIIQBHQI")
HEADER_SIZE = HEADER.size
_CRC_FROM = 12              # the CRC covers the record from here on
MAX_KEY = 4096


def encode_header(file_seq: int, kind: int, key: bytes, first_offset: int, count: int,
                  body) -> bytearray:
    """The header and key of one record whose body is ``body`` (a buffer, may be empty)."""
    if len(key) > MAX_KEY:
        raise ValueError(f"journal key of {len(key)} bytes (at most {MAX_KEY})")
    size = HEADER_SIZE + len(key)
    head = bytearray(size)
    HEADER.pack_into(head, 0, MAGIC, size + len(body), 0, file_seq, kind, len(key),
                     first_offset, count)
    head[HEADER_SIZE:] = key
    crc = crc32c(body, crc32c(memoryview(head)[_CRC_FROM:]))
    struct.pack_into("<I", head, 8, crc)
    return head


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    kind: int
    key: str
    first_offset: int
    count: int
    body: bytes


def read_records(data, file_seq: int) -> tuple[list[Record], int]:
    """The records of one journal file's content ``data`` (bytes or a mapping), and the
    position where they end (see the module docstring for where a file ends)."""
    out = []
    pos, end = 0, len(data)
    view = memoryview(data)
    while pos + HEADER_SIZE <= end:
        magic, length, crc, seq, kind, key_len, first, count = HEADER.unpack_from(data, pos)
        if (magic != MAGIC or seq != file_seq or length < HEADER_SIZE + key_len
                or pos + length > end or kind not in (FRAMES, FORGET)):
            break
        if crc32c(view[pos + _CRC_FROM:pos + length]) != crc:
            break
        key_end = pos + HEADER_SIZE + key_len
        key = bytes(view[pos + HEADER_SIZE:key_end]).decode("utf-8", "replace")
        out.append(Record(kind, key, first, count, bytes(view[key_end:pos + length])))
        pos += length
    view.release()
    return out, pos
