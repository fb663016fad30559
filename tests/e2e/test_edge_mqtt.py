"""The edge end to end: a real cluster broker, a real `danube broker --mode edge` in front
of it, and real MQTT clients (paho-mqtt at 3.1.1 and 5.0; Debian's mosquitto_pub and
mosquitto_sub). Messages go MQTT -> the edge's WAL -> ReplicateData -> the cluster topic,
where a consumer (`danube consume`) or the topic's history reads them."""

import json
import subprocess
import sys
import threading

import grpc
import paho.mqtt.client as mqtt
import pytest
import yaml

from edge_process import (UPSTREAM_EDGE_YAML, EdgeProcess, cluster_messages,
                          cluster_payloads, edge_yaml)
from official_client import start_broker
from waiting import holds_for, wait_for
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr


def _unary(channel, path, request, response_cls):
    return channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=response_cls.FromString)(request,
                                                                             timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("edge-mqtt-cluster") / "data")
    with grpc.insecure_channel(b.admin_addr) as admin:
        for ns in ("edge1", "edgeq", "edgeschema", "edgewal"):
            _unary(admin, "/danube_admin.NamespaceAdmin/CreateNamespace",
                   adm.NamespaceRequest(name=ns), adm.NamespaceResponse)
    with grpc.insecure_channel(b.client_addr) as client:
        _unary(client, "/danube_schema.SchemaRegistry/RegisterSchema",
               sr.RegisterSchemaRequest(
                   subject="edge-readings", schema_type="json_schema",
                   schema_definition=json.dumps({
                       "type": "object", "required": ["temp"],
                       "properties": {"temp": {"type": "number"}}}).encode()),
               sr.RegisterSchemaResponse)
    yield b
    b.stop()


def paho_client(port, version=mqtt.MQTTv311, client_id=""):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version)
    c.acks = []
    c.on_publish = lambda client, userdata, mid, reason_code, properties: c.acks.append(
        (mid, reason_code.value if hasattr(reason_code, "value") else int(reason_code)))
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    return c


def test_upstreams_edge_yaml_starts_and_routes(cluster, tmp_path):
    """config/edge.yaml exactly as upstream ships it, but for the two addresses: its schema
    subjects are not on this cluster, so those topics wait (no message taken), and the
    catch-all topic (raw bytes) carries what devices send."""
    with open(UPSTREAM_EDGE_YAML) as f:
        doc = yaml.safe_load(f)
    doc["edge"]["cluster_url"] = f"http://{cluster.client_addr}"
    doc["mqtt"]["listener"] = "127.0.0.1:0"
    edge = EdgeProcess(yaml.safe_dump(doc), data_dir=tmp_path / "edge").start()
    try:
        wait_for(lambda: "registered with cluster" in edge.log(), timeout=30,
                 what="the edge registered")
        assert "schema subject not found" in edge.log()
        c = paho_client(edge.mqtt_port)
        infos = [c.publish("anything/else", f"raw-{i}".encode(), qos=1) for i in range(5)]
        for info in infos:
            info.wait_for_publish(20)
        c.disconnect()
        c.loop_stop()
        wait_for(lambda: cluster_payloads(cluster.client_addr, "/edge1/unrouted")[-5:]
                 == [f"raw-{i}".encode() for i in range(5)], timeout=30,
                 what="the catch-all topic replicated")
    finally:
        edge.stop()


@pytest.fixture(scope="module")
def edgeq(cluster, tmp_path_factory):
    text = edge_yaml(cluster.client_addr, [
        {"mqtt_pattern": "device/+/telemetry", "danube_topic": "/edgeq/telemetry",
         "extract_attributes": {"device_id": "$1"}},
        {"mqtt_pattern": "site/+/+/#", "danube_topic": "/edgeq/sites",
         "extract_attributes": {"site": "$1", "kind": "$2"}},
        {"mqtt_pattern": "#", "danube_topic": "/edgeq/unrouted"}], edge_name="edgeq")
    edge = EdgeProcess(text, data_dir=tmp_path_factory.mktemp("edgeq") / "data").start()
    wait_for(lambda: "registered with cluster" in edge.log(), timeout=30)
    yield edge
    edge.stop()


