"""A consumer waiting for its ReceiveMessages stream holds one entry on the connection that
subscribed it (ServerConnection.call_when_lost): the connection's end makes it inactive at
once, and a stream attaching, the grace running out or the consumer's removal drops the
entry, so a connection holds no more entries than it has consumers waiting for a stream."""

import asyncio

from danube.rpc.config import TransportConfig
from danube.rpc.server import Server, ServerConnection

from reliable_memory import make
from waiting import async_wait_for


class Sink:
    """What Consumer.attach needs of a DeliverySink."""

    def start_response(self):
        pass


def connection():
    return ServerConnection(Server(TransportConfig(), loop=asyncio.get_running_loop()))


async def subscribed(conn, name, grace=3600):
    _, d, (c,), _, _ = await make(consumers=(name,))
    c.expect_stream(grace, conn)
    return d, c


async def test_the_subscribing_connection_ending_makes_the_consumer_inactive_at_once():
    conn = connection()
    d, c = await subscribed(conn, "ghost")
    assert c.active and len(conn._when_lost) == 1
    conn.connection_lost(None)
    assert not c.active and conn._when_lost == {}
    await d.close()


async def test_a_stream_a_timeout_or_a_removal_drops_the_entry():
    conn = connection()
    d1, streaming = await subscribed(conn, "streaming")
    d2, late = await subscribed(conn, "late", grace=0.01)
    d3, removed = await subscribed(conn, "removed")
    assert len(conn._when_lost) == 3
    streaming.attach(Sink(), conn)
    assert streaming not in conn._when_lost
    await async_wait_for(lambda: late not in conn._when_lost, what="the grace to run out")
    assert not late.active
    removed.subscription.remove(removed)
    assert conn._when_lost == {}
    conn.connection_lost(None)          # nothing left to call: the stream's consumer stays
    assert streaming.active
    for d in (d1, d2, d3):
        await d.close()


async def test_a_consumer_subscribed_on_a_connection_already_gone_goes_inactive_soon():
    conn = connection()
    conn.connection_lost(None)
    d, c = await subscribed(conn, "late-subscriber")
    await async_wait_for(lambda: not c.active, what="the consumer to go inactive")
    assert conn._when_lost == {}
    await d.close()
