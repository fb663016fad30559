"""Per-message compression named by grpc-encoding (gzip, deflate, identity)."""

import zlib

from danube.rpc.status import RpcError, StatusCode

SUPPORTED = ("identity", "gzip", "deflate")
ACCEPT_ENCODING = b"identity,gzip,deflate"

# zlib wbits: gzip container for "gzip", zlib container for "deflate" (gRPC's deflate is
# RFC 1950 zlib, as grpc-core sends it).
_WBITS = {"gzip": 31, "deflate": 15}


def compress(encoding: str, data: bytes) -> bytes:
    wbits = _WBITS[encoding]
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return c.compress(data) + c.flush()


def decompress(encoding: str, data: bytes, limit: int) -> bytes:
    """Decompress one message, refusing to inflate past `limit` bytes (a zip bomb is a
    RESOURCE_EXHAUSTED, not an out-of-memory)."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise RpcError(StatusCode.INTERNAL,
                       f"compressed message received with grpc-encoding {encoding!r}")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise RpcError(StatusCode.INTERNAL, f"could not decompress {encoding} message: {exc}")
    if len(out) > limit:
        raise RpcError(StatusCode.RESOURCE_EXHAUSTED,
                       f"decompressed message larger than max ({limit} bytes)")
    if not d.eof:
        raise RpcError(StatusCode.INTERNAL, f"truncated {encoding} message")
    return out


def pick_response_encoding(requested: str | None, accept: bytes | None) -> str | None:
    """The encoding to compress responses with, if the peer accepts it."""
    if not requested or requested == "identity":
        return None
    if accept is None:
        return None
    offered = {p.strip().decode("ascii", "replace") for p in accept.split(b",")}
    return requested if requested in offered else None
