"""`danube cluster up | status | down` as a user runs it: the real command in a process of
its own, starting a real etcd, SeaweedFS and two brokers with the S3 tier; a reliable
publish through our client; `status`; `down` (data kept) and `up` again on the same data,
where a subscription made before gets what was published before; the errors naming what
is wrong (a missing executable, a busy port, a cluster already running)."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube.client import DanubeClient
from danube.devcluster import tools

DANUBE = [sys.executable, "-P", "-m", "danube"]


def cluster(*args, timeout=120):
    return subprocess.run([*DANUBE, "cluster", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def directory(tmp_path):
    path = tmp_path / "c"
    yield path
    if (path / "cluster.json").exists():
        cluster("down", "--dir", str(path))


async def publish_and_consume(url, topic, payloads):
    async with DanubeClient(url) as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        consumer = await client.subscribe(topic, "c", "kept")   # before the publish
        for p in payloads:
            await producer.send(p)
        got = []
        while len(got) < len(payloads):
            message = await consumer.receive(timeout=30)
            got.append(message.payload.decode())
        return got


async def receive(url, topic, n):
    async with DanubeClient(url) as client:
        consumer = await client.subscribe(topic, "c", "kept")
        got = []
        while len(got) < n:
            message = await consumer.receive(timeout=30)
            got.append(message.payload.decode())
            await consumer.ack(message)
        return got


async def first_reliable_publish(url, topic, deadline):
    while True:
        try:
            async with DanubeClient(url) as client:
                producer = await client.create_producer(topic, "first", reliable=True)
                await producer.send("first")
                return time.monotonic()
        except Exception:  # noqa: BLE001 - until the deadline: not serving yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def test_up_status_down_up_again(directory):
    started = time.monotonic()
    up = cluster("up", "--dir", str(directory), "--free-ports", "--brokers", "2")
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((directory / "cluster.json").read_text())
    brokers = [p for p in state["processes"] if p.get("broker_url")]
    url = brokers[1]["broker_url"]
    acked = asyncio.run(first_reliable_publish(url, "/default/up-first",
                                               time.monotonic() + 60))
    print(f"danube cluster up: {up.stdout.splitlines()[0]}; first reliable publish acked "
          f"{acked - started:.2f} s after the command started")
    assert "2 brokers ready" in up.stdout
    for name in ("etcd", "s3", "broker-1", "broker-2"):
        assert name in up.stdout
    # Each broker its own process, data directory and log, all printed.
    assert len({b["pid"] for b in brokers}) == 2
    assert len({b["data"] for b in brokers}) == 2
    for b in brokers:
        assert b["broker_url"] in up.stdout and b["data"] in up.stdout
        assert Path(b["log"]).exists() and Path(b["data"]).is_dir()

    got = asyncio.run(publish_and_consume(url, "/default/up-kept", ["a", "b", "c"]))
    assert got == ["a", "b", "c"]              # delivered, never acknowledged

    status = cluster("status", "--dir", str(directory))
    assert status.returncode == 0, status.stdout + status.stderr
    # etcd, SeaweedFS's master and server, the write buffer's Redis primary and replica
    assert "7 of 7 processes running, 2 brokers active" in status.stdout

    again = cluster("up", "--dir", str(directory), "--free-ports")
    assert again.returncode == 1
    assert "already running" in again.stderr

    down = cluster("down", "--dir", str(directory))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "data kept" in down.stdout
    stopped = cluster("status", "--dir", str(directory))
    assert stopped.returncode == 1 and "0 of 7 processes running" in stopped.stdout

    # Up again on the same data (new ports): the subscription is where it was, and the
    # messages it never acknowledged are delivered again (from the broker's WAL, or the
    # S3 tier where the broker that served the topic uploaded them when it stopped).
    up = cluster("up", "--dir", str(directory), "--free-ports")
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((directory / "cluster.json").read_text())
    url = next(p["broker_url"] for p in state["processes"] if p.get("broker_url"))
    assert asyncio.run(receive(url, "/default/up-kept", 3)) == ["a", "b", "c"]

    purge = cluster("down", "--dir", str(directory), "--purge")
    assert purge.returncode == 0 and not directory.exists()


def test_errors_name_what_is_missing_or_wrong(directory, tmp_path):
    missing = cluster("up", "--dir", str(directory), "--free-ports", "--weed",
                      str(tmp_path / "no-weed"))
    assert missing.returncode == 2
    assert f"--weed {tmp_path / 'no-weed'}: no such executable" in missing.stderr
    with pytest.raises(tools.Missing, match=r"apt-get install -y etcd-server"):
        tools._executable(None, ["no-such-etcd"], "--etcd", "apt-get install -y etcd-server")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = cluster("up", "--dir", str(directory), "--broker-port", str(port),
                        "--admin-port", "1", "--etcd-port", "2")
    assert taken.returncode == 1
    assert f"port {port} (brokers) is in use: choose others with --broker-port" in taken.stderr
    assert not (directory / "cluster.json").exists() or \
        "0 of" in cluster("status", "--dir", str(directory)).stdout

    none = cluster("status", "--dir", str(tmp_path / "nothing"))
    assert none.returncode == 2 and "no cluster in" in none.stdout
    roll = cluster("roll", "--dir", str(tmp_path / "nothing"))
    assert roll.returncode == 1 and "no cluster in" in roll.stderr

    for flag, value, message in (("--brokers", "0", "--brokers: at least 1, got 0"),
                                 ("--lease-ttl", "0", "--lease-ttl: at least 1 second")):
        bad = cluster("up", "--dir", str(directory), "--free-ports", flag, value)
        assert bad.returncode == 1 and message in bad.stderr, bad.stderr
    partial = cluster("up", "--dir", str(directory), "--free-ports",
                      "--s3-endpoint", "http://127.0.0.1:9")
    assert partial.returncode == 1
    assert "--s3-endpoint needs --s3-access-key too" in partial.stderr
    assert os.path.exists(tmp_path)


def test_up_with_an_ingress(directory):
    """`--ingress`: HAProxy in front as every broker's connect_url (proxy mode)."""
    up = cluster("up", "--dir", str(directory), "--free-ports", "--ingress")
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((directory / "cluster.json").read_text())
    ingress = state["ingress"]
    assert f"ingress    {ingress}" in up.stdout
    assert f"Try: danube produce -s {ingress}" in up.stdout

    async def through_ingress():
        async with DanubeClient(ingress) as client:
            producer = await client.create_producer("/default/via-ingress", "p",
                                                    reliable=True)
            await producer.send("hello")
            return await client.lookup("/default/via-ingress")
    address = asyncio.run(through_ingress())
    assert address.proxy and address.connect_url == ingress
    assert address.broker_url in {p["broker_url"] for p in state["processes"]
                                  if p.get("broker_url")}
    down = cluster("down", "--dir", str(directory), "--purge")
    assert down.returncode == 0 and "stopped ingress" in down.stdout


