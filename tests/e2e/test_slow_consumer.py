"""A consumer that stops reading must not hold back the publisher or other subscriptions,
nor make the broker's memory grow: its outbox is bounded and the overflow is dropped and
counted (the documented non-reliable policy)."""

import asyncio
import re
import urllib.request

import uvloop

from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.client import Channel
from danube.rpc.connection import TransportConfig
from broker_process import BrokerProcess

TOPIC = "/default/slow-consumer"
COUNT = 20_000
PAYLOAD = b"p" * 1024


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def _u(channel, method, resp):
    return channel.unary_unary(method, lambda m: m.SerializeToString(), resp.FromString)


async def _scenario(addr):
    # The slow consumer's connection advertises small windows and never reads.
    slow_ch = Channel(addr, config=TransportConfig(stream_window=65535,
                                                   connection_window=65535))
    fast_ch = Channel(addr)
    create = _u(fast_ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)
    send = _u(fast_ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)
    producer = await create(pb.ProducerRequest(producer_name="p", topic_name=TOPIC))
    ids = {}
    for ch, sub in ((slow_ch, "slow"), (fast_ch, "fast")):
        subscribe = _u(ch, "/danube.ConsumerService/Subscribe", pb.ConsumerResponse)
        ids[sub] = (await subscribe(pb.ConsumerRequest(
            topic_name=TOPIC, consumer_name=sub, subscription=sub,
            subscription_type=pb.ConsumerRequest.Exclusive))).consumer_id
    receive = "/danube.ConsumerService/ReceiveMessages"
    slow_call = await slow_ch.unary_stream(receive, lambda m: m.SerializeToString())(
        pb.ReceiveRequest(consumer_id=ids["slow"]))
    fast_call = await fast_ch.unary_stream(receive, lambda m: m.SerializeToString(),
                                           pb.StreamMessage.FromString)(
        pb.ReceiveRequest(consumer_id=ids["fast"]))
    received = 0

    async def read_fast():
        nonlocal received
        while received < COUNT:
            received += len(await fast_call.read_batch())
    reader = asyncio.ensure_future(read_fast())
    msg_id = pb.MsgID(producer_id=producer.producer_id, topic_name=TOPIC)
    sem = asyncio.Semaphore(128)

    async def one(i):
        async with sem:
            await send(pb.StreamMessage(request_id=i, msg_id=msg_id, payload=PAYLOAD,
                                        producer_name="p"))
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(COUNT))), 120)
    await asyncio.wait_for(reader, 60)
    slow_call.cancel()
    await slow_ch.close()
    await fast_ch.close()
    return received


def test_slow_consumer_is_bounded_and_does_not_stall_others(tmp_path):
    broker = BrokerProcess("--prom-exporter", "127.0.0.1:0", data_dir=tmp_path / "d").start()
    try:
        rss_before = _rss_kib(broker.pid)
        received = uvloop.run(_scenario(broker.client_addr))
        rss_after = _rss_kib(broker.pid)
        body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                      timeout=5).read().decode()
    finally:
        broker.stop()
    assert received == COUNT
    dropped = float(re.search(r'danube_consumer_dropped_total\{[^}]*consumer="slow"[^}]*\} (\S+)',
                              body).group(1))
    fast_dropped = float(re.search(
        r'danube_consumer_dropped_total\{[^}]*consumer="fast"[^}]*\} (\S+)', body).group(1))
    # ~20 MiB went to the slow consumer's subscription; at most its outbox (4 MiB) plus the
    # windows and socket buffers may be held for it, the rest is dropped.
    assert dropped > COUNT / 2
    assert fast_dropped == 0
    assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)
