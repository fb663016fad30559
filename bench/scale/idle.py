"""Section `idle` (bench.scale's first measurement): N topics with one producer and one
consumer each on one broker.

Creates N (non-reliable) topics, each with a producer and a Shared subscription whose consumer
holds an open ReceiveMessages stream (all on one HTTP/2 connection, so they are real idle
consumers). Reports the broker's RSS per idle topic (+producer+consumer), how long
control-plane calls take for the first and the last thousand topics, and publish->deliver
latency on the first and the last topic, so a slowdown with the number of topics would show.
"""

import asyncio
import shutil
import statistics
import time

import uvloop

from bench.scale.common import Broker, rss_kib
from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.client import Channel


def _u(ch, path, resp):
    return ch.unary_unary(path, lambda m: m.SerializeToString(), resp.FromString)


async def run(addr, n, pid):
    ch = Channel(addr)
    create = _u(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)
    subscribe = _u(ch, "/danube.ConsumerService/Subscribe", pb.ConsumerResponse)
    send = _u(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)
    receive = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                              lambda m: m.SerializeToString(), pb.StreamMessage.FromString)
    timings, calls, producers = [], [], []
    rss0 = rss_kib(pid)
    for i in range(n):
        topic = f"/default/scale-{i}"
        t0 = time.perf_counter()
        p = await create(pb.ProducerRequest(producer_name="p", topic_name=topic))
        timings.append(time.perf_counter() - t0)
        producers.append((topic, p.producer_id))
    await asyncio.sleep(1)
    rss1 = rss_kib(pid)
    print(f"  {n} topics with a producer, broker RSS {rss1 / 1024:.0f} MiB", flush=True)
    sub_timings = []
    for i, (topic, _) in enumerate(producers):
        t0 = time.perf_counter()
        c = await subscribe(pb.ConsumerRequest(topic_name=topic, consumer_name="c",
                                               subscription="s",
                                               subscription_type=pb.ConsumerRequest.Shared))
        calls.append(await receive(pb.ReceiveRequest(consumer_id=c.consumer_id)))
        sub_timings.append(time.perf_counter() - t0)
    await asyncio.sleep(1)
    rss2 = rss_kib(pid)
    print(f"  {n} consumers with open streams, broker RSS {rss2 / 1024:.0f} MiB", flush=True)

    async def latency(idx, rounds=200):
        topic, pid_ = producers[idx]
        out = []
        for r in range(rounds):
            t0 = time.perf_counter()
            await send(pb.StreamMessage(request_id=r + 1, payload=b"x" * 100, producer_name="p",
                                        msg_id=pb.MsgID(producer_id=pid_, topic_name=topic)))
            await calls[idx].read()
            out.append((time.perf_counter() - t0) * 1e3)
        out.sort()
        return out[len(out) // 2], out[int(len(out) * 0.99)]
    first, last = await latency(0), await latency(n - 1)
    for call in calls:
        call.cancel()
    await ch.close()
    k = min(1000, n)
    ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
    return {
        "topics": n,
        "broker_rss_start_mib": round(rss0 / 1024, 1),
        "broker_rss_with_topics_and_producers_mib": round(rss1 / 1024, 1),
        "broker_rss_with_consumers_mib": round(rss2 / 1024, 1),
        "rss_per_idle_topic_with_producer_kib": round((rss1 - rss0) / n, 2),
        "rss_per_idle_consumer_with_subscription_and_stream_kib": round((rss2 - rss1) / n, 2),
        "create_producer_ms_median_first_vs_last_1000": [ms(timings[:k]), ms(timings[-k:])],
        "subscribe_and_receive_ms_median_first_vs_last_1000": [ms(sub_timings[:k]),
                                                                ms(sub_timings[-k:])],
        "publish_to_delivery_ms_first_topic_p50_p99": [round(x, 3) for x in first],
        "publish_to_delivery_ms_last_topic_p50_p99": [round(x, 3) for x in last],
    }


def measure(python, workdir, name, n):
    broker = Broker(python, workdir, f"idle-{name}").start()
    try:
        return uvloop.run(run(broker.addr, n, broker.pid))
    finally:
        broker.stop()
        shutil.rmtree(broker.data, ignore_errors=True)
