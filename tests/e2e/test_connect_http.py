"""Danube Connect's source-webhook and sink-http against the real broker process, run as
`danube connect run`: signed POSTs into a topic (answered 200 only after the broker's ack,
401/404/405/413/415/400 for bad requests), 429/503 while the broker is down; and records
POSTed to a real HTTP server, one by one or as a JSON array, 5xx and 429 retried, 4xx
dead-lettered with the status, the endpoint down and back with nothing lost."""

import asyncio
import hashlib
import hmac
import http.server
import json
import re
import socket
import threading
import urllib.error
import urllib.request
import uuid

import pytest

from broker_process import BrokerProcess
from connector_process import ConnectorProcess, runtime_toml
from topic_stats import subscription_stats
from waiting import async_wait_for, wait_for
from danube.client import DanubeClient
from danube.client.admin import AdminClient
from danube.proto import DanubeAdmin_pb2 as adm
from ports import free_port

SECRET = "whsec-test-0123456789"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-http")).start()
    yield b
    b.stop()


def core(broker_addr, name, kind, dlq=None):
    return runtime_toml(kind, f"http://{broker_addr}", name, dlq=dlq, max_backoff_ms=500,
                        batch_size=100, batch_timeout_ms=100, poll_interval_ms=20)


def webhook_config(path, broker_addr, topic, *, max_pending=100, timeout=30):
    name = f"wh-{uuid.uuid4().hex[:8]}"
    path.write_text(core(broker_addr, name, "source-webhook") + f'''
[server]
host = "127.0.0.1"
port = 0
max_body_size = 4096
timeout_seconds = {timeout}
max_pending = {max_pending}

[auth]
type = "hmac"
secret_env = "WEBHOOK_SECRET"
header = "X-Signature"

[[routes]]
from = "/hooks/orders"
to = "{topic}"
''')
    return path


def webhook_port(conn):
    def find():
        for r in conn.records():
            if "webhook_port" in r:
                return r["webhook_port"]
        return None
    return wait_for(find, 30, "the webhook port")


def post(port, path, body, *, signature=None, ctype="application/json", method="POST",
         timeout=60):
    headers = {"Content-Type": ctype}
    if signature is None:
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    if signature:
        headers["X-Signature"] = signature
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                 headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def start_webhook(tmp_path, broker_addr, topic, **kw):
    conn = ConnectorProcess(webhook_config(tmp_path / "wh.toml", broker_addr, topic, **kw),
                            env={"WEBHOOK_SECRET": SECRET})
    await asyncio.to_thread(conn.start)
    return conn, webhook_port(conn)


async def test_webhook_round_trip_and_refusals(tmp_path, broker):
    topic = f"/default/hooks_{uuid.uuid4().hex[:8]}"
    conn, port = await start_webhook(tmp_path, broker.client_addr, topic)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        consumer = await client.subscribe(topic, "c", "s", "exclusive")
        bodies = [json.dumps({"order": i}).encode() for i in range(20)]
        for body in bodies:
            status, text = await asyncio.to_thread(post, port, "/hooks/orders", body)
            assert status == 200, text
            assert json.loads(text) == {"status": "accepted", "endpoint": "/hooks/orders",
                                        "topic": topic}
        got = [await consumer.receive(timeout=30) for _ in bodies]
    assert [m.payload for m in got] == bodies
    attrs = got[0].attributes
    assert attrs["webhook.endpoint"] == "/hooks/orders"
    assert attrs["webhook.source"] == conn.records()[0]["connector"]
    assert attrs["webhook.ip"] == "127.0.0.1"
    good = b'{"a":1}'
    cases = [
        (dict(body=good, signature="sha256=" + "0" * 64), 401, "signature does not match"),
        (dict(body=good, signature=""), 401, "missing x-signature"),
        (dict(body=good, path="/hooks/nowhere"), 404, "no route"),
        (dict(body=good, method="PUT"), 405, "POST only"),
        (dict(body=b"x" * 5000), 413, "max_body_size"),
        (dict(body=good, ctype="text/plain"), 415, "application/json"),
        (dict(body=b"{oops"), 400, "invalid JSON"),
    ]
    for kwargs, status, needle in cases:
        path = kwargs.pop("path", "/hooks/orders")
        got_status, text = await asyncio.to_thread(post, port, path, **kwargs)
        assert (got_status, needle in text) == (status, True), (kwargs, got_status, text)
    assert conn.metric("danube_connector_messages_processed_total") == 20
    assert conn.stop() == 0


