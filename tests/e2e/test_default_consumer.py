"""Our client's defaults are the fast path (issue 35): `subscribe()` with no options reads
through ReceiveBatches with a window of 1,000 and batches its acks, and keeps at-least-once:
a consumer killed with SIGKILL gets nothing acknowledged before its flush_acks() again and
loses nothing unacknowledged; against a broker without the danube_ext services it falls
back to ReceiveMessages and Ack. Real broker processes (or an in-process broker), real
client processes."""

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from broker_process import BrokerProcess
from drain_helpers import nothing_more, publish
from danube.client import DanubeClient
from danube.client.consumer import DEFAULT_WINDOW
from danube.process import app as broker_app
from tiered_harness import InProcBroker
from waiting import async_wait_for


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("d")).start()
    yield b
    b.stop()


async def create_subscription(client, topic, sub):
    """A reliable subscription starts where it is created: make it before publishing. From
    a client of its own, closed after: the broker drops a consumer when its connection
    closes, and a Shared subscription would otherwise still count the set-up consumer in
    its round robin (its share would wait for the ack timeout)."""
    async with DanubeClient(client.service_url) as own:
        await own.subscribe(topic, "setup", sub)


async def offsets_until(consumer, want, timeout=20):
    got = []
    while len(got) < want:
        got += [m.msg_id.topic_offset
                for m in await consumer.receive_many(want - len(got), timeout=timeout)]
    return got


async def test_no_options_is_the_batched_path_and_drains_exactly(broker):
    topic, n = "/default/default_fast", 5000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        await create_subscription(client, topic, "s")
        await publish(producer, n)
        c = await client.subscribe(topic, "c", "s")
        (tc,) = c._consumers.values()
        assert c.window == DEFAULT_WINDOW == 1000 and c.batch_acks and tc.acks is not None
        got = []
        while len(got) < n:
            for m in await c.receive_many(1000, timeout=20):
                got.append(m.msg_id.topic_offset)
                await c.ack(m)
        assert tc.batched and tc.acks.ranges_supported      # ReceiveBatches and AckRanges
        assert sorted(got) == list(range(n))
        await c.close()                                      # flushes the queued acks
        again = await client.subscribe(topic, "c", "s")
        assert await nothing_more(again) == []
        await again.close()


async def test_receive_one_at_a_time_is_the_same_path(broker):
    topic, n = "/default/default_receive", 2000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        await create_subscription(client, topic, "s")
        await publish(producer, n)
        c = await client.subscribe(topic, "c", "s")
        got = []
        for _ in range(n):
            m = await c.receive(timeout=20)
            got.append(m.msg_id.topic_offset)
            await c.ack(m)
        assert sorted(got) == list(range(n))
        await c.flush_acks()
        assert await nothing_more(c) == []
        await c.close()


async def test_batch_acks_false_acks_each_message_before_returning(broker):
    topic = "/default/default_each"
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        await create_subscription(client, topic, "s")
        await publish(producer, 20)
        c = await client.subscribe(topic, "c", "s", batch_acks=False)
        (tc,) = c._consumers.values()
        assert tc.acks is None
        for _ in range(20):
            await c.ack(await c.receive(timeout=10))
        await c.close()
        again = await client.subscribe(topic, "c", "s")
        assert await nothing_more(again) == []
        await again.close()


@pytest.mark.parametrize("bad", [{"max_unacked_messages": 0},
                                 {"max_unacked_messages": 10001},
                                 {"max_unacked_messages": "100"},
                                 {"ack_batch": 0},
                                 {"ack_delay": -1}])
async def test_bad_options_are_refused_before_subscribing(broker, bad):
    from danube.client import InvalidArgument
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        with pytest.raises(InvalidArgument, match=next(iter(bad))):
            await client.subscribe("/default/default_bad", "c", "s", **bad)


# A consumer process with the defaults: takes a window's worth (1,000), acks 0..499 and every
# other offset of 500..999, flush_acks(), says so, then acks the odd offsets of 500..599
# without a flush and waits to be killed (what the acks let through meanwhile stays unacked).
KILLED_CONSUMER = r"""
import asyncio, sys
from danube.client import DanubeClient

async def main(url, topic):
    client = DanubeClient(url)
    c = await client.subscribe(topic, "victim", "s")
    msgs = {}
    while len(msgs) < 1000:
        for m in await c.receive_many(1000 - len(msgs), timeout=30):
            msgs[m.msg_id.topic_offset] = m
    assert sorted(msgs) == list(range(1000)), sorted(msgs)
    for off in range(1000):
        if off < 500 or off % 2 == 0:
            await c.ack(msgs[off])
    await c.flush_acks()
    print("flushed", flush=True)
    for off in range(501, 600, 2):
        await c.ack(msgs[off])
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_killed_default_consumer_loses_nothing_and_repeats_no_flushed_ack(broker):
    topic, n = "/default/default_killed", 5000
    url = f"http://{broker.client_addr}"
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        await create_subscription(client, topic, "s")
        await publish(producer, n)
        # -P: the installed package, not the source tree in the working directory.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-c", KILLED_CONSUMER, url, topic,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
        except (asyncio.TimeoutError, TimeoutError):
            line = b"(no line within 60 s)"
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert line == b"flushed\n", (await proc.stderr.read()).decode()[-3000:]
        flushed = set(range(500)) | set(range(500, 1000, 2))
        maybe = set(range(501, 600, 2))         # acked after the flush: either way
        c = await client.subscribe(topic, "heir", "s")
        must = set(range(n)) - flushed - maybe
        got = []
        while not must <= set(got):
            for m in await c.receive_many(1000, timeout=30):
                got.append(m.msg_id.topic_offset)
                await c.ack(m)
        got += await nothing_more(c, wait=1.5)
        assert not set(got) & flushed, "an acknowledged message came again"
        assert len(got) == len(set(got)), "a message came twice"
        assert set(got) - must <= maybe
        await c.close()


@pytest.fixture
async def upstream_like(tmp_path, monkeypatch):
    """A broker without the danube_ext services (BatchProducer, BatchConsumer): their paths
    answer UNIMPLEMENTED, as an upstream broker's do."""
    monkeypatch.setattr(broker_app.ext, "register", lambda server, core: None)
    monkeypatch.setattr(broker_app.batch_consumer, "register", lambda server, core: None)
    b = await InProcBroker(tmp_path, {}).start()
    yield b
    await b.stop()


