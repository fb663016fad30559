"""Header blocks for gRPC over HTTP/2: HPACK in both directions, custom metadata, timeouts
and the percent-encoded grpc-message.

Encoding is stateless on purpose: every field is sent as "literal without indexing" (or as a
static-table index), so our encoder never touches the HPACK dynamic table and repeated blocks
(the same response headers on every call) can be built once and reused. Decoding must follow
the peer's dynamic table, so it goes through `hpack.Decoder`, with a cache for the common case
of a block made only of indexed fields, which is what clients send for a repeated call.
"""

import base64
import re

import hpack

from danube.codec.http2 import hpack_static_only, hpack_table_neutral

# RFC 7541 Appendix A: the names we send, mapped to their static-table index.
_STATIC_NAME_INDEX = {
    b":authority": 1, b":method": 2, b":path": 4, b":scheme": 6, b":status": 8,
    b"accept-encoding": 16, b"content-type": 31, b"te": None, b"user-agent": 58,
}
# Whole fields in the static table (name and value).
_STATIC_FIELD_INDEX = {
    (b":method", b"POST"): 3, (b":scheme", b"http"): 6, (b":scheme", b"https"): 7,
    (b":status", b"200"): 8, (b":status", b"204"): 9, (b":status", b"400"): 12,
    (b":status", b"404"): 13, (b":status", b"500"): 14,
}


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(fields) -> bytes:
    """Encode (name, value) pairs of bytes as an HPACK block without using the dynamic table."""
    out = bytearray()
    for name, value in fields:
        index = _STATIC_FIELD_INDEX.get((name, value))
        if index is not None:
            out += _hpack_int(index, 7, 0x80)
            continue
        name_index = _STATIC_NAME_INDEX.get(name)
        if name_index:
            out += _hpack_int(name_index, 4, 0x00)
        else:
            out.append(0x00)
            out += _hpack_int(len(name), 7, 0x00)
            out += name
        out += _hpack_int(len(value), 7, 0x00)
        out += value
    return bytes(out)


#: Blocks up to this size are shared between connections (see HeaderDecoder): what a gRPC
#: client sends for a call is a few hundred bytes.
SHARED_BLOCK_MAX = 1024


class HeaderDecoder:
    """HPACK decoding for one connection, with repeated table-neutral blocks served from a
    cache: such a block decodes to the same fields for as long as the dynamic table does not
    change, and the table changes only through other blocks, which clear the cache.

    A block that refers to no entry of the dynamic table (hpack_static_only: what our own
    client sends, which never indexes) decodes to the same fields on every connection, so
    its parsed object is shared by every decoder with the same `parse` and limit (`_shared`):
    a connection's cache then holds the shared object, and a connection that sends only
    such blocks, all seen before, never needs an hpack.Decoder of its own (made on the first
    block that needs decoding). Ten thousand connections making the same calls hold one
    copy of each call's header fields, not ten thousand."""

    __slots__ = ("_decoder", "_cache", "_parse", "_limit", "_shared")
    _CACHE_LIMIT = 512
    # (parse, max_header_list_size) -> {block: (block, parsed)}, each at most _CACHE_LIMIT blocks of
    # at most SHARED_BLOCK_MAX bytes.
    _SHARED = {}

    def __init__(self, max_header_list_size: int, parse=list):
        self._decoder = None
        self._cache = {}
        self._parse = parse
        self._limit = max_header_list_size
        self._shared = self._SHARED.setdefault((parse, max_header_list_size), {})

    def decode(self, block: bytes):
        """Decode a block and return `parse(fields)`, fields being (name, value) bytes pairs;
        the parsed object is what gets cached. Raises hpack.HPACKError."""
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        cache = self._cache
        shared = self._shared
        entry = shared.get(block)
        if entry is not None:
            # The shared key too, so that this connection keeps no copy of the block.
            block, fields = entry
        else:
            decoder = self._decoder
            if decoder is None:
                decoder = self._decoder = hpack.Decoder(max_header_list_size=self._limit)
            fields = self._parse(decoder.decode(block, raw=True))
            if not hpack_table_neutral(block):
                cache.clear()
                return fields
            if len(block) <= SHARED_BLOCK_MAX and hpack_static_only(block):
                if len(shared) >= self._CACHE_LIMIT:
                    shared.clear()
                shared[block] = (block, fields)
        if len(cache) >= self._CACHE_LIMIT:
            cache.clear()
        cache[block] = fields
        return fields


# -- grpc-message --------------------------------------------------------------------------

_PCT_SAFE = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for every byte outside 0x20-0x7E and '%'."""
    raw = message.encode("utf-8", "replace")
    if all(b in _PCT_SAFE for b in raw):
        return raw
    return b"".join(bytes((b,)) if b in _PCT_SAFE else b"%%%02X" % b for b in raw)


_PCT_RE = re.compile(rb"%([0-9A-Fa-f]{2})")


def percent_decode(value: bytes) -> str:
    """Inverse of percent_encode; malformed escapes are kept as they are, as gRPC requires."""
    return _PCT_RE.sub(lambda m: bytes((int(m.group(1), 16),)), value).decode("utf-8", "replace")


# -- grpc-timeout --------------------------------------------------------------------------

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float:
    """grpc-timeout ("1 to 8 ASCII digits" + unit) in seconds; ValueError when malformed."""
    if len(value) < 2 or len(value) > 9 or not value[:-1].isdigit():
        raise ValueError(f"invalid grpc-timeout {value!r}")
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None:
        raise ValueError(f"invalid grpc-timeout unit in {value!r}")
    return int(value[:-1]) * unit


def format_timeout(seconds: float) -> bytes:
    """The shortest exact-enough grpc-timeout for `seconds` (at most 8 digits)."""
    seconds = max(seconds, 0.0)
    for unit, scale in ((b"n", 1e9), (b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60),
                        (b"H", 1 / 3600)):
        value = int(seconds * scale + 0.999999)
        if value < 100_000_000:
            return b"%d%s" % (value, unit)
    return b"99999999H"


# -- custom metadata ----------------------------------------------------------------------

# Headers that belong to the protocol, not to the application's metadata.
RESERVED_HEADERS = frozenset((
    b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding",
    b"grpc-status", b"grpc-message", b"grpc-status-details-bin", b"content-length",
))

_VALID_KEY = re.compile(r"^[0-9a-z_.\-]+$")


def metadata_from_headers(fields):
    """Application metadata from decoded header fields: pseudo-headers and protocol headers
    dropped, names as str, values as str (or bytes for '-bin' keys, base64-decoded)."""
    out = []
    for name, value in fields:
        if name[:1] == b":" or name in RESERVED_HEADERS:
            continue
        key = name.decode("ascii", "replace")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            out.append((key, value.decode("latin-1")))
    return tuple(out)


def metadata_to_headers(metadata):
    """Application metadata -> header fields; ValueError names the bad key or value."""
    out = []
    for key, value in metadata or ():
        key = key.lower()
        if not _VALID_KEY.match(key) or key.encode() in RESERVED_HEADERS:
            raise ValueError(f"invalid metadata key {key!r}")
        if key.endswith("-bin"):
            if isinstance(value, str):
                value = value.encode()
            out.append((key.encode(), base64.b64encode(value).rstrip(b"=")))
        else:
            if isinstance(value, bytes):
                value = value.decode("latin-1")
            if any(ord(c) < 0x20 or ord(c) > 0x7E for c in value):
                raise ValueError(f"metadata value for {key!r} must be printable ASCII")
            out.append((key.encode(), value.encode("ascii")))
    return out