def test_up_on_a_given_etcd_and_s3_endpoint(directory, tmp_path, seaweedfs_server):
    """`--etcd-endpoints` and `--s3-endpoint`: only the brokers are started; `down` stops
    them and leaves the etcd and the S3 store alone."""
    from etcd_process import EtcdProcess
    etcd = EtcdProcess(tmp_path / "etcd").start()
    try:
        s3 = seaweedfs_server
        wrong = cluster("up", "--dir", str(directory), "--free-ports",
                        "--etcd-endpoints", etcd.endpoint, "--s3-endpoint", s3.endpoint,
                        "--s3-bucket", "no-such-bucket", "--s3-access-key", s3.access_key,
                        "--s3-secret-key", s3.secret_key)
        assert wrong.returncode == 1
        assert "refuses a write to bucket 'no-such-bucket'" in wrong.stderr, wrong.stderr
        # Acknowledged once in S3: no write buffer to start.
        up = cluster("up", "--dir", str(directory), "--free-ports", "--failover", "uploaded",
                     "--etcd-endpoints", etcd.endpoint, "--s3-endpoint", s3.endpoint,
                     "--s3-bucket", s3.bucket, "--s3-access-key", s3.access_key,
                     "--s3-secret-key", s3.secret_key)
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((directory / "cluster.json").read_text())
        assert [p["name"] for p in state["processes"]] == ["broker-1", "broker-2"]
        config = (directory / "broker.yml").read_text()
        assert "failover: uploaded" in config and "write_buffer" not in config
        assert s3.secret_key not in (directory / "cluster.json").read_text()
        url = state["processes"][0]["broker_url"]
        got = asyncio.run(publish_and_consume(url, "/default/up-given", ["x"]))
        assert got == ["x"]
        down = cluster("down", "--dir", str(directory))
        assert down.returncode == 0
        assert etcd.running                       # not ours to stop
        s3.probe()
    finally:
        etcd.stop()


def test_a_shared_wal_root_instead_of_the_write_buffer(directory):
    """`--failover shared-wal-root`: every broker's WAL root is one directory (on one machine
    it is shared by construction), and no Redis is started."""
    up = cluster("up", "--dir", str(directory), "--free-ports", "--failover",
                 "shared-wal-root")
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((directory / "cluster.json").read_text())
    assert not any(p["name"].startswith("redis") for p in state["processes"])
    config = (directory / "broker.yml").read_text()
    assert "failover: shared_wal_root" in config
    assert f'local_wal_root: "{directory / "shared-wal"}"' in config
    url = next(p["broker_url"] for p in state["processes"] if p.get("broker_url"))
    assert asyncio.run(publish_and_consume(url, "/default/up-shared", ["s"])) == ["s"]
    assert any((directory / "shared-wal").iterdir())


def test_an_unknown_failover_is_refused(directory):
    bad = cluster("up", "--dir", str(directory), "--failover", "maybe")
    assert bad.returncode == 2
    assert "--failover: invalid choice: 'maybe'" in bad.stderr
