"""Run the real edge (`danube broker --mode edge`) for tests: an edge.yaml of upstream's
shape written from a few arguments, readiness and the MQTT port from its log; and what a
cluster topic holds, read back through danube_ext.TopicHistory."""

import os
import re
import signal
import subprocess
import sys
import threading

import grpc
import yaml

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext

READY = re.compile(r"edge ready: .* MQTT listening on ([\d.]+):(\d+)")
UPSTREAM_EDGE_YAML = os.path.join(os.path.dirname(__file__), "upstream_edge.yaml")


def edge_yaml(cluster_addr, mappings=None, *, edge_name="edge1", listener="127.0.0.1:0",
              replicator=None, mqtt_extra=None, heartbeat_interval_ms=500):
    """The text of an edge.yaml in upstream's shape (config/edge.yaml)."""
    if mappings is None:
        mappings = [{"mqtt_pattern": "device/+/telemetry",
                     "danube_topic": f"/{edge_name}/telemetry",
                     "extract_attributes": {"device_id": "$1"}},
                    {"mqtt_pattern": "#", "danube_topic": f"/{edge_name}/unrouted"}]
    url = cluster_addr if "://" in cluster_addr else f"http://{cluster_addr}"
    doc = {"edge": {"edge_name": edge_name, "cluster_url": url,
                    "token": "", "heartbeat_interval_ms": heartbeat_interval_ms},
           "replicator": replicator or {"batch_size": 100, "batch_timeout_ms": 100},
           "mqtt": {"listener": listener, "topic_mappings": mappings,
                    "ingestion": {"batch_size": 100, "batch_timeout_ms": 500},
                    **(mqtt_extra or {})}}
    return yaml.safe_dump(doc, sort_keys=False)


class EdgeProcess:
    def __init__(self, config_text, *, data_dir, extra_args=(), env=None):
        self.env = env
        self.data_dir = str(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.config_path = os.path.join(os.path.dirname(self.data_dir.rstrip("/")),
                                        os.path.basename(self.data_dir) + "-edge.yaml")
        with open(self.config_path, "w") as f:
            f.write(config_text)
        self.command = [sys.executable, "-P", "-m", "danube", "broker", "--mode", "edge",
                        "--data-dir", self.data_dir, "--edge-config", self.config_path,
                        *extra_args]
        self.proc = None
        self.lines = []
        self.mqtt_port = None
        self._ready = threading.Event()

    def start(self, timeout=30):
        # A restart gets its own lines and readiness: the previous process's reader may
        # still be finishing, and its end once made a restart look ready on the old port.
        lines, ready = [], threading.Event()
        self.lines, self._ready, self.mqtt_port = lines, ready, None
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **(self.env or {})))
        threading.Thread(target=self._pump, args=(self.proc, lines, ready),
                         daemon=True).start()
        if not ready.wait(timeout) or self.proc.poll() is not None or self.mqtt_port is None:
            self.stop()
            raise RuntimeError("edge did not become ready:\n" + self.log())
        return self

    def _pump(self, proc, lines, ready):
        for line in proc.stdout:
            lines.append(line)
            m = READY.search(line)
            if m and ready is self._ready:
                self.mqtt_port = int(m.group(2))
                ready.set()
        ready.set()

    def log(self):
        return "".join(self.lines)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"edge did not stop within {timeout} s of SIGTERM:\n"
                               + self.log()[-4000:]) from None


def cluster_messages(client_addr, topic):
    """Every StreamMessage the cluster's reliable ``topic`` holds, in offset order (none
    while the topic does not exist)."""
    with grpc.insecure_channel(client_addr) as ch:
        try:
            offsets = ch.unary_unary("/danube_ext.TopicHistory/GetOffsets",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=ext.OffsetsResponse.FromString)(
                ext.OffsetsRequest(topic=topic), timeout=10)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise
        part = offsets.partitions[0]
        if part.latest <= part.earliest:
            return []
        call = ch.unary_stream("/danube_ext.TopicHistory/ReadRange",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=ext.ReadRangeBatch.FromString)
        return [pb.StreamMessage.FromString(raw)
                for batch in call(ext.ReadRangeRequest(topic=topic,
                                                       start_offset=part.earliest,
                                                       end_offset=part.latest), timeout=60)
                for raw in batch.messages]


def cluster_payloads(client_addr, topic):
    return [m.payload for m in cluster_messages(client_addr, topic)]