def consume(cluster, topic, count, subscription):
    """`danube consume` on the cluster, started now; returns (process, thread output)."""
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "danube", "consume", "-s", f"http://{cluster.client_addr}",
         "-t", topic, "-m", subscription, "--count", str(count), "--timeout", "60",
         "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Consuming from"):
                ready.set()
        ready.set()
    threading.Thread(target=pump, daemon=True).start()
    assert ready.wait(30)
    return proc, lines


@pytest.mark.parametrize("version,qos", [(mqtt.MQTTv311, 1), (mqtt.MQTTv311, 2),
                                         (mqtt.MQTTv5, 1), (mqtt.MQTTv5, 2)])
def test_qos_round_trip_to_a_cluster_consumer(cluster, edgeq, version, qos):
    sub = f"rt-{version}-{qos}"
    proc, lines = consume(cluster, "/edgeq/telemetry", 20, sub)
    c = paho_client(edgeq.mqtt_port, version)
    sent = [f"v{version}-q{qos}-{i}".encode() for i in range(20)]
    infos = [c.publish(f"device/dev{i % 3}/telemetry", p, qos=qos) for i, p in enumerate(sent)]
    for info in infos:
        info.wait_for_publish(20)
    assert all(rc == 0 for _, rc in c.acks)
    c.disconnect()
    c.loop_stop()
    assert proc.wait(90) == 0, "".join(lines)
    got = [json.loads(x) for x in lines if x.startswith("{")]
    assert [g["payload"].encode() for g in got] == sent
    assert [g["attributes"]["device_id"] for g in got] == [f"dev{i % 3}" for i in range(20)]
    assert {g["producer"] for g in got} == {"mqtt-gateway"}


def test_mosquitto_clients(cluster, edgeq):
    """mosquitto_pub at QoS 1 (3.1.1) and QoS 2 (5.0, with a user property), captures of
    a multi-level pattern as attributes; mosquitto_sub is refused (ingestion only)."""
    port = str(edgeq.mqtt_port)
    lines = "\n".join(f"mosq-{i}" for i in range(50)) + "\n"
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-q", "1",
                    "-t", "site/berlin/temp/a/b", "-l"], input=lines, text=True, check=True,
                   timeout=60)
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-q", "2", "-V", "mqttv5",
                    "-t", "site/paris/hum", "-m", "mosq-v5",
                    "-D", "publish", "user-property", "unit", "pct"], check=True, timeout=60)
    wait_for(lambda: len(cluster_payloads(cluster.client_addr, "/edgeq/sites")) == 51,
             timeout=30, what="51 messages on /edgeq/sites")
    msgs = cluster_messages(cluster.client_addr, "/edgeq/sites")
    assert [m.payload for m in msgs[:50]] == [f"mosq-{i}".encode() for i in range(50)]
    assert dict(msgs[0].attributes) == {"site": "berlin", "kind": "temp"}
    assert dict(msgs[50].attributes) == {"site": "paris", "kind": "hum", "mqtt.user.unit": "pct"}
    sub = subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", port, "-t", "device/#",
                          "-C", "1", "-W", "10"], capture_output=True, text=True, timeout=30)
    assert "All subscription requests were denied" in sub.stderr


@pytest.fixture(scope="module")
def edge_schema(cluster, tmp_path_factory):
    text = edge_yaml(cluster.client_addr, [
        {"mqtt_pattern": "readings/+", "danube_topic": "/edgeschema/readings",
         "schema_subject": "edge-readings", "validation_policy": "enforce",
         "extract_attributes": {"sensor": "$1"}}], edge_name="edgeschema")
    edge = EdgeProcess(text, data_dir=tmp_path_factory.mktemp("edgeschema") / "d").start()
    wait_for(lambda: "registered with cluster" in edge.log(), timeout=30)
    yield edge
    edge.stop()


