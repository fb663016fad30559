"""Tiered storage through the real `danube broker --mode standalone --config-file F`
process: the storage section comes from the file, SIGTERM seals and uploads the active
segment, a broker whose WAL directory is deleted recovers the topic from the durable tier
(the official client's subscription gets every message), and a durable store that cannot
be used stops the broker at start-up with a message naming it."""

import asyncio
import shutil
import subprocess
import sys

import yaml

from broker_process import BrokerProcess
from danube.client import DanubeClient
from danube.storage.tiered.catalog import parse_object_key, topic_object_prefix
import objstore_servers
import official_client


def _config(tmp_path, durable, interval=60):
    path = tmp_path / "broker.yml"
    path.write_text(yaml.safe_dump({
        "storage": {"mode": "object_store",
                    "durable": dict(durable, upload_interval_seconds=interval)},
        "dispatch": {"max_unacked_messages": 1000}}))
    return path


async def _publish(addr, topic, start, n, subscription=None):
    async with DanubeClient(f"http://{addr}") as client:
        producer = await client.create_producer(topic, f"p{start}", reliable=True)
        if subscription:
            # A reliable subscription outlives its consumer: it waits at offset 0.
            consumer = await client.subscribe(topic, "first", subscription,
                                              sub_type="exclusive")
            await consumer.close()
        await producer.send_many([b"msg-%d" % i for i in range(start, start + n)])


def test_sigterm_uploads_and_a_lost_wal_is_recovered(request, tmp_path):
    server = objstore_servers.server_for(request, "s3")
    durable = objstore_servers.durable_config("s3", server, tmp_path, request.node.name)
    cfg = _config(tmp_path, durable)
    data = tmp_path / "data"
    topic = "/default/tiered-proc"

    broker = BrokerProcess("--config-file", str(cfg), data_dir=data).start()
    try:
        asyncio.run(_publish(broker.client_addr, topic, 0, 500, subscription="survivor"))
    finally:
        assert broker.stop(timeout=60) == 0     # the last upload may be slow on a busy machine
    assert "every reliable topic is in the durable tier" in broker.log()

    store = objstore_servers.store_from_config(durable)
    try:
        spans = [parse_object_key(o.key) for o in store.list(topic_object_prefix(topic))]
    finally:
        store.close()
    assert spans and spans[0][0] == 0 and spans[-1][1] == 499

    shutil.rmtree(data / "wal" / "default" / "tiered-proc")
    broker = BrokerProcess("--config-file", str(cfg), data_dir=data).start()
    try:
        asyncio.run(_publish(broker.client_addr, topic, 500, 100))
        expect = tmp_path / "expect.txt"
        expect.write_text("\n".join("msg-%d" % i for i in range(600)))
        got = official_client.run_scenario("reliable_drain.py", {
            "url": official_client.broker_url(broker), "topic": topic, "name": "official",
            "subscription": "survivor", "expect_file": str(expect)})
    finally:
        broker.stop()
    assert got["complete"] and not got["ack_errors"]
    assert got["received"] == [["msg-%d" % i, i] for i in range(600)]


def test_unusable_store_stops_the_broker_at_startup(tmp_path):
    with objstore_servers.Unreachable() as nowhere:
        durable = objstore_servers.durable_config("s3", nowhere, tmp_path, "unreachable")
        cfg = _config(tmp_path, durable)
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
             "--config-file", str(cfg), "--data-dir", str(tmp_path / "d"),
             "--broker-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "cannot start: storage.durable" in proc.stderr


def test_bad_storage_section_is_a_config_error(tmp_path):
    cfg = tmp_path / "broker.yml"
    cfg.write_text("storage:\n  mode: object_store\n")
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
         "--config-file", str(cfg), "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "storage.durable" in proc.stderr