async def test_default_consumer_falls_back_against_a_broker_without_the_extension(
        upstream_like):
    topic, n = "/default/default_upstream", 60
    async with DanubeClient(upstream_like.url) as client:
        assert "/danube_ext.BatchConsumer/ReceiveBatches" not in \
            {p.decode() for p in upstream_like.broker.client_server.methods}
        producer = await client.create_producer(topic, "p", reliable=True)
        await create_subscription(client, topic, "s")
        await publish(producer, n)
        c = await client.subscribe(topic, "c", "s")
        got = []
        while len(got) < n:
            for m in await c.receive_many(100, timeout=20):
                got.append(m.msg_id.topic_offset)
                await c.ack(m)
        await c.flush_acks()
        (tc,) = c._consumers.values()
        assert not tc.batched and not tc.acks.ranges_supported   # ReceiveMessages and Ack
        assert sorted(got) == list(range(n))
        await c.close()
        sub = upstream_like.topic(topic).subscriptions["s"]
        await async_wait_for(lambda: sub.dispatcher.cursor == n - 1, what="the cursor at the end")
        again = await client.subscribe(topic, "c", "s")
        assert await nothing_more(again) == []
        await again.close()


CLI = [sys.executable, "-P", "-m", "danube"]


def cli(*args, timeout=120):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def test_cli_consume_drains_a_reliable_backlog(broker):
    url, topic, n = f"http://{broker.client_addr}", "/default/default_cli", 3000

    async def setup():
        # The subscription made as the CLI's own consumer (its default name), Exclusive: each
        # `danube consume` below is that consumer again.
        async with DanubeClient(url) as client:
            await client.create_producer(topic, "setup", reliable=True)
            await client.subscribe(topic, "consumer_pubsub", "s", sub_type="exclusive")
    asyncio.run(setup())
    # produce without -i: pipelined, every line in order, upstream's format.
    result = cli("produce", "-s", url, "-t", topic, "-m", "hello", "-c", str(n),
                 "--reliable")
    assert result.returncode == 0, result.stderr
    assert f"Success: {n}" in result.stdout
    assert result.stdout.count("sent successfully") == n
    # Three messages in upstream's lines, then the rest quietly, then none is left.
    sub = ("-m", "s", "--sub-type", "exclusive")
    result = cli("consume", "-s", url, "-t", topic, *sub, "--count", "3")
    assert result.returncode == 0, result.stderr
    # Upstream's rule: a message is "reliable" when its offset went up, so offset 0 is not.
    assert result.stdout.startswith("Received message: hello\nSize: 5 bytes, Total received: "
                                    "5 bytes\n")
    assert result.stdout.count('Received reliable message: "hello"') == 2
    assert "Topic offset: 2, Size: 5 bytes, Total received: 15 bytes" in result.stdout
    result = cli("consume", "-s", url, "-t", topic, *sub, "--count", str(n - 3),
                 "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Received {n - 3} messages ({5 * (n - 3)} bytes) in ")
    assert result.stdout.rstrip().endswith("msgs/s") and result.stdout.count("\n") == 1
    result = cli("consume", "-s", url, "-t", topic, *sub, "--timeout", "2", "--quiet",
                 "--output", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["received"] == 0


def test_cli_produce_without_interval_is_pipelined_with_a_key_per_message(broker):
    url, topic = f"http://{broker.client_addr}", "/default/default_cli_keys"
    result = cli("produce", "-s", url, "-t", topic, "-m", "k", "-c", "40", "-k", "user-{i}")
    assert result.returncode == 0, result.stderr
    assert "Success: 40" in result.stdout and "Errors:" not in result.stdout
    assert result.stdout.count("sent successfully") == 40
    # -i: upstream's pacing (and its minimum interval).
    result = cli("produce", "-s", url, "-t", topic, "-m", "k", "-c", "3", "-i", "100")
    assert result.returncode == 0, result.stderr
    for i in range(1, 4):
        assert f"📤 Message {i}/3 sent successfully" in result.stdout
    result = cli("produce", "-s", url, "-t", topic, "-m", "k", "-c", "3", "-i", "50")
    assert result.returncode == 2 and "at least 100 milliseconds" in result.stderr
