"""bench.connect: Danube Connect's connectors against the plain use of the same library, in
one run (issue 39). Reported, not asserted.

    python -m bench.connect [--quick] [--mqtt N] [--mqtt-topics N] [--delta N]
                            [--iceberg N] [--webhook N]
                            [--only mqtt,mqtt_topics,delta,iceberg,webhook]

BENCH_CONNECT_PROFILE=DIR records each connector run with py-spy (collapsed stacks in DIR).

1. MQTT source at QoS 1: N messages queued by Mosquitto for a persistent session, then
   drained. Peer: a paho subscriber (mosquitto_sub-style, acks at receipt) on its own
   session. Connector: `danube connect run` source-mqtt (its own MQTT client, acks after
   the broker's ack), timed from its first published message to its N-th (its processed
   counter, sampled every 10 ms).
   Target: connector >= 0.7x the direct subscriber.
1b. MQTT source, metadata on (the default), messages from 7 MQTT topics interleaved (each
   record its own `mqtt.topic` attribute) against the same number from one topic, same
   run (one topic measured before and after). Target: >= 0.9x (issue 52).
2. Delta Lake sink: N JSON records (id, name, amount) in a reliable topic, written in
   batches of 1,000. Peer: the same records as Arrow batches of 1,000 appended with
   `write_deltalake` directly (no parsing, no transaction), run before and after the
   connector (the mean of both). Connector: sink-deltalake with
   field_mappings, timed from its first committed batch to its N-th row. Target >= 0.7x.
3. Iceberg sink: the same N records. Peer: the same Arrow batches of 1,000 appended with
   pyiceberg's `Table.append` directly to a table of its own in the same SQLite catalog
   (no parsing, no offsets in the summary). Connector: sink-iceberg with field_mappings,
   timed as the Delta sink. Target >= 0.7x.
4. Webhook source: N JSON POSTs over 32 keep-alive connections. Peer: the same HTTP
   server (danube/connectors/_http1.py) with an empty handler. Connector: source-webhook,
   each request answered after the broker's ack."""

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid

from bench.connect.connector import Connector, backlog_for_sink, core
from bench.e2e.runner import Broker
from danube.devcluster.procs import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- MQTT ---------------------------------------------------------------------------------

def mosquitto(workdir):
    port = free_port()
    conf = os.path.join(workdir, "mosquitto.conf")
    user = "user root\n" if os.geteuid() == 0 else ""
    with open(conf, "w") as fh:
        fh.write(f"listener {port} 127.0.0.1\nallow_anonymous true\n{user}persistence false\n"
                 "max_queued_messages 0\nmax_inflight_messages 0\n")
    proc = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", conf],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("mosquitto did not start")


def paho_client(port, client_id, clean):
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    c.max_inflight_messages_set(65535)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 0 if clean else 3600
    props.ReceiveMaximum = 2000
    return c, props


def register_session(port, client_id, topic):
    """Connect once to create the persistent session and its QoS 1 subscription."""
    c, props = paho_client(port, client_id, clean=False)
    c.connect("127.0.0.1", port, clean_start=False, properties=props)
    c.loop_start()
    c.subscribe(topic, qos=1)[1]
    time.sleep(0.3)
    c.disconnect()
    c.loop_stop()


def publish(port, topic, n, size=200):
    """``n`` QoS 1 messages to ``topic``, or round robin over a list of topics."""
    topics = topic if isinstance(topic, list) else [topic]
    c, props = paho_client(port, uuid.uuid4().hex, clean=True)
    c.connect("127.0.0.1", port, properties=props)
    c.loop_start()
    payload = b"x" * size
    # In steps of 50,000: QoS 1 packet ids (65,535) must not run out.
    for start in range(0, n, 50000):
        infos = [c.publish(topics[i % len(topics)], payload, qos=1)
                 for i in range(start, start + min(50000, n - start))]
        for info in infos:
            info.wait_for_publish(120)
    c.disconnect()
    c.loop_stop()


def direct_drain(port, client_id, topic, n):
    got = [0]
    done = threading.Event()
    stamps = {}

    def on_message(_c, _u, _m):
        got[0] += 1
        if got[0] == 1:
            stamps["first"] = time.monotonic()
        if got[0] >= n:
            stamps["last"] = time.monotonic()
            done.set()
    c, props = paho_client(port, client_id, clean=False)
    c.on_message = on_message
    c.connect("127.0.0.1", port, clean_start=False, properties=props)
    c.loop_start()
    done.wait(600)
    c.disconnect()
    c.loop_stop()
    return (stamps["last"] - stamps["first"]) * n / max(1, n - 1)


