"""Running out of disk space and file descriptors (issue 51, item 5), against the real broker
process: a full volume is a real small filesystem (a tmpfs mounted by the test, which needs
root; skipped otherwise), the descriptor limit a real RLIMIT_NOFILE set before the broker
starts. Each refusal must be RESOURCE_EXHAUSTED naming the volume or the limit, the broker
must keep serving, nothing acknowledged may be lost, and publishing resumes once space is
freed. `danube produce` must count every message once, sent or failed."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from broker_process import BrokerProcess
from danube.client import ClientClosed, DanubeClient, DanubeError, RetryPolicy
from danube.rpc import StatusCode
from waiting import async_wait_for, wait_for

NO_RETRY = RetryPolicy(max_retries=0)
PAYLOAD = 1024
CLI = [sys.executable, "-P", "-m", "danube"]


# -- a real small volume ----------------------------------------------------------------------

@pytest.fixture
def volume(tmp_path):
    """A 24 MiB tmpfs of its own, unmounted afterwards."""
    mnt = tmp_path / "vol"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path, leave):
    """A ballast file that leaves about ``leave`` bytes of the volume free."""
    ballast = path / "ballast"
    size = free_bytes(path) - leave
    with open(ballast, "wb") as f:
        chunk = b"\xff" * (1 << 20)
        while size > 0:
            f.write(chunk[:min(size, len(chunk))])
            size -= len(chunk)
    return ballast


def http_get(port, path):
    """(status, body) of GET ``path`` on the broker's metrics port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(body, name, **labels):
    """The value of the series ``name`` whose labels include ``labels`` (None if absent)."""
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def message(i):
    return f"{i:08d}".encode().ljust(PAYLOAD, b".")


async def collect(consumer, into):
    """Receive (and ack) into the set ``into`` until cancelled or closed."""
    while True:
        try:
            msg = await consumer.receive()
        except ClientClosed:
            return
        into.add(int(msg.payload[:8]))
        await consumer.ack(msg)


# -- disk full --------------------------------------------------------------------------------

async def test_disk_full_is_resource_exhausted_and_publishing_resumes(volume):
    data = volume / "data"
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0", data_dir=data).start()
    topic = "/default/full_disk"
    acked, refused, received, kept = set(), [], set(), set()
    try:
        async with DanubeClient(f"http://{b.client_addr}", retry=NO_RETRY) as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            live = await client.subscribe(topic, "live", "live", sub_type="exclusive")
            # A subscription that never acks: after the restart it gets all of it again.
            keep = await client.subscribe(topic, "keeper", "keep", sub_type="exclusive")
            await keep.close()
            reader = asyncio.ensure_future(collect(live, received))
            assert http_get(b.prom_port, "/health/ready")[0] == 200
            ballast = fill(volume, 6 << 20)

            # 1 KiB reliable publishes, 100 at a time, until the volume refuses them.
            i = 0
            while len(refused) < 3:
                batch = list(range(i, i + 100))
                i += 100
                try:
                    await producer.send_many([message(n) for n in batch])
                except DanubeError as exc:
                    refused.append(exc)
                    continue
                acked.update(batch)
                assert i < 20_000, "the 24 MiB volume never filled up"
            assert acked, "nothing was stored before the disk filled up"
            for exc in refused:
                assert exc.code == StatusCode.RESOURCE_EXHAUSTED, exc
                text = str(exc)
                assert "disk full" in text and str(volume) in text, text
                assert "bytes free" in text and "INTERNAL" not in text, text

            # The exporter and the readiness check say so.
            status, body = http_get(b.prom_port, "/metrics")
            assert metric(body, "danube_storage_disk_full") == 1.0, body
            assert metric(body, "danube_storage_refused_appends_total",
                          reason="disk_full") >= 3
            assert metric(body, "danube_storage_free_bytes", mount_point=str(volume)) \
                is not None
            status, body = http_get(b.prom_port, "/health/ready")
            assert status == 503, body
            problems = json.loads(body)["problems"]
            assert str(volume) in problems["disk_full"], problems
            assert http_get(b.prom_port, "/health/live")[0] == 200

            # Space freed: the broker is ready again and takes publishes, by itself.
            ballast.unlink()
            wait_for(lambda: http_get(b.prom_port, "/health/ready")[0] == 200,
                     what="readiness once space is freed")
            after = list(range(i, i + 500))
            await producer.send_many([message(n) for n in after])
            acked.update(after)
            status, body = http_get(b.prom_port, "/metrics")
            assert metric(body, "danube_storage_disk_full") == 0.0

            # Every acknowledged message is delivered; nothing that was refused is.
            await async_wait_for(lambda: acked <= received, timeout=60,
                                 what="every acknowledged message delivered")
            reader.cancel()
            assert received <= set(range(i + 500)), "a message nobody sent was delivered"
        assert b.proc.poll() is None, b.log()
    finally:
        b.stop()
    assert "Traceback" not in b.log(), b.log()

    # The WAL recovers after a restart (no torn frame left by the refused appends), with
    # every acknowledged message in it.
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0", data_dir=data).start()
    try:
        async with DanubeClient(f"http://{b.client_addr}", retry=NO_RETRY) as client:
            keep = await client.subscribe(topic, "keeper", "keep", sub_type="exclusive")
            reader = asyncio.ensure_future(collect(keep, kept))
            await async_wait_for(lambda: acked <= kept, timeout=60,
                                 what="every acknowledged message after the restart")
            reader.cancel()
            producer = await client.create_producer(topic, "p", reliable=True)
            await producer.send_many([message(n) for n in range(i + 500, i + 600)])
    finally:
        b.stop()


