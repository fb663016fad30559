"""The edge against a cluster in `auth.mode: tls`: it reaches the cluster over TLS (the CA
from SSL_CERT_FILE, as any OpenSSL client) with `--edge-token` as its bearer token, and the
cluster's RBAC decides: Replicate lets it register and replicate, no binding leaves it
refused (PERMISSION_DENIED, retried) with nothing stored."""

import paho.mqtt.client as mqtt
import pytest

from edge_process import EdgeProcess, edge_yaml
from secure_broker import SUPER, Security, broker_fixture, token
from secure_broker import admin, client  # noqa: F401 - fixtures
from waiting import wait_for
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext

pytestmark = pytest.mark.timeout(180)

broker = broker_fixture("edge-sec")


@pytest.fixture(scope="module")
def namespace(admin):
    admin.call("/danube_admin.NamespaceAdmin/CreateNamespace",
               adm.NamespaceRequest(name="edgesec"), adm.NamespaceResponse,
               token=token(SUPER))
    sec = Security(admin)
    sec.role("edge-replicator", "Replicate")
    sec.bind("edge-dev-b", "edge-dev", ["edge-replicator"], "cluster", "")
    return "edgesec"


def _edge(broker, certs, tmp_path, tok):
    text = edge_yaml(f"https://127.0.0.1:{broker.client_port}", [
        {"mqtt_pattern": "#", "danube_topic": "/edgesec/all"}], edge_name="edgesec")
    return EdgeProcess(text, data_dir=tmp_path / "edge", extra_args=("--edge-token", tok),
                       env={"SSL_CERT_FILE": certs.ca_file}).start()


def _latest(client):
    return client.call("/danube_ext.TopicHistory/GetOffsets",
                       ext.OffsetsRequest(topic="/edgesec/all"), ext.OffsetsResponse,
                       token=token(SUPER)).partitions[0].latest


def test_refused_without_replicate(broker, certs, client, namespace, tmp_path):
    edge = _edge(broker, certs, tmp_path, token("stranger"))
    try:
        wait_for(lambda: "PERMISSION_DENIED" in edge.log(), timeout=30,
                 what="the cluster refusing the edge")
        assert "Replicate" in edge.log()
        assert "registered with cluster" not in edge.log()
    finally:
        edge.stop()


def test_replicates_with_its_token(broker, certs, client, namespace, tmp_path):
    edge = _edge(broker, certs, tmp_path, token("edge-dev"))
    try:
        wait_for(lambda: "registered with cluster" in edge.log(), timeout=30)
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        c.connect("127.0.0.1", edge.mqtt_port)
        c.loop_start()
        for info in [c.publish("any/topic", b"m%d" % i, qos=1) for i in range(10)]:
            info.wait_for_publish(20)
        c.disconnect()
        c.loop_stop()
        wait_for(lambda: _latest(client) == 10, timeout=30, what="10 messages replicated")
    finally:
        edge.stop()