def bench_mqtt(broker, workdir, n):
    proc, port = mosquitto(workdir)
    try:
        topic = "bench/dev1/data"
        register_session(port, "direct-sub", topic)
        publish(port, topic, n)
        direct = direct_drain(port, "direct-sub", topic, n)
        name = f"bench-mqtt-{uuid.uuid4().hex[:6]}"
        text = core(broker, name, "source-mqtt", 1000) + f'''[mqtt]
broker_host = "127.0.0.1"
broker_port = {port}
client_id = "{name}"
clean_session = false
include_metadata = false
[[mqtt.routes]]
from = "bench/+/data"
to = "/default/{name}"
qos = "AtLeastOnce"
'''
        conn = Connector(workdir, text)
        while not conn.ready():
            time.sleep(0.05)
        conn.stop()             # the session and its subscription exist now
        publish(port, topic, n)
        conn = Connector(workdir, text, profile=True)
        connector = conn.timed_until(n, interval=0.01)
        conn.stop()
    finally:
        proc.terminate()
        proc.wait()
    return {"messages": n, "direct_msgs_per_s": round(n / direct),
            "connector_msgs_per_s": round(n / connector), "ratio": round(direct / connector, 2)}


def bench_mqtt_topics(broker, workdir, n, devices=7):
    """source-mqtt with `include_metadata = true` (the default): messages from ``devices``
    MQTT topics interleaved (the docs' `sensors/+/temp` shape: each record its own
    `mqtt.topic` attribute) against the same number from one MQTT topic, same run.
    Target: >= 0.9x."""
    proc, port = mosquitto(workdir)
    rates = {}
    try:
        for label, topics in (("one_topic", ["bench/dev1/data"]),
                              ("interleaved", [f"bench/dev{i}/data" for i in range(devices)]),
                              ("one_topic_again", ["bench/dev1/data"])):
            name = f"bench-mqttt-{uuid.uuid4().hex[:6]}"
            text = core(broker, name, "source-mqtt", 1000) + f'''[mqtt]
broker_host = "127.0.0.1"
broker_port = {port}
client_id = "{name}"
clean_session = false
include_metadata = true
[[mqtt.routes]]
from = "bench/+/data"
to = "/default/{name}"
qos = "AtLeastOnce"
'''
            conn = Connector(workdir, text)
            while not conn.ready():
                time.sleep(0.05)
            conn.stop()             # the session and its subscription exist now
            publish(port, topics, n)
            conn = Connector(workdir, text)
            seconds = conn.timed_until(n, interval=0.01)
            conn.stop()
            rates[label] = round(n / seconds)
    finally:
        proc.terminate()
        proc.wait()
    one = (rates["one_topic"] + rates["one_topic_again"]) / 2
    return {"messages": n, "devices": devices, **{f"{k}_msgs_per_s": v for k, v in
                                                   rates.items()},
            "ratio": round(rates["interleaved"] / one, 2)}


# -- Delta Lake ---------------------------------------------------------------------------

def delta_rows(n):
    return [{"id": i, "name": f"name-{i}", "amount": i * 0.25} for i in range(n)]


# The sinks' route columns in the benchmark: the three fields of delta_rows, no metadata.
SINK_ROUTE_COLUMNS = '''include_danube_metadata = false
field_mappings = [
  { json_path = "id", column = "id", data_type = "Int64", nullable = false },
  { json_path = "name", column = "name", data_type = "Utf8" },
  { json_path = "amount", column = "amount", data_type = "Float64" },
]
'''


def arrow_batches(rows):
    """The direct writers' input: ``rows`` as Arrow tables of 1,000 (the sinks' batch)."""
    import pyarrow as pa
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()),
                        pa.field("amount", pa.float64())])
    return schema, [pa.Table.from_pylist(rows[i:i + 1000], schema=schema)
                    for i in range(0, len(rows), 1000)]


def bench_delta(broker, workdir, n):
    from deltalake import write_deltalake
    rows = delta_rows(n)
    schema, batches = arrow_batches(rows)
    from deltalake import DeltaTable

    def direct_run(uri):
        start = time.perf_counter()
        write_deltalake(uri, batches[0], mode="append")
        target = DeltaTable(uri)        # the library's fastest way: the table kept open
        for table in batches[1:]:
            write_deltalake(target, table, mode="append")
        return time.perf_counter() - start
    before = direct_run(os.path.join(workdir, "direct"))

    name = f"bench-delta-{uuid.uuid4().hex[:6]}"
    topic = f"/default/{name}"
    text = core(broker, name, "sink-deltalake", 1000) + f'''[deltalake]
[[deltalake.routes]]
from = "{topic}"
subscription = "bench"
to = "{os.path.join(workdir, 'connector')}"
{SINK_ROUTE_COLUMNS}'''
    return sink_against_direct(broker, workdir, topic, text, rows, before,
                               lambda: direct_run(os.path.join(workdir, "direct-after")))


def sink_against_direct(broker, workdir, topic, text, rows, before, direct_again):
    """The rows published to ``topic`` while the sink's subscription waits for them (its
    connector started once to create it, then stopped), then the connector timed draining
    them into its table; the peer, the direct write, timed again after it: the mean of its
    two runs evens out load that moved."""
    backlog_for_sink(broker, workdir, topic, text, rows)
    n = len(rows)
    conn = Connector(workdir, text, profile=True)
    connector = conn.timed_until(n)
    conn.stop()
    direct = (before + direct_again()) / 2
    return {"rows": n, "direct_rows_per_s": round(n / direct),
            "connector_rows_per_s": round(n / connector), "ratio": round(direct / connector, 2)}


