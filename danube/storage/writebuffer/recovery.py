"""Reading a topic's stream back: what a new owner rebuilds its WAL from."""

from __future__ import annotations

from danube.storage.writebuffer.entries import entry_id, first_of, split_entry

#: Entries per XRANGE call (each up to a whole batch).
CHUNK = 64


async def read_tail(reader, key: str, from_offset: int):
    """Yield lists of ``(offset, payload)`` in offset order, from ``from_offset`` on (the
    entry holding it is found first). Raises ValueError for an entry that is not ours."""
    start = entry_id(max(from_offset, 0))
    rows = await reader.xrevrange(key, start, "-", count=1)
    if rows:
        start = rows[0][0]
    inclusive = True
    while True:
        rows = await reader.xrange(key, start if inclusive else _after(start), "+",
                                   count=CHUNK)
        if not rows:
            return
        batch = []
        for rid, fields in rows:
            for offset, payload in split_entry(fields, first_of(rid)):
                if offset >= from_offset:
                    batch.append((offset, payload))
        if batch:
            yield batch
        start, inclusive = rows[-1][0], False
        if len(rows) < CHUNK:
            return


def _after(rid) -> str:
    if isinstance(rid, bytes):
        rid = rid.decode()
    return "(" + rid
