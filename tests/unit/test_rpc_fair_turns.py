"""A server connection handles at most FRAMES_PER_TURN frames per event-loop turn and keeps
the rest for later turns, so one peer's burst cannot keep every other connection waiting;
past BACKLOG_PAUSE frames it stops reading from that peer until the backlog is worked off.
Driven with an in-process ServerConnection over a recording transport: which frames were
answered after each turn is exact, not timed."""

import asyncio

from danube.codec import http2 as _core
from danube.rpc import connection as conn_mod
from danube.rpc.connection import FRAMES_PER_TURN, BACKLOG_PAUSE, TransportConfig
from danube.rpc.server import Server, ServerConnection

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class RecordingTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.out = bytearray()
        self.paused = False
        self.pauses = 0
        self.closing = False

    def write(self, data):
        self.out += data

    def writelines(self, pieces):
        for piece in pieces:
            self.out += piece

    def pause_reading(self):
        self.paused = True
        self.pauses += 1

    def resume_reading(self):
        self.paused = False

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    def abort(self):
        self.closing = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def get_write_buffer_size(self):
        return 0

    def set_write_buffer_limits(self, high=None, low=None):
        pass


def _ping_acks(data):
    reader = _core.FrameReader(1 << 20, False)
    return sum(1 for ftype, flags, *_ in reader.feed(bytes(data))
               if ftype == _core.PING and flags & _core.FLAG_ACK)


async def _connection():
    server = Server(TransportConfig())
    server.max_connections = 10
    conn = ServerConnection(server)
    transport = RecordingTransport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _core.settings_frame([]))
    await asyncio.sleep(0)
    transport.out.clear()
    return conn, transport


async def test_a_burst_is_handled_a_turn_at_a_time():
    conn, transport = await _connection()
    n = FRAMES_PER_TURN * 3 + 5
    conn.data_received(b"".join(_core.ping_frame(i.to_bytes(8, "big")) for i in range(n)))
    assert _ping_acks(transport.out) == FRAMES_PER_TURN
    assert not transport.paused           # a small backlog does not stop reading
    done = FRAMES_PER_TURN
    while done < n:
        await asyncio.sleep(0)
        done = min(n, done + FRAMES_PER_TURN)
        assert _ping_acks(transport.out) == done
    conn.connection_lost(None)


async def test_a_large_backlog_stops_reading_until_it_is_worked_off():
    conn, transport = await _connection()
    n = BACKLOG_PAUSE + 10 * FRAMES_PER_TURN
    conn.data_received(b"".join(_core.ping_frame(i.to_bytes(8, "big")) for i in range(n)))
    assert transport.paused and transport.pauses == 1
    # What arrives meanwhile joins the backlog, in order, and is not handled ahead of it.
    conn.data_received(_core.ping_frame(b"lastlast"))
    assert _ping_acks(transport.out) == FRAMES_PER_TURN
    for _ in range(n):
        if not transport.paused:
            break
        await asyncio.sleep(0)
    assert not transport.paused
    assert _ping_acks(transport.out) == n + 1
    assert transport.out.endswith(_core.ping_frame(b"lastlast", True))
    conn.connection_lost(None)


def test_the_budget_is_a_few_calls_worth():
    # Fairness needs a small budget; throughput needs it not to be tiny (bench.rpc_capacity
    # and bench.hostile measured 16 against no budget at all).
    assert 8 <= conn_mod.FRAMES_PER_TURN <= 64 < conn_mod.BACKLOG_PAUSE