def test_schema_rejection(cluster, edge_schema):
    """Payloads that fail the cluster's schema are refused at the edge: an MQTT 5 device
    gets PUBACK 0x99 (payload format invalid), a 3.1.1 device a plain PUBACK (3.1.1 has no
    refusal; upstream does the same); neither is stored. Valid ones carry the schema id."""
    v5 = paho_client(edge_schema.mqtt_port, mqtt.MQTTv5)
    ok = v5.publish("readings/s1", json.dumps({"temp": 21.5}).encode(), qos=1)
    bad = v5.publish("readings/s1", b'{"temp": "warm"}', qos=1)
    notjson = v5.publish("readings/s1", b"not json", qos=1)
    for info in (ok, bad, notjson):
        info.wait_for_publish(20)
    codes = dict(v5.acks)
    assert codes[ok.mid] == 0 and codes[bad.mid] == 0x99 and codes[notjson.mid] == 0x99
    v5.disconnect()
    v5.loop_stop()
    v3 = paho_client(edge_schema.mqtt_port, mqtt.MQTTv311)
    bad3 = v3.publish("readings/s2", b"[]", qos=1)
    ok3 = v3.publish("readings/s2", json.dumps({"temp": 3}).encode(), qos=1)
    bad3.wait_for_publish(20)
    ok3.wait_for_publish(20)
    v3.disconnect()
    v3.loop_stop()
    wait_for(lambda: len(cluster_payloads(cluster.client_addr, "/edgeschema/readings")) == 2,
             timeout=30)
    msgs = cluster_messages(cluster.client_addr, "/edgeschema/readings")
    assert [json.loads(m.payload) for m in msgs] == [{"temp": 21.5}, {"temp": 3}]
    assert all(m.HasField("schema_id") and m.schema_version == 1 for m in msgs)
    assert [m.attributes["sensor"] for m in msgs] == ["s1", "s2"]


def test_schema_update_reaches_the_edge_by_heartbeat(cluster, edge_schema):
    """A new version of the subject on the cluster reaches the edge at its next heartbeat
    (500 ms here): payloads valid only under the old version are then refused."""
    with grpc.insecure_channel(cluster.client_addr) as client:
        _unary(client, "/danube_schema.SchemaRegistry/SetCompatibilityMode",
               sr.SetCompatibilityModeRequest(subject="edge-readings",
                                              compatibility_mode="none"),
               sr.SetCompatibilityModeResponse)
        _unary(client, "/danube_schema.SchemaRegistry/RegisterSchema",
               sr.RegisterSchemaRequest(
                   subject="edge-readings", schema_type="json_schema",
                   schema_definition=json.dumps({
                       "type": "object", "required": ["temp", "unit"],
                       "properties": {"temp": {"type": "number"}}}).encode()),
               sr.RegisterSchemaResponse)
    wait_for(lambda: "schema updated on the cluster" in edge_schema.log(), timeout=30,
             what="the edge heard of version 2")
    c = paho_client(edge_schema.mqtt_port, mqtt.MQTTv5)
    old = c.publish("readings/s3", json.dumps({"temp": 1}).encode(), qos=1)
    new = c.publish("readings/s3", json.dumps({"temp": 2, "unit": "C"}).encode(), qos=1)
    old.wait_for_publish(20)
    new.wait_for_publish(20)
    c.disconnect()
    c.loop_stop()
    assert dict(c.acks) == {old.mid: 0x99, new.mid: 0}
    wait_for(lambda: any(json.loads(m.payload) == {"temp": 2, "unit": "C"} and
                         m.schema_version == 2
                         for m in cluster_messages(cluster.client_addr,
                                                   "/edgeschema/readings")), timeout=30)