# -- the descriptor limit ---------------------------------------------------------------------

def limited_broker(data_dir, nofile):
    """A broker whose RLIMIT_NOFILE is ``nofile`` (soft and hard: the broker lifts its soft
    limit to the hard one at start)."""
    b = BrokerProcess(data_dir=data_dir)
    b.command = [sys.executable, "-P", "-c",
                 "import os, resource, sys\n"
                 f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))\n"
                 "os.execv(sys.executable, [sys.executable, '-P', '-m', 'danube', "
                 "*sys.argv[1:]])",
                 "broker"]
    return b.start()


async def test_descriptor_limit_is_resource_exhausted_and_the_broker_goes_on(tmp_path):
    nofile = 200
    b = limited_broker(tmp_path / "data", nofile)
    try:
        async with DanubeClient(f"http://{b.client_addr}", retry=NO_RETRY) as client:
            first = await client.create_producer("/default/fd_first", "p", reliable=True)
            await first.send(b"before")
            refusal = None
            for n in range(nofile):
                try:
                    await client.create_producer(f"/default/fd_{n}", "p", reliable=True)
                except DanubeError as exc:
                    refusal = exc
                    break
            assert refusal is not None, "the descriptor limit was never reached"
            assert refusal.code == StatusCode.RESOURCE_EXHAUSTED, refusal
            text = str(refusal)
            assert f"RLIMIT_NOFILE soft {nofile}, hard {nofile}" in text, text
            assert "ulimit -n" in text and "LimitNOFILE=" in text, text
            assert "INTERNAL" not in text and "Errno" not in text, text
            # The broker still serves the producers it has.
            await first.send(b"after")
            assert b.proc.poll() is None, b.log()
            # A refused topic was taken back whole: asked again, it is refused or made,
            # never half there.
            consumer = await client.subscribe("/default/fd_first", "c", "s",
                                              sub_type="exclusive")
            await first.send(b"still")
            msg = await asyncio.wait_for(consumer.receive(), 30)
            assert msg.payload == b"still"

            # More connections than descriptors: accept() fails for some; the broker goes
            # on, and serves once they are gone.
            socks = []
            try:
                for _ in range(64):         # the broker has next to no descriptor left
                    socks.append(socket.create_connection(("127.0.0.1", b.client_port), 10))
                await first.send(b"crowded")
                assert b.proc.poll() is None, b.log()
            finally:
                for s in socks:
                    s.close()
            await first.send(b"after the crowd")
            # A new connection is served (a producer on a topic that exists: a new one
            # would need descriptors the topics made until the refusal still hold).
            async with DanubeClient(f"http://{b.client_addr}") as other:
                late = await other.create_producer("/default/fd_first", "late", reliable=True)
                await late.send(b"late")
            assert [(await asyncio.wait_for(consumer.receive(), 30)).payload
                    for _ in range(3)] == [b"crowded", b"after the crowd", b"late"]
    finally:
        b.stop()
    assert "Traceback" not in b.log(), b.log()


# -- danube produce counts each message once ----------------------------------------------------

def test_produce_counts_each_message_once_when_publishes_fail(volume):
    b = BrokerProcess(data_dir=volume / "data").start()
    try:
        topic = "/default/cli_full"
        # The topic exists (and its first segment) before the volume fills up.
        warm = subprocess.run([*CLI, "produce", "-s", b.client_addr, "-t", topic, "-m", "x",
                               "--reliable"], capture_output=True, text=True, timeout=120)
        assert warm.returncode == 0, warm.stderr
        ballast = fill(volume, 4 << 20)
        count = 12_000
        result = subprocess.run(
            [*CLI, "produce", "-s", b.client_addr, "-t", topic, "--reliable",
             "-m", "m" * PAYLOAD, "-c", str(count), "--output", "json"],
            capture_output=True, text=True, timeout=300)
        ballast.unlink()
        assert result.returncode == 1, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        summary, per_message = lines[-1], lines[:-1]
        assert summary["sent"] > 0 and summary["failed"] > 0, summary
        assert summary["sent"] + summary["failed"] == count, summary
        # One line per message, each index once, errors and successes as the summary says.
        assert sorted(m["index"] for m in per_message) == list(range(1, count + 1))
        errors = [m for m in per_message if "error" in m]
        assert len(errors) == summary["failed"]
        assert all("RESOURCE_EXHAUSTED" in m["error"] or "disk full" in m["error"]
                   for m in errors), errors[:3]
        # The ones sent are the first ones: the failure stops the run at a batch.
        assert max(m["index"] for m in per_message if "request_id" in m) == summary["sent"]
    finally:
        b.stop()
