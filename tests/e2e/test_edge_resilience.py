"""The edge's promise: what a device got an ack for reaches the cluster exactly once.

* The link to the cluster (a TcpProxy between the edge and the cluster's client port) is
  cut for 60 s while devices keep publishing; after it heals every message is on the
  cluster, in order, none twice.
* The edge is killed with SIGKILL while a device publishes at QoS 1; restarted on the same
  data directory, it replicates every acked message, none twice."""

import threading
import time

import grpc
import paho.mqtt.client as mqtt
import pytest

from edge_process import EdgeProcess, cluster_payloads, edge_yaml
from official_client import start_broker
from tcp_proxy import TcpProxy
from waiting import wait_for
from danube.proto import DanubeAdmin_pb2 as adm

TOPIC = "/edgeres/telemetry"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("edge-res-cluster") / "data")
    with grpc.insecure_channel(b.admin_addr) as admin:
        admin.unary_unary("/danube_admin.NamespaceAdmin/CreateNamespace",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=adm.NamespaceResponse.FromString)(
            adm.NamespaceRequest(name="edgeres"), timeout=10)
    yield b
    b.stop()


def _config(cluster_addr):
    return edge_yaml(cluster_addr, [
        {"mqtt_pattern": "device/+/telemetry", "danube_topic": TOPIC,
         "extract_attributes": {"device_id": "$1"}}], edge_name="edgeres",
        replicator={"batch_size": 50, "batch_timeout_ms": 100})


def publish_all(port, payloads, qos=1):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    infos = [c.publish("device/d1/telemetry", p, qos=qos) for p in payloads]
    for info in infos:
        info.wait_for_publish(30)
    c.disconnect()
    c.loop_stop()


def test_link_cut_for_60s(cluster, tmp_path):
    proxy = TcpProxy(cluster.client_port)
    edge = EdgeProcess(_config(proxy.endpoint), data_dir=tmp_path / "edge").start()
    try:
        wait_for(lambda: "registered with cluster" in edge.log(), timeout=30)
        before = [f"before-{i}".encode() for i in range(300)]
        publish_all(edge.mqtt_port, before)
        wait_for(lambda: cluster_payloads(cluster.client_addr, TOPIC) == before, timeout=60,
                 what="the first 300 on the cluster")
        proxy.cut()
        during = [f"during-{i}".encode() for i in range(500)]
        publish_all(edge.mqtt_port, during[:250])
        time.sleep(30)          # the cut lasts 60 s: devices keep publishing meanwhile
        publish_all(edge.mqtt_port, during[250:])
        time.sleep(30)
        assert cluster_payloads(cluster.client_addr, TOPIC) == before
        proxy.heal()
        after = [f"after-{i}".encode() for i in range(200)]
        publish_all(edge.mqtt_port, after)
        wait_for(lambda: len(cluster_payloads(cluster.client_addr, TOPIC)) >= 1000,
                 timeout=120, what="all 1000 messages on the cluster")
        assert cluster_payloads(cluster.client_addr, TOPIC) == before + during + after
        assert "replication of /edgeres/telemetry interrupted" in edge.log()
    finally:
        edge.stop()
        proxy.cut()


def test_kill_9_mid_stream(cluster, tmp_path):
    topic_before = len(cluster_payloads(cluster.client_addr, TOPIC))
    edge = EdgeProcess(_config(cluster.client_addr), data_dir=tmp_path / "edge").start()
    acked = []                  # packet ids (mids), in ack order
    sent = {}                   # mid -> payload; mids are not reused: under 65535 messages
    stop = threading.Event()

    def device(port):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="", protocol=mqtt.MQTTv311)
        c.on_publish = lambda client, userdata, mid, reason_code, properties: acked.append(mid)
        c.max_inflight_messages_set(50)
        c.connect("127.0.0.1", port)
        c.loop_start()
        wait_for(c.is_connected, timeout=20, what="the device connected")
        i = 0
        while not stop.is_set():
            payload = f"k-{i}".encode()
            info = c.publish("device/d9/telemetry", payload, qos=1)
            sent[info.mid] = payload
            i += 1
            if i % 50 == 0:
                time.sleep(0.01)
            if i >= 60_000:
                stop.wait()
        c.loop_stop()

    t = threading.Thread(target=device, args=(edge.mqtt_port,), daemon=True)
    t.start()
    try:
        wait_for(lambda: len(acked) >= 2000, timeout=60, what="2000 acked before the kill")
        edge.kill()
        stop.set()
        t.join(30)
        acked_before_kill = [sent[mid] for mid in acked]
        edge.start()
        wait_for(lambda: "registered with cluster" in edge.log(), timeout=30)
        # Every acked message arrives; none twice (a message stored but not acked may be
        # there too: the device could not know, and would resend it after reconnecting).
        wait_for(lambda: set(acked_before_kill) <= set(
            cluster_payloads(cluster.client_addr, TOPIC)[topic_before:]), timeout=120,
            what="every acked message on the cluster")
        got = cluster_payloads(cluster.client_addr, TOPIC)[topic_before:]
        dups = [(i, p) for i, p in enumerate(got) if got.index(p) != i]
        assert not dups, f"stored twice: {dups[:3]}..{dups[-1:]} of {len(got)}\n{edge.log()}"
        # In publish order: the edge's WAL order.
        assert got == sorted(got, key=lambda p: int(p.split(b"-")[1]))
    finally:
        stop.set()
        edge.stop()