async def test_webhook_backpressure_while_the_broker_is_down(tmp_path):
    """The request waits for the broker's ack: with the broker down it is not answered
    200; the next ones get 429 once max_pending wait, 503 once the broker is known down;
    when the broker is back the waiting request is stored and answered 200."""
    port = free_port()
    b = BrokerProcess("--broker-addr", f"127.0.0.1:{port}",
                      data_dir=tmp_path / "broker").start()
    topic = f"/default/bp_{uuid.uuid4().hex[:8]}"
    try:
        conn, hook = await start_webhook(tmp_path, b.client_addr, topic, max_pending=1,
                                         timeout=300)
        assert (await asyncio.to_thread(post, hook, "/hooks/orders", b'{"n":0}'))[0] == 200
        b.stop()
        first = asyncio.ensure_future(asyncio.to_thread(post, hook, "/hooks/orders",
                                                        b'{"n":1}', timeout=300))
        # The first is taken by the runtime and retried; the second waits in the queue;
        # the third finds it full.
        await async_wait_for(lambda: conn.metric("danube_connector_messages_retried_total",
                                                 target="broker") >= 1, 60, "retries")
        second = asyncio.ensure_future(asyncio.to_thread(post, hook, "/hooks/orders",
                                                         b'{"n":2}', timeout=300))
        await async_wait_for(
            lambda: conn.metric("danube_connector_webhook_pending_requests") == 1, 60,
            "the second request queued")
        status, text = await asyncio.to_thread(post, hook, "/hooks/orders", b'{"n":3}')
        assert status in (429, 503), text
        await async_wait_for(lambda: not conn.ready(), 60, "not ready")
        status, text = await asyncio.to_thread(post, hook, "/hooks/orders", b'{"n":4}')
        assert status == 503 and "broker" in text
        assert not first.done()
        b = BrokerProcess("--broker-addr", f"127.0.0.1:{port}",
                          data_dir=tmp_path / "broker").start()
        assert (await first)[0] == 200
        assert (await second)[0] == 200
        await async_wait_for(conn.ready, 60, "ready again")
        assert conn.stop() == 0
    finally:
        b.stop()


class Endpoint:
    """A real HTTP server in a thread: records each request; ``plan(body)`` gives the
    status to answer (200 by default)."""

    def __init__(self, port=None):
        self.requests = []
        self.plan = lambda body: 200
        self.port = port or free_port()
        self.server = None

    def start(self):
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = endpoint.plan(body)
                if status == 200:
                    endpoint.requests.append((dict(self.headers), body))
                out = b"nope: %d" % status
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def bodies(self):
        return [b for _, b in self.requests]


@pytest.fixture
def endpoint():
    e = Endpoint().start()
    yield e
    e.stop()


def sink_config(path, broker, topic, url, dlq, mode="record", timeout_ms=10000):
    name = f"hs-{uuid.uuid4().hex[:8]}"
    path.write_text(core(broker.client_addr, name, "sink-http", dlq) + f'''
[http]
url = "{url}"
mode = "{mode}"
timeout_ms = {timeout_ms}
headers = {{ "X-Test" = "yes" }}

[[http.routes]]
from = "{topic}"
subscription = "http-sink"
''')
    return path


async def test_http_sink_per_record_retries_and_dead_letters(tmp_path, broker, endpoint):
    topic = f"/default/out_{uuid.uuid4().hex[:8]}"
    dlq = f"/default/outdlq_{uuid.uuid4().hex[:8]}"
    tries = {}

    def plan(body):
        tries[body] = tries.get(body, 0) + 1
        if body == b'{"flaky":1}' and tries[body] <= 2:
            return 503
        if body == b'{"throttled":1}' and tries[body] <= 1:
            return 429
        if body == b'{"bad":1}':
            return 400
        if body == b'{"broken":1}':
            return 500
        return 200
    endpoint.plan = plan
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await client.create_producer(topic, "p", reliable=True)
        await client.create_producer(dlq, "dlq-maker", reliable=True)
        dead = await client.subscribe(dlq, "d", "s", "exclusive")
        conn = ConnectorProcess(sink_config(tmp_path / "hs.toml", broker, topic,
                                            f"http://127.0.0.1:{endpoint.port}/in", dlq))
        await asyncio.to_thread(conn.start)
        payloads = [json.dumps({"n": i}).encode() for i in range(30)]
        specials = [b'{"flaky":1}', b'{"throttled":1}', b'{"bad":1}', b'{"broken":1}']
        await producer.send_many(payloads + specials, key=None)
        await async_wait_for(lambda: len(endpoint.requests) >= 32, 60, "32 delivered")
        letters = [await dead.receive(timeout=60) for _ in range(2)]
    assert sorted(endpoint.bodies()) == sorted(payloads + specials[:2])
    headers = dict(endpoint.requests[0][0])
    assert headers["X-Test"] == "yes" and headers["X-Danube-Topic"] == topic
    by_payload = {m.payload: m.attributes["dlq.reason"] for m in letters}
    assert by_payload[b'{"bad":1}'].startswith("HTTP 400 from")
    assert tries[b'{"bad":1}'] == 1
    assert by_payload[b'{"broken":1}'].startswith("failed after 3 attempts: HTTP 500")
    # max_retries = 2: two retries, then the dead letter.
    assert conn.metric("danube_connector_messages_retried_total", target="external") >= 2
    assert conn.stop() == 0


