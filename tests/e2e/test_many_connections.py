"""Many connections at once on one broker (issue 53, deliverable 4): a thousand client
connections held open together, each with a producer that has sent one message, on
non-reliable and reliable topics. Every one is served, and the broker still answers a new
client while they are all open and after they close. What they cost in memory is measured
by bench/scale/connections.py (ten thousand of them), not asserted here."""

import asyncio
import os
import resource

import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.client import Channel

CONNECTIONS = 1000
TOPICS = 8
OPENING_AT_ONCE = 64


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # Ours and the broker's descriptors: the broker raises its soft limit to the hard one
    # and takes three quarters of it for connections; we hold the other ends.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard * 3 // 4 < CONNECTIONS + 100:
        pytest.skip(f"the open-file hard limit ({hard}) leaves no room for "
                    f"{CONNECTIONS} connections")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("d")).start()
    yield b
    b.stop()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def broker_sockets(pid):
    fds = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(fds):
        try:
            count += os.readlink(f"{fds}/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


async def produce_one(addr, topic, name, reliable, keep):
    """A connection of its own, a producer on `topic` and one message acknowledged; the
    channel is kept open in `keep`. Returns the error, or None when served."""
    channel = Channel(addr)
    keep.append(channel)
    create = channel.unary_unary("/danube.ProducerService/CreateProducer",
                                 pb.ProducerRequest.SerializeToString,
                                 pb.ProducerResponse.FromString)
    send = channel.unary_unary("/danube.ProducerService/SendMessage",
                               pb.StreamMessage.SerializeToString,
                               pb.MessageResponse.FromString)
    try:
        producer = await create(pb.ProducerRequest(
            request_id=1, producer_name=name, topic_name=topic,
            dispatch_strategy=pb.Reliable if reliable else pb.NonReliable), timeout=60)
        reply = await send(pb.StreamMessage(
            request_id=7, payload=b"m" * 100, producer_name=name,
            msg_id=pb.MsgID(producer_id=producer.producer_id, topic_name=topic)), timeout=60)
        assert reply.request_id == 7
        return None
    except Exception as exc:  # noqa: BLE001 - collected, the test reports the first
        return f"{name}: {type(exc).__name__}: {exc}"


@pytest.mark.parametrize("reliable", [False, True], ids=["non-reliable", "reliable"])
async def test_a_thousand_connections_each_with_a_producer(broker, reliable):
    addr = broker.client_addr
    kind = "r" if reliable else "n"
    channels = []
    opening = asyncio.Semaphore(OPENING_AT_ONCE)

    async def one(i):
        async with opening:
            return await produce_one(addr, f"/default/many-{kind}{i % TOPICS}",
                                     f"many-{kind}{i}", reliable, channels)

    try:
        errors = [e for e in await asyncio.gather(*(one(i) for i in range(CONNECTIONS)))
                  if e is not None]
        assert not errors, f"{len(errors)} of {CONNECTIONS} not served; first: {errors[0]}"
        # All of them open at once, each on a connection of its own.
        assert len({id(await c.connection()) for c in channels}) == CONNECTIONS
        assert broker_sockets(broker.pid) >= CONNECTIONS
        # A new client is served with all of them open ...
        assert await produce_one(addr, f"/default/many-{kind}-late", f"late-{kind}",
                                 reliable, channels) is None
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    # ... and after they have gone.
    later = []
    try:
        assert await produce_one(addr, f"/default/many-{kind}-after", f"after-{kind}",
                                 reliable, later) is None
    finally:
        await later[0].close()
