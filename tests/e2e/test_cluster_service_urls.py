"""Our client given several service URLs, without an ingress: three brokers on one etcd
(3 s lease); the client's first URL is the broker that owns the topic, and that broker is
killed (SIGKILL) while the client publishes. Its lookups move on to the next URL, it finds
the new owner, and every acknowledged message reaches a consumer. An official client
given the killed broker's URL can only ask that broker again (docs/cluster.md)."""

import asyncio
import time

import pytest

from cluster_clients import ResilientConsumer
from cluster_failover import owner
from cluster_process import etcd_cluster
from danube.client import DanubeClient
from danube.client import errors as client_errors
from official_client import unique_topic
from waiting import async_wait_for, wait_for

LEASE = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with etcd_cluster(tmp_path_factory, lease=LEASE) as brokers:
        yield brokers


def url(broker):
    return f"http://{broker.client_addr}"


def test_service_urls_are_checked():
    with pytest.raises(client_errors.InvalidArgument, match="invalid service URL"):
        DanubeClient("http://127.0.0.1:6650,http://127.0.0.1:notaport")
    with pytest.raises(client_errors.InvalidArgument, match="empty"):
        DanubeClient(" , ")
    client = DanubeClient(["127.0.0.1:6650", "http://127.0.0.1:6651"])
    assert client.service_urls == ("http://127.0.0.1:6650", "http://127.0.0.1:6651")


async def test_our_client_with_several_urls_survives_an_owner_kill(cluster):
    topic = unique_topic("several-urls")
    async with DanubeClient([url(b) for b in cluster.live]) as setup:
        await setup.create_producer(topic, "creator", reliable=True)
    victim = owner(cluster, topic)
    urls = [url(victim)] + [url(b) for b in cluster.live if b is not victim]
    consumer = ResilientConsumer(cluster, topic)
    consumer.start()
    acked, ack_times, failures = [], [], []
    stop = asyncio.Event()

    async def publish(producer):
        seq = 0
        while not stop.is_set():
            payload = f"m{seq}"
            try:
                await producer.send(payload)
            except client_errors.DanubeError as exc:
                failures.append(repr(exc))        # sent again: at least once
                await asyncio.sleep(0.05)
                continue
            acked.append(payload)
            ack_times.append(time.monotonic())
            seq += 1
            await asyncio.sleep(0.005)

    try:
        await asyncio.to_thread(wait_for, lambda: consumer.reconnects,
                                what="the consumer subscribed")
        async with DanubeClient(urls) as client:
            producer = await client.create_producer(topic, "several-urls", reliable=True)
            task = asyncio.create_task(publish(producer))
            await async_wait_for(lambda: len(consumer.received) >= 100, timeout=30,
                                 what="the consumer receiving")
            killed = await asyncio.to_thread(cluster.kill, victim)
            await async_wait_for(lambda: sum(t > killed for t in ack_times) >= 100,
                                 timeout=60, what="publishing again after the kill")
            stop.set()
            await task
            assert client.service_url != url(victim)
        served_again = next(t for t in ack_times if t > killed) - killed
        await asyncio.to_thread(wait_for, lambda: consumer.has_all(acked), 30,
                                "every acknowledged message at the consumer")
    finally:
        consumer.stop()
    print(f"our client, {len(urls)} service URLs, first the killed owner: first acked publish "
          f"{served_again:.2f} s after kill -9 (lease {LEASE} s), {len(acked)} acked, "
          f"{len(failures)} send errors raised to the application")
    assert not set(acked) - set(consumer.received)
    assert served_again < 2 * LEASE + 10, served_again     # the figure is reported above
