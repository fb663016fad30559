"""The edge's PUBACK means on disk, tested as a power cut tests it (tests/support/power_cut.py,
docs/testing.md "Power cuts"): the edge runs under the shim that records what each
fsync/fdatasync made durable, a device publishes at QoS 1 and 2 and the power is cut as the
last ack arrives (`PowerCut.cut(before=)`: a sync that returned after it made nothing
durable). The edge restarted on what the cut left must replicate every message the device
got an ack for.

A SIGKILL keeps the page cache, so `test_edge_resilience.py::test_kill_9_mid_stream` cannot
see an ack sent before the WAL's sync (danube/edge/mqtt/session.py `_send_acks`; the
mutant `edge-puback-before-sync` of tests/mutation/mutants.py)."""

import asyncio
import os
import signal
import socket
import struct
import time

import grpc

from edge_process import EdgeProcess, cluster_payloads, edge_yaml
from mqtt_raw import RawClient, connect, packet, publish
from official_client import start_broker
from power_cut import PowerCut
from waiting import wait_for
from danube.proto import DanubeAdmin_pb2 as adm
from danube.storage.wal import WAL

NS = "edgecut"
TOPIC = f"/{NS}/telemetry"
CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP = 2, 4, 5, 6, 7


def _config(cluster_url):
    return edge_yaml(cluster_url, [
        {"mqtt_pattern": "device/+/telemetry", "danube_topic": TOPIC,
         "extract_attributes": {"device_id": "$1"}}], edge_name=NS,
        replicator={"batch_size": 50, "batch_timeout_ms": 100})


async def _messages_kept(directory):
    """How many messages the WAL in `directory` holds (opened as the edge opens it)."""
    wal = await WAL.open(directory)
    try:
        return wal.next_offset - wal.first_offset
    finally:
        await wal.close()


def _ack_id(kind, got):
    assert got is not None, "the edge closed the connection"
    assert got[0] == kind, f"expected packet type {kind}, got {got}"
    return struct.unpack(">H", got[2][:2])[0]


def test_every_acknowledged_message_survives_a_power_cut_of_the_edge(tmp_path):
    cut = PowerCut(tmp_path / "edge", tmp_path / "cut")
    # No cluster while the device publishes: nothing is replicated before the cut, so what
    # reaches the cluster afterwards is what the edge's WAL kept. The port is bound, never
    # listened on: connections are refused.
    nowhere = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    nowhere.bind(("127.0.0.1", 0))
    edge = EdgeProcess(_config(f"http://127.0.0.1:{nowhere.getsockname()[1]}"),
                       data_dir=cut.root, env=cut.arm()).start(timeout=60)
    acked = []
    answered = None
    try:
        device = RawClient(edge.mqtt_port, timeout=60)
        device.send(connect("cut-device"))
        assert device.read_packet()[0] == CONNACK
        pid = 0
        # One at a time, each waiting for its ack (QoS 1, then QoS 2's PUBREC).
        for i in range(60):
            qos = 1 if i % 3 else 2
            pid += 1
            payload = f"one-{i}".encode()
            device.send(publish("device/d1/telemetry", payload, qos=qos, packet_id=pid))
            assert _ack_id(PUBACK if qos == 1 else PUBREC, device.read_packet()) == pid
            answered = time.monotonic()
            acked.append(payload)
            if qos == 2:
                device.send(packet(0x62, struct.pack(">H", pid)))     # PUBREL
                assert _ack_id(PUBCOMP, device.read_packet()) == pid
        # Runs of publishes in one write (the edge stores a run with one append, in C),
        # the cut as the last ack of the last run arrives.
        for r in range(5):
            run = []
            for i in range(40):
                pid += 1
                run.append((pid, f"run-{r}-{i}".encode()))
            device.send(b"".join(publish("device/d2/telemetry", p, qos=1, packet_id=k)
                                 for k, p in run))
            for k, p in run:
                assert _ack_id(PUBACK, device.read_packet()) == k
                answered = time.monotonic()
                acked.append(p)
    finally:
        edge.proc.send_signal(signal.SIGKILL)
        edge.proc.wait(20)
        nowhere.close()
    records = cut.cut(before=answered)
    assert any("/wal/" in r.path for r in records), "no sync of the edge's WAL seen"
    kept = asyncio.run(_messages_kept(os.path.join(cut.root, "wal", NS, "telemetry")))
    assert kept == len(acked), (f"the edge's WAL keeps {kept} messages after the cut, "
                                f"{len(acked)} were acknowledged")

    cluster = start_broker(tmp_path / "cluster")
    try:
        with grpc.insecure_channel(cluster.admin_addr) as admin:
            admin.unary_unary("/danube_admin.NamespaceAdmin/CreateNamespace",
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=adm.NamespaceResponse.FromString)(
                adm.NamespaceRequest(name=NS), timeout=30)
        edge = EdgeProcess(_config(cluster.client_addr), data_dir=cut.root).start(timeout=60)
        try:
            # Everything acknowledged before the cut, from the WAL the cut left.
            wait_for(lambda: len(cluster_payloads(cluster.client_addr, TOPIC)) >= kept,
                     timeout=120, what="every acknowledged message on the cluster")
            got = cluster_payloads(cluster.client_addr, TOPIC)
            assert got == acked, "not the acknowledged messages, once each, in order"
        finally:
            edge.stop()
    finally:
        cluster.stop()