async def test_http_sink_batches_and_an_outage(tmp_path, broker):
    port = free_port()
    endpoint = Endpoint(port).start()
    topic = f"/default/outb_{uuid.uuid4().hex[:8]}"
    try:
        async with DanubeClient(f"http://{broker.client_addr}") as client, \
                AdminClient(f"http://{broker.admin_addr}") as admin:
            producer = await client.create_producer(topic, "p", reliable=True)
            conn = ConnectorProcess(sink_config(tmp_path / "hs.toml", broker, topic,
                                                f"http://127.0.0.1:{port}/in",
                                                "/default/unused_dlq", mode="batch"))
            await asyncio.to_thread(conn.start)
            # The broker sends unacknowledged records again after 1 s: while the endpoint is
            # down, the sink holds the batch it retries and gets its records again.
            await admin.call("TopicAdmin", "SetSubscriptionFailurePolicy",
                             adm.SetSubscriptionFailurePolicyRequest(
                                 topic=topic, subscription="http-sink",
                                 failure_policy=adm.SubscriptionFailurePolicy(
                                     max_redelivery_count=100, ack_timeout_ms=1000,
                                     base_redelivery_delay_ms=100,
                                     max_redelivery_delay_ms=100, backoff_strategy=adm.Fixed,
                                     poison_policy=adm.Block)))
            await producer.send_many([json.dumps({"n": i}).encode() for i in range(50)])
            await async_wait_for(lambda: sum(len(json.loads(b)) for b in endpoint.bodies())
                                 >= 50, 60, "the first 50")
            endpoint.stop()
            await producer.send_many([json.dumps({"n": i}).encode() for i in range(50, 80)])
            await async_wait_for(lambda: not conn.ready(), 60, "not ready while down")
            await async_wait_for(lambda: redelivered(admin, topic, "http-sink", 30), 60,
                                 "the held records sent again")
            endpoint = Endpoint(port).start()
            await async_wait_for(lambda: sum(len(json.loads(b)) for b in endpoint.bodies())
                                 >= 30, 60, "the 30 sent while down")
        # Written once: the copies of what the held batch wrote are acknowledged, not sent.
        assert [d["n"] for b in endpoint.bodies() for d in json.loads(b)] == \
            list(range(50, 80))
        await async_wait_for(conn.ready, 30, "ready again")
        assert conn.metric("danube_connector_messages_processed_total") == 80
        assert conn.stop() == 0
    finally:
        endpoint.stop()


async def redelivered(admin, topic, subscription, at_least):
    """The broker has sent ``subscription``'s records again ``at_least`` times."""
    sub = await subscription_stats(admin, topic, subscription)
    return sub is not None and sub.redelivered >= at_least


class SilentEndpoint:
    """Accepts connections, reads the requests and never answers: a sink writing to it holds
    its batch, unacknowledged, until its request times out. ``first``: the "n" of the first
    record it was sent."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.first = None
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        data = b""
        while self.first is None:
            try:
                chunk = conn.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            data += chunk
            found = re.search(rb'\{"n": (\d+)\}', data)
            if found:
                self.first = int(found.group(1))

    def stop(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


async def test_a_shared_subscription_s_second_sink_writes_what_the_first_never_did(
        tmp_path, broker, endpoint):
    """Two sink instances share a subscription. The first one's endpoint never answers, and
    it is killed holding its records; the broker sends them to the second, which has written
    a later offset already. It writes them too: a record below an at-least-once sink's
    newest write may be one that only another instance received."""
    topic = f"/default/outs_{uuid.uuid4().hex[:8]}"
    silent = SilentEndpoint()
    stuck = written = None
    try:
        async with DanubeClient(f"http://{broker.client_addr}") as client:
            producer = await client.create_producer(topic, "p", reliable=True)
            # Its request never times out: it holds its records (no retries, no dead
            # letters) until it is killed, however slow the machine.
            stuck = ConnectorProcess(sink_config(tmp_path / "a.toml", broker, topic,
                                                 f"http://127.0.0.1:{silent.port}/in", None,
                                                 timeout_ms=3_600_000))
            await asyncio.to_thread(stuck.start)
            written = ConnectorProcess(sink_config(tmp_path / "b.toml", broker, topic,
                                                   f"http://127.0.0.1:{endpoint.port}/in",
                                                   None))
            await asyncio.to_thread(written.start)
            payloads = [json.dumps({"n": i}).encode() for i in range(40)]
            await producer.send_many(payloads)

            def second_wrote_past_the_first():
                return silent.first is not None and any(
                    json.loads(b)["n"] > silent.first for b in endpoint.bodies())
            await async_wait_for(second_wrote_past_the_first, 60,
                                 "the second sink writing past a record the first holds")
            stuck.sigkill()
            await async_wait_for(lambda: len(endpoint.requests) >= 40, 60,
                                 "the first sink's records written by the second")
        assert sorted(endpoint.bodies()) == sorted(payloads)
        assert written.stop() == 0
    finally:
        silent.stop()
        for conn in (stuck, written):
            if conn is not None:
                conn.sigkill()