@pytest.mark.parametrize("args,words", [
    (["--data-dir", "x"], "--mode edge requires --edge-config"),
    (["--edge-config", "e.yaml"], "--mode edge requires --data-dir"),
    (["--data-dir", "x", "--edge-config", "e.yaml", "--config-file", "b.yml"],
     "cannot be used together with --config-file"),
    (["--data-dir", "x", "--edge-config", "/nonexistent/edge.yaml"],
     "failed to read edge config '/nonexistent/edge.yaml'"),
])
def test_edge_command_line_refusals(args, words, tmp_path):
    """Upstream's args_parse.rs rules, and a config that cannot be read: exit status 2 and
    the reason, nothing started."""
    run = subprocess.run([sys.executable, "-P", "-m", "danube", "broker", "--mode", "edge",
                          *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2
    assert words in run.stderr


def test_edge_config_errors_name_the_key(tmp_path):
    bad = tmp_path / "edge.yaml"
    bad.write_text("edge: {edge_name: e1, cluster_url: 'http://x:1'}\n"
                   "mqtt: {topic_mappings: [{mqtt_pattern: 'a/#/b', danube_topic: /e1/t}]}\n")
    run = subprocess.run([sys.executable, "-P", "-m", "danube", "broker", "--mode", "edge",
                          "--data-dir", str(tmp_path / "d"), "--edge-config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "mqtt.topic_mappings[0].mqtt_pattern" in run.stderr


def test_replicated_segments_leave_the_edge(cluster, tmp_path):
    """With small WAL segments (wal.segment_max_bytes, ours), the segments the cluster has
    acked are deleted at the edge; a restart continues after them."""
    text = edge_yaml(cluster.client_addr, [
        {"mqtt_pattern": "#", "danube_topic": "/edgewal/t"}], edge_name="edgewal")
    text += "wal:\n  segment_max_bytes: 16384\n"
    edge = EdgeProcess(text, data_dir=tmp_path / "edge").start()
    wal_dir = tmp_path / "edge" / "wal" / "edgewal" / "t"
    try:
        wait_for(lambda: "registered with cluster" in edge.log(), timeout=30)
        c = paho_client(edge.mqtt_port)
        for info in [c.publish("x", b"%04d" % i + b"." * 96, qos=1) for i in range(1000)]:
            info.wait_for_publish(30)
        c.disconnect()
        c.loop_stop()
        wait_for(lambda: len(cluster_payloads(cluster.client_addr, "/edgewal/t")) == 1000,
                 timeout=60)
        # ~150 KB of frames in 16 KiB segments: all but the active one go once acked.
        wait_for(lambda: len(list(wal_dir.glob("wal.*.log"))) <= 2, timeout=30,
                 what="acked segments deleted")
        edge.stop()
        edge.start()
        c = paho_client(edge.mqtt_port)
        c.publish("x", b"after-restart", qos=1).wait_for_publish(30)
        c.disconnect()
        c.loop_stop()
        wait_for(lambda: cluster_payloads(cluster.client_addr, "/edgewal/t")[-1:] ==
                 [b"after-restart"], timeout=60)
        assert len(cluster_payloads(cluster.client_addr, "/edgewal/t")) == 1001
    finally:
        edge.stop()


def test_qos2_resend_retain_and_will(cluster, edgeq):
    """A QoS 2 message resent (DUP) before PUBREL is stored once; the retain flag is
    ignored (the message is stored like any other) and a will is not published, as
    upstream treats them."""
    from mqtt_raw import RawClient, packet, publish, string
    import struct
    before = len(cluster_payloads(cluster.client_addr, "/edgeq/unrouted"))
    c = RawClient(edgeq.mqtt_port)
    will_connect = packet(0x10, string("MQTT") + bytes([4, 0x02 | 0x04 | 0x08]) +
                          struct.pack(">H", 60) + string("willer") + string("will/topic") +
                          string("gone"))
    c.send(will_connect)
    assert c.read_packet()[2][1] == 0
    first = publish("q2/topic", b"exactly-once", qos=2, packet_id=5)
    c.send(first + bytes([first[0] | 0x08]) + first[1:])      # the resend, DUP set
    assert [c.read_packet()[0] for _ in range(2)] == [5, 5]    # PUBREC twice
    c.send(b"\x62\x02\x00\x05")                                 # PUBREL
    kind, _, body = c.read_packet()
    assert kind == 7 and body[:2] == b"\x00\x05"               # PUBCOMP
    retained = publish("r/topic", b"retained", qos=1, packet_id=6)
    c.send(bytes([retained[0] | 0x01]) + retained[1:])
    assert c.read_packet()[0] == 4
    c.close()                                                   # no DISCONNECT: will due
    wait_for(lambda: len(cluster_payloads(cluster.client_addr, "/edgeq/unrouted")) >=
             before + 2, timeout=30)
    got = cluster_payloads(cluster.client_addr, "/edgeq/unrouted")[before:]
    assert got.count(b"exactly-once") == 1 and b"retained" in got
    holds_for(lambda: b"gone" not in cluster_payloads(cluster.client_addr,
                                                      "/edgeq/unrouted")[before:], 3,
              what="no will published")