# -- Iceberg ------------------------------------------------------------------------------

def bench_iceberg(broker, workdir, n):
    from pyiceberg.catalog.sql import SqlCatalog
    rows = delta_rows(n)
    schema, batches = arrow_batches(rows)
    uri = f"sqlite:///{os.path.join(workdir, 'iceberg.db')}"
    warehouse = os.path.join(workdir, "warehouse")
    os.makedirs(warehouse, exist_ok=True)
    catalog = SqlCatalog("danube_catalog", uri=uri, warehouse=f"file://{warehouse}")
    catalog.create_namespace("direct")
    # The connector's table properties (upstream danube-iceberg's), so both write alike.
    from danube.connectors.iceberg import TABLE_PROPERTIES

    def direct_run(name):
        start = time.perf_counter()
        table = catalog.create_table(("direct", name), schema=schema,
                                     properties=TABLE_PROPERTIES)
        for batch in batches:
            table.append(batch)
        return time.perf_counter() - start
    before = direct_run("before")

    name = f"bench-ice-{uuid.uuid4().hex[:6]}"
    topic = f"/default/{name}"
    text = core(broker, name, "sink-iceberg", 1000) + f'''[iceberg.catalog]
uri = "{uri}"
warehouse = "{warehouse}"
[[iceberg.routes]]
from = "{topic}"
subscription = "bench"
{SINK_ROUTE_COLUMNS}'''
    return sink_against_direct(broker, workdir, topic, text, rows, before,
                               lambda: direct_run("after"))


# -- webhook ------------------------------------------------------------------------------

async def _load(port, n, conns=32, path="/hooks/bench"):
    body = b'{"event":"bench","value":12345}'
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    left = [n]
    statuses = {}

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            statuses[status] = statuses.get(status, 0) + 1
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return time.perf_counter() - start, statuses


def bench_webhook(broker, workdir, n):
    from danube.connectors._http1 import HttpServer

    async def empty():
        async def handler(_request):
            return 200, {}, b'{"status":"accepted"}'
        server = await HttpServer(handler, "127.0.0.1", 0, max_body=1 << 20,
                                  timeout=30).start()
        elapsed, statuses = await _load(server.port, n)
        await server.close()
        return elapsed, statuses
    direct, direct_statuses = asyncio.run(empty())
    name = f"bench-wh-{uuid.uuid4().hex[:6]}"
    text = core(broker, name, "source-webhook", 1000) + f'''[server]
host = "127.0.0.1"
port = 0
[[routes]]
from = "/hooks/bench"
to = "/default/{name}"
'''
    conn = Connector(workdir, text)
    port = conn._field("webhook_port")
    while not conn.ready():
        time.sleep(0.05)
    connector, statuses = asyncio.run(_load(port, n))
    conn.stop()
    return {"requests": n, "empty_handler_req_per_s": round(n / direct),
            "connector_req_per_s": round(n / connector), "ratio": round(direct / connector, 2),
            "connector_statuses": statuses, "empty_statuses": direct_statuses}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.connect")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mqtt", type=int, default=None)
    parser.add_argument("--delta", type=int, default=None)
    parser.add_argument("--iceberg", type=int, default=None)
    parser.add_argument("--webhook", type=int, default=None)
    parser.add_argument("--mqtt-topics", type=int, default=None)
    parser.add_argument("--only", default="mqtt,mqtt_topics,delta,iceberg,webhook",
                        help="comma-separated cases to run")
    args = parser.parse_args()
    sizes = {"mqtt": args.mqtt or (5000 if args.quick else 50000),
             "mqtt_topics": args.mqtt_topics or (7000 if args.quick else 35000),
             "delta": args.delta or (10000 if args.quick else 100000),
             "iceberg": args.iceberg or (10000 if args.quick else 50000),
             "webhook": args.webhook or (2000 if args.quick else 20000)}
    cases = {"mqtt": ("mqtt_qos1", bench_mqtt),
             "mqtt_topics": ("mqtt_interleaved_topics", bench_mqtt_topics),
             "delta": ("delta", bench_delta),
             "iceberg": ("iceberg", bench_iceberg), "webhook": ("webhook", bench_webhook)}
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in only if c not in cases]
    if unknown:
        parser.error(f"--only: unknown case {unknown[0]!r} (cases: {', '.join(cases)})")
    workdir = tempfile.mkdtemp(prefix="bench-connect-")
    broker = Broker(os.path.join(workdir, "data"), os.path.join(workdir, "broker.log"))
    results = {"load_average": os.getloadavg()[0]}
    try:
        for case in only:
            label, fn = cases[case]
            results[label] = fn(broker, workdir, sizes[case])
            results[label]["load_average"] = round(os.getloadavg()[0], 1)
            print(json.dumps({label: results[label]}), flush=True)
    finally:
        broker.proc.terminate()
        broker.proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
