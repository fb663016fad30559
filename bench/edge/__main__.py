"""bench.edge: MQTT ingest into the edge's WAL against Debian's mosquitto receiving the same
stream, and replication throughput edge -> cluster (see bench/README.md).

    .venv/bin/python -m bench.edge                 # ~1-2 minutes
    .venv/bin/python -m bench.edge --messages 50000 --connections 2

Ingest: ``--connections`` publishers (threads with raw sockets, pre-encoded PUBLISH packets,
so the load generator costs next to nothing) send ``--messages`` each to one server at a
time. QoS 1 keeps ``--window`` messages unacknowledged per connection, the same for both
servers; the time runs from the first byte to the last PUBACK. QoS 0 ends each connection
with a PINGREQ: its PINGRESP comes after every PUBLISH before it was read. The edge acks
QoS 1 after the WAL's fsync (durability always); mosquitto runs with persistence off (no
fsync at all). The edge's cluster is unreachable during ingest, so replication takes no CPU.

Replication: an edge whose WAL holds the messages of the ingest runs is pointed at a fresh
cluster broker; the time runs from the edge's start to the last message on the cluster."""

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from bench._proc import popen, reap_all, repo_env
from danube.devcluster.procs import free_port
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeExt_pb2 as ext

TOPIC = "device/d1/telemetry"


def _string(s):
    raw = s.encode()
    return struct.pack(">H", len(raw)) + raw


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(first, body):
    return bytes([first]) + _varint(len(body)) + body


def connect_packet(client_id):
    return _packet(0x10, _string("MQTT") + bytes([4, 0x02]) + struct.pack(">H", 60)
                   + _string(client_id))


