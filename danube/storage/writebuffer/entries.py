"""How appends are laid out in a topic's stream.

One stream per topic, at upstream's key ``/topics/{namespace}/{topic}/stream``. One entry per
append (a single message or a whole batch), with upstream's id form ``{offset}-1`` where
``offset`` is the append's first offset, and two fields: ``payload``, the messages back to
back as the WAL stores them, and ``ends``, where each message ends in it (little-endian
u64s). Upstream writes one entry per message with a bincode ``payload``; a stream is only
ever read by the broker that wrote it or the next owner, both of this build, and one entry
per append is one XADD per batch instead of one per message (docs/compatibility.md).
"""

from __future__ import annotations

import array
import sys

PAYLOAD = b"payload"
ENDS = b"ends"
_LITTLE = sys.byteorder == "little"


def stream_key(topic: str) -> str:
    """``/default/orders`` -> ``/topics/default/orders/stream`` (upstream's key)."""
    return f"/topics/{topic.strip('/')}/stream"


def epoch_key(topic: str) -> str:
    """The topic's ownership epoch beside its stream, hash-tagged by the stream's key (one
    slot in a Redis Cluster, so a script may touch both)."""
    return "{%s}/owner_epoch" % stream_key(topic)


#: A new owner's claim: the stored epoch is raised to ARGV[1] unless a later owner's is
#: there already; returns the epoch stored.
CLAIM_SCRIPT = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
local mine = tonumber(ARGV[1])
if cur > mine then return cur end
redis.call('SET', KEYS[1], ARGV[1])
return mine
"""

#: An owner's appends: refused whole (error FENCED) when a later owner has claimed the
#: stream, else one XADD per (id, payload, ends) triple after ARGV[1], the epoch. A script
#: runs alone on the server: no claim can come between the check and the writes.
APPEND_SCRIPT = """
local cur = tonumber(redis.call('GET', KEYS[2]) or '-1')
if cur > tonumber(ARGV[1]) then
  return redis.error_reply('FENCED owner epoch ' .. cur .. ' > ' .. ARGV[1])
end
for i = 2, #ARGV, 3 do
  redis.call('XADD', KEYS[1], ARGV[i], 'payload', ARGV[i + 1], 'ends', ARGV[i + 2])
end
return (#ARGV - 1) / 3
"""


def entry_id(first_offset: int) -> str:
    return f"{first_offset}-1"


def first_of(entry_id_value) -> int:
    """The first offset an entry id names (``b"42-1"`` -> 42)."""
    if isinstance(entry_id_value, bytes):
        entry_id_value = entry_id_value.decode()
    return int(entry_id_value.split("-", 1)[0])


def pack_ends(ends) -> bytes:
    """``ends`` (a sequence of ints or an ``array('Q')``) as little-endian u64s."""
    arr = ends if isinstance(ends, array.array) and ends.typecode == "Q" \
        else array.array("Q", ends)
    if not _LITTLE:
        arr = array.array("Q", arr)
        arr.byteswap()
    return arr.tobytes()


def unpack_ends(data: bytes) -> array.array:
    arr = array.array("Q")
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr


def join_payloads(payloads) -> tuple[bytes, array.array]:
    """A list of payloads as one packed buffer and its ends."""
    ends = array.array("Q")
    total = 0
    for p in payloads:
        total += len(p)
        ends.append(total)
    return b"".join(payloads), ends


def split_entry(fields: dict, first: int):
    """``(offset, payload)`` for each message of an entry whose first offset is ``first``.
    Raises ValueError for an entry that is not ours (a field missing, ends out of order)."""
    data = fields.get(PAYLOAD)
    raw_ends = fields.get(ENDS)
    if data is None or raw_ends is None or len(raw_ends) % 8:
        raise ValueError("entry without payload/ends fields")
    ends = unpack_ends(raw_ends)
    view = memoryview(data)
    start = 0
    out = []
    for i, end in enumerate(ends):
        if end < start or end > len(data):
            raise ValueError("entry ends out of order")
        out.append((first + i, view[start:end]))
        start = end
    return out
