"""What an idle connection holds (issue 53: ten thousand connections on one broker): the
header blocks every connection sends alike are decoded and kept once, not once per
connection, within their bound; the connection objects have no per-instance dict; what only
some connections need (a PING's waiters, the streams it reset) is made when first needed;
and the connection limit's default leaves ten thousand connections room on a host whose
open-file limit is 20,000."""

import asyncio
import resource

import hpack
import pytest

from danube.rpc import server as server_mod
from danube.rpc.client import ClientConnection, ResponseHead
from danube.rpc.config import TransportConfig
from danube.rpc.headers import (SHARED_BLOCK_MAX, HeaderDecoder, encode_headers,
                                hpack_static_only)
from danube.rpc.server import RequestHead, Server, ServerConnection, default_max_connections

# What our client sends for a call: static-table entries and literals without indexing.
CALL = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/danube.P/Create"),
        (b":authority", b"127.0.0.1:6650"), (b"content-type", b"application/grpc"),
        (b"te", b"trailers")]


def call_block(path=b"/danube.P/Create", extra=()):
    return encode_headers([(n, path if n == b":path" else v) for n, v in CALL] + list(extra))


def test_static_only_blocks():
    assert hpack_static_only(call_block())
    assert hpack_static_only(b"\x82\x86\x84")                   # static indexed fields
    assert hpack_static_only(b"\x10\x01k\x01v")                 # never indexed, new name
    assert not hpack_static_only(b"")
    assert not hpack_static_only(b"\xbe")                       # index 62: dynamic table
    assert not hpack_static_only(b"\xff\x80\x01")               # index 255
    assert not hpack_static_only(b"\x80")                       # index 0 is an error
    assert not hpack_static_only(b"\x0f\x2f\x01v")              # name index 62: dynamic
    assert not hpack_static_only(b"\x40\x01k\x01v")             # literal with indexing
    assert not hpack_static_only(b"\x3f\xe1\x1f")               # table size update
    assert not hpack_static_only(b"\x00\x01k\x05v")             # value overruns the block
    assert not hpack_static_only(b"\x00\x01k")                  # value missing
    assert not hpack_static_only(b"\xff")                       # truncated index


def test_connections_share_what_they_send_alike():
    block = call_block(b"/danube.P/Shared")
    one = HeaderDecoder(65536, RequestHead)
    two = HeaderDecoder(65536, RequestHead)
    head = one.decode(block)
    assert head.path == b"/danube.P/Shared"
    # Another connection's copy of the same bytes: the same parsed head, no decoder made.
    assert two.decode(bytes(bytearray(block))) is head
    assert two._decoder is None
    # ... and the key it keeps is the shared one, not its own copy of the block.
    (key,) = two._cache
    assert key is next(k for k in one._cache if k == block)
    # Another limit or another parse is decoded on its own (the limit is checked there).
    assert HeaderDecoder(1234, RequestHead).decode(block) is not head
    assert HeaderDecoder(65536, ResponseHead).decode(block) is not head


def test_blocks_that_need_the_connections_table_are_not_shared():
    enc = hpack.Encoder()
    fields = [(b":method", b"POST"), (b":path", b"/danube.P/Indexed"),
              (b"content-type", b"application/grpc")]
    first = enc.encode(fields)          # adds to the dynamic table
    again = enc.encode(fields)          # refers to it: neutral, but this connection's own
    one = HeaderDecoder(65536, RequestHead)
    assert one.decode(first).path == b"/danube.P/Indexed"
    assert one.decode(again).path == b"/danube.P/Indexed"
    assert again in one._cache
    shared = HeaderDecoder._SHARED[(RequestHead, 65536)]
    assert first not in shared and again not in shared
    # A connection whose table lacks the entry cannot be answered from the other's.
    with pytest.raises(hpack.HPACKError):
        HeaderDecoder(65536, RequestHead).decode(again)


def test_shared_blocks_are_bounded():
    shared = HeaderDecoder._SHARED.setdefault((RequestHead, 65536), {})
    decoder = HeaderDecoder(65536, RequestHead)
    for i in range(HeaderDecoder._CACHE_LIMIT + 100):
        decoder.decode(call_block(b"/danube.P/M%d" % i))
        assert len(shared) <= HeaderDecoder._CACHE_LIMIT
        assert len(decoder._cache) <= HeaderDecoder._CACHE_LIMIT
    # A large block is decoded and cached by its connection, never shared.
    big = call_block(extra=[(b"x-big", b"v" * SHARED_BLOCK_MAX)])
    assert decoder.decode(big).path == b"/danube.P/Create"
    assert big in decoder._cache and big not in shared


async def test_idle_connections_hold_no_dict_nor_unused_queues():
    server = Server(TransportConfig(), loop=asyncio.get_running_loop())
    conn = ServerConnection(server)
    assert not hasattr(conn, "__dict__")
    assert not conn._recently_reset and conn._reset_order is None
    assert not conn._ping_waiters
    # The streams it resets are remembered, within the bound they always had.
    for sid in range(1, 2 * 1100, 2):
        conn.note_reset(sid)
    assert len(conn._recently_reset) <= 1025
    assert (2 * 1100 - 1) in conn._recently_reset and 1 not in conn._recently_reset
    client = ClientConnection(TransportConfig(), asyncio.get_running_loop())
    assert not hasattr(client, "__dict__")


def test_default_connection_limit_leaves_room_for_ten_thousand(monkeypatch):
    monkeypatch.setattr(server_mod.resource, "getrlimit", lambda which: (20_000, 20_000))
    assert default_max_connections() == 15_000
    monkeypatch.setattr(server_mod.resource, "getrlimit", lambda which: (100, 100))
    assert default_max_connections() == 75
    monkeypatch.setattr(server_mod.resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert default_max_connections() == (1 << 20) * 3 // 4