def publishes(n, size, qos):
    payload = b"x" * size
    out = []
    for i in range(n):
        body = _string(TOPIC)
        if qos:
            body += struct.pack(">H", i % 65535 + 1)
        out.append(_packet(0x30 | (qos << 1), body + payload))
    return out


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(max(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return buf


def publisher(port, idx, packets, qos, window, results):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(connect_packet(f"bench-{idx}-{time.monotonic_ns()}"))
    assert _recv_exact(sock, 4)[3] == 0, "CONNACK refused"
    results["ready"].wait()
    start = time.monotonic()
    n = len(packets)
    if qos == 0:
        chunk = 2000
        for i in range(0, n, chunk):
            sock.sendall(b"".join(packets[i:i + chunk]))
        sock.sendall(b"\xc0\x00")
        tail = b""
        while not tail.endswith(b"\xd0\x00"):
            tail = (tail + sock.recv(65536))[-2:]
    else:
        sent = acked = 0
        step = max(1, window // 4)
        pending = b""
        while acked < n:
            if sent < n and sent - acked <= window - step:
                m = min(step, n - sent)
                sock.sendall(b"".join(packets[sent:sent + m]))
                sent += m
                continue
            pending += sock.recv(65536)
            acked += len(pending) // 4        # PUBACKs: 4 bytes each
            pending = pending[len(pending) - len(pending) % 4:]
    results["times"].append((start, time.monotonic()))
    sock.close()


def ingest(port, connections, messages, size, qos, window):
    packets = publishes(messages, size, qos)
    results = {"ready": threading.Event(), "times": []}
    threads = [threading.Thread(target=publisher, args=(port, i, packets, qos, window, results))
               for i in range(connections)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    results["ready"].set()
    for t in threads:
        t.join()
    first = min(s for s, _ in results["times"])
    last = max(e for _, e in results["times"])
    return connections * messages / (last - first)


def start_mosquitto(tmp):
    port = free_port()
    conf = os.path.join(tmp, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                "log_dest none\nmax_queued_messages 0\n")
    p = popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(port)
    return p, port


def _wait_port(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_edge(tmp, cluster_addr, data_dir):
    conf = os.path.join(tmp, "edge.yaml")
    port = free_port()
    with open(conf, "w") as f:
        f.write(f"""edge:
  edge_name: benchedge
  cluster_url: "http://{cluster_addr}"
  heartbeat_interval_ms: 1000
replicator:
  batch_size: 1000
  batch_timeout_ms: 50
mqtt:
  listener: "127.0.0.1:{port}"
  max_connections: 1000
  limits: {{max_inflight: 65535}}
  topic_mappings:
    - mqtt_pattern: "device/+/telemetry"
      danube_topic: "/benchedge/telemetry"
      extract_attributes: {{device_id: "$1"}}
""")
    p = popen([sys.executable, "-P", "-m", "danube", "broker", "--mode", "edge", "--data-dir",
               data_dir, "--edge-config", conf, "--log-level", "warning"], env=repo_env(),
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(port)
    return p, port


def start_cluster(tmp):
    client, admin = free_port(), free_port()
    p = popen([sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone", "--data-dir",
               os.path.join(tmp, "cluster"), "--broker-addr", f"127.0.0.1:{client}",
               "--admin-addr", f"127.0.0.1:{admin}", "--log-level", "warning"], env=repo_env(),
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port(client)
    with grpc.insecure_channel(f"127.0.0.1:{admin}") as ch:
        ch.unary_unary("/danube_admin.NamespaceAdmin/CreateNamespace",
                       request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=adm.NamespaceResponse.FromString)(
            adm.NamespaceRequest(name="benchedge"), timeout=10)
    return p, f"127.0.0.1:{client}"


def cluster_count(addr, topic):
    with grpc.insecure_channel(addr) as ch:
        try:
            r = ch.unary_unary("/danube_ext.TopicHistory/GetOffsets",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=ext.OffsetsResponse.FromString)(
                ext.OffsetsRequest(topic=topic), timeout=5)
        except grpc.RpcError:
            return 0
        return r.partitions[0].latest


def stop(p):
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()


def main():
    ap = argparse.ArgumentParser(prog="bench.edge")
    ap.add_argument("--messages", type=int, default=100_000, help="per connection and run")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--size", type=int, default=100, help="payload bytes")
    ap.add_argument("--window", type=int, default=1000, help="QoS 1 messages in flight")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="bench/results/edge.json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-edge-")
    data_dir = os.path.join(tmp, "edge")
    out = {"args": vars(args), "ingest": {}, "replication": None}
    try:
        total = 0
        for qos in (1, 0):
            for rnd in range(args.rounds):
                rates = {}
                for server in ("mosquitto", "edge"):
                    if server == "mosquitto":
                        p, port = start_mosquitto(tmp)
                    else:
                        p, port = start_edge(tmp, "127.0.0.1:1", data_dir)
                    rates[server] = ingest(port, args.connections, args.messages, args.size,
                                           qos, args.window)
                    stop(p)
                total += args.connections * args.messages
                ratio = rates["edge"] / rates["mosquitto"]
                out["ingest"].setdefault(f"qos{qos}", []).append({**rates, "ratio": ratio})
                how = "acked after fsync" if qos else "in the WAL"
                print(f"QoS {qos} round {rnd + 1}: edge {rates['edge']:,.0f} msg/s "
                      f"({how}), mosquitto {rates['mosquitto']:,.0f} msg/s "
                      f"(no persistence): {ratio:.2f}x", flush=True)
        cluster, addr = start_cluster(tmp)
        start = time.monotonic()
        edge, _ = start_edge(tmp, addr, data_dir)
        deadline = start + 600
        first = None            # (time, count) when the first messages were there
        while time.monotonic() < deadline:
            got = cluster_count(addr, "/benchedge/telemetry")
            if got and first is None:
                first = (time.monotonic(), got)
            if got >= total:
                break
            time.sleep(0.05)
        end = time.monotonic()
        steady = (got - first[1]) / (end - first[0]) if first and end > first[0] else 0.0
        out["replication"] = {"messages": got, "seconds_from_start": end - start,
                              "rate_from_start": got / (end - start), "rate_steady": steady}
        print(f"replication: {got:,} messages edge -> cluster in {end - start:.1f} s from the "
              f"edge's start ({got / (end - start):,.0f} msg/s); {steady:,.0f} msg/s once "
              f"the first batch was in", flush=True)
        stop(edge)
        stop(cluster)
    finally:
        reap_all()
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    for qos in (1, 0):
        ratios = [r["ratio"] for r in out["ingest"][f"qos{qos}"]]
        target = 1.0 if qos == 1 else 2.0
        print(f"target QoS {qos} >= {target:g}x mosquitto: best {max(ratios):.2f}x, worst "
              f"{min(ratios):.2f}x: {'met' if min(ratios) >= target else 'NOT met'}")


if __name__ == "__main__":
    main()
