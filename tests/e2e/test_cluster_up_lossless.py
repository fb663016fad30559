"""`danube cluster up --brokers 3 --ingress` with its defaults loses nothing acknowledged when
a broker is killed: the official producer publishes through the ingress, one message at a
time, to a reliable 3-partition topic; the owner of partition 0 is killed with `kill -9`
mid-stream (well inside the 10 s upload interval) and publishing goes on. Every payload the
producer saw acknowledged must reach a subscription made before the first publish. Before
the write buffer was the default, 30-54 of ~600 acknowledged messages (those acked in the
seconds before the kill) never reached a consumer (issue 51)."""

import asyncio
import json
import os
import signal
import time

import pytest

from danube.client import DanubeClient
from danube.devcluster import tools
from official_client import spawn_scenario
from rolling_restart import cluster_command as cluster
from waiting import wait_for

# 3 s keeps the test short (`cluster up`'s own default is 10 s). The issue's measurements
# (5 runs of each client setting, the default lease) set these from the environment.
LEASE = int(os.environ.get("DANUBE_LOSSLESS_LEASE", "3"))
RUNS = int(os.environ.get("DANUBE_LOSSLESS_RUNS", "1"))
#: The official producer's options docs/cluster.md recommends for brokers restarted in turn.
RECOMMENDED = {"max_retries": 5, "base_backoff_ms": 50, "max_backoff_ms": 500}
TOPIC = "/default/lossless"
PARTITIONS = 3


@pytest.fixture
def directory(tmp_path):
    path = tmp_path / "c"
    yield path
    if (path / "cluster.json").exists():
        cluster("down", "--dir", str(path))


def owner_pid(state, partition_topic):
    """The pid of the broker serving ``partition_topic``, from a lookup."""
    async def lookup():
        urls = ",".join(p["broker_url"] for p in state["processes"] if p.get("broker_url"))
        async with DanubeClient(urls) as client:
            return (await client.lookup(partition_topic)).broker_url
    broker_url = asyncio.run(lookup())
    return next(p["pid"] for p in state["processes"] if p.get("broker_url") == broker_url)


async def drain(urls, topic, subscription, want, timeout):
    """Every payload the subscription receives (and acks) until ``want`` is covered or
    ``timeout`` passes; {payload: partition}."""
    got = {}
    async with DanubeClient(urls) as client:
        consumer = await client.subscribe(topic, "audit", subscription)
        deadline = time.monotonic() + timeout
        while not want <= got.keys() and time.monotonic() < deadline:
            try:
                message = await consumer.receive(timeout=2)
            except asyncio.TimeoutError:
                continue
            got[message.payload.decode()] = message.msg_id.topic_name
            await consumer.ack(message)
    return got


async def subscribe_first(urls, topic, subscription):
    async with DanubeClient(urls) as client:
        await client.subscribe(topic, "audit", subscription)


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("options", ["client defaults", "recommended options"])
def test_defaults_lose_nothing_acknowledged_when_an_owner_is_killed(directory, tmp_path,
                                                                    options, run):
    tools.redis_server()
    up = cluster("up", "--dir", str(directory), "--free-ports", "--brokers", "3",
                 "--ingress", "--lease-ttl", str(LEASE))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "buffer     redis://" in up.stdout            # the default: the write buffer
    state = json.loads((directory / "cluster.json").read_text())
    assert "failover: write_buffer" in (directory / "broker.yml").read_text()
    urls = ",".join(p["broker_url"] for p in state["processes"] if p.get("broker_url"))
    go, stop = tmp_path / "go", tmp_path / "stop"
    producer = spawn_scenario("proxy_producer.py", {
        "url": state["ingress"], "topic": TOPIC, "partitions": PARTITIONS,
        "go_file": str(go), "stop_file": str(stop), "interval": 0.01, "retry_pause": 0.05,
        "retry": RECOMMENDED if options == "recommended options" else None}, timeout=150)

    def acks():
        return [line.split() for line in list(producer.lines)
                if line is not None and line.startswith("acked ")]
    try:
        producer.wait_line("created", timeout=60)
        asyncio.run(subscribe_first(urls, TOPIC, "kept"))
        go.touch()
        wait_for(lambda: len(acks()) >= 150, timeout=60, what="acknowledged publishes")
        victim = owner_pid(state, f"{TOPIC}-part-0")
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: sum(float(a[2]) > killed_at for a in acks()) >= 150, timeout=90,
                 what="the producer publishing again after the kill")
    finally:
        stop.touch()
    producer.wait_line("{", timeout=60)
    acked = {a[1]: float(a[2]) for a in acks()}
    got = asyncio.run(drain(urls, TOPIC, "kept", set(acked), timeout=60))
    lost = sorted(set(acked) - got.keys(), key=lambda p: int(p[1:]))
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged never received: {lost[:20]}"
    # The killed owner's partition is published to again within twice the lease.
    after = [t for p, t in acked.items() if t > killed_at and got[p].endswith("-part-0")]
    assert after, "nothing acknowledged on partition 0 after the kill"
    print(f"{options}, lease {LEASE} s: first ack on partition 0 "
          f"{min(after) - killed_at:.2f} s after the kill (2x the lease: {2 * LEASE} s); "
          f"{len(acked)} acknowledged, 0 lost")
