"""source-mqtt's own MQTT client (danube/connectors/_mqtt_client.py) in the connector
process, against what a broker and a network do to it: the connection cut in the middle of
a stream (a TCP proxy before Mosquitto: nothing lost), PUBLISH packets larger than a socket
read, TLS with a user name and password (and a wrong password refused with a clear error),
and, from a scripted server, what Mosquitto never sends: a packet that breaks the protocol
(a clear error and a reconnect, not a crash) and a QoS 0 burst past the buffer (dropped and
counted); and the client itself, in this process, at its in-flight bound."""

import asyncio
import ssl
import subprocess
import threading
import uuid

import pytest

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from broker_process import BrokerProcess
from connect_mqtt import publish_all, publisher, started
from connector_process import Collector
from mosquitto_process import Mosquitto
from mqtt_scripted_server import ScriptedMqttServer
from tcp_proxy import TcpProxy
from waiting import async_holds_for, async_wait_for
from danube.client import DanubeClient
from danube.connect.retry import Backoff
from danube.connectors._mqtt_client import MqttClient, Options


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-mqtt-client")).start()
    yield b
    b.stop()


@pytest.fixture
def mosquitto(tmp_path):
    m = Mosquitto(tmp_path).start()
    yield m
    m.stop()


def first_seen_order(payloads):
    first = {}
    for i, p in enumerate(payloads):
        first.setdefault(p, i)
    return [p for p, _ in sorted(first.items(), key=lambda kv: kv[1])]


async def test_connection_cut_mid_stream_loses_nothing(tmp_path, broker, mosquitto):
    """The connector reaches Mosquitto through a proxy that drops the connection while
    thousands of QoS 1 messages are in flight (read, published or not, not acknowledged):
    the connector reconnects with backoff, Mosquitto sends the unacknowledged ones again
    (the persistent session), and every message arrives, in order apart from the resent."""
    proxy = TcpProxy(mosquitto.port)
    topic = f"/default/cut_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, proxy, topic)
    total = 20000
    sent = [f"c{i}".encode() for i in range(total)]
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        feeder = threading.Thread(target=publish_all, args=(pub, "sensors/c/temp", sent))
        feeder.start()
        await async_wait_for(lambda: len(got.messages) >= 2000, 60, "2,000 forwarded")
        proxy.cut()
        assert len(got.messages) < total, "the stream ended before the cut: make it longer"
        await async_wait_for(lambda: not conn.ready(), 30, "not ready after the cut")
        proxy.heal()
        await asyncio.to_thread(feeder.join, 120)
        await async_wait_for(lambda: set(got.payloads()) >= set(sent), 120,
                             "every message after the reconnect")
        pub.loop_stop()
        await got.stop()
    assert first_seen_order(got.payloads()) == sent
    assert conn.metric("danube_connector_errors_total", kind="mqtt_disconnect") >= 1
    assert conn.ready()
    assert conn.stop() == 0
    proxy.close()


async def test_publish_larger_than_a_socket_read(tmp_path, broker, mosquitto):
    """Payloads of 1.5 MiB (a socket read brings at most 256 KiB) between small ones: each
    arrives whole, in order."""
    topic = f"/default/big_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic)
    big = [bytes([65 + i]) * (1536 * 1024) + str(i).encode() for i in range(3)]
    sent = [b"s0", big[0], b"s1", big[1], big[2], b"s2"]
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        await asyncio.to_thread(publish_all, pub, "sensors/big/temp", sent)
        await async_wait_for(lambda: len(got.messages) >= len(sent), 60, "every message")
        assert got.payloads() == sent
        pub.loop_stop()
        await got.stop()
    assert conn.stop() == 0


@pytest.fixture
def tls_mosquitto(tmp_path, certs):
    key = tmp_path / "server.key"
    cert = tmp_path / "server.pem"
    certs.server_cert.private_key_pem.write_to_path(str(key))
    certs.server_cert.cert_chain_pems[0].write_to_path(str(cert))
    passwords = tmp_path / "passwords"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "device", "s3cret"],
                   check=True, capture_output=True)
    passwords.chmod(0o600)
    m = Mosquitto(tmp_path, listener_extra=f"certfile {cert}\nkeyfile {key}\n"
                                           f"password_file {passwords}\n",
                  anonymous=False).start()
    yield m
    m.stop()


def tls_publisher(mosquitto, certs):
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=uuid.uuid4().hex,
                    protocol=paho.MQTTv311)
    c.tls_set_context(ssl.create_default_context(cafile=certs.ca_file))
    c.username_pw_set("device", "s3cret")
    c.connect("127.0.0.1", mosquitto.port)
    c.loop_start()
    return c


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_tls_with_user_and_password(tmp_path, broker, tls_mosquitto, certs, protocol):
    topic = f"/default/tls_{uuid.uuid4().hex[:8]}"
    extra = f'use_tls = true\nca_file = "{certs.ca_file}"\nusername = "device"\n' \
            f'password = "s3cret"\nprotocol = "{protocol}"\n'
    conn = await started(tmp_path, broker, tls_mosquitto, topic, extra=extra)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = tls_publisher(tls_mosquitto, certs)
        sent = [f"tls{i}".encode() for i in range(100)]
        await asyncio.to_thread(publish_all, pub, "sensors/t/temp", sent)
        await async_wait_for(lambda: len(got.messages) >= 100, 60, "100 messages")
        assert got.payloads() == sent
        pub.loop_stop()
        await got.stop()
    assert conn.stop() == 0


async def test_wrong_password_is_a_clear_error(tmp_path, broker, tls_mosquitto, certs):
    """Refused at CONNACK: the connector stays up, not ready, retrying, and says why."""
    topic = f"/default/tlsbad_{uuid.uuid4().hex[:8]}"
    extra = f'use_tls = true\nca_file = "{certs.ca_file}"\nusername = "device"\n' \
            f'password = "wrong"\n'
    conn = await started(tmp_path, broker, tls_mosquitto, topic, extra=extra, ready=False)
    await async_wait_for(lambda: "refused the connection: not authorized (0x87)" in conn.log()
                         or "bad user name or password" in conn.log(), 60,
                         "the refusal in the log")
    await async_wait_for(lambda: conn.metric("danube_connector_messages_retried_total",
                                             target="external") >= 2, 60, "retries counted")
    assert not conn.ready()
    retries = [r for r in conn.records() if r.get("target") == "external"]
    assert retries and all(r.get("error_kind") not in (None, "str") for r in retries), retries
    assert all(r["msg"].count("initialize: ") == 1 for r in retries), retries
    # Nothing taken yet: SIGTERM stops it at once, cleanly (it waited out
    # shutdown_timeout_ms for the retries, then exited 1).
    assert conn.stop() == 0


async def test_untrusted_certificate_is_a_clear_error(tmp_path, broker, tls_mosquitto):
    """Without the CA: the TLS handshake fails, and the log says so."""
    topic = f"/default/tlsca_{uuid.uuid4().hex[:8]}"
    extra = 'use_tls = true\nusername = "device"\npassword = "s3cret"\n'
    conn = await started(tmp_path, broker, tls_mosquitto, topic, extra=extra, ready=False)
    await async_wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in conn.log(), 60,
                         "the certificate failure in the log")
    assert not conn.ready()
    assert conn.stop() == 0


async def test_malformed_packet_from_the_server_reconnects(tmp_path, broker):
    """A PUBLISH with QoS 3 on the first connection: the connector logs what was wrong,
    disconnects (MQTT 5: reason 0x81) and connects again; the second connection's messages
    are forwarded and acknowledged after the Danube broker's ack."""
    gate = threading.Event()

    async def bad(conn):
        await conn.handshake()
        conn.write(bytes([0x36, 5, 0, 1, 0x61, 0, 1]))      # QoS 3
        await conn.until_closed()

    async def good(conn):
        await conn.handshake(session_present=True)
        await conn.wait(gate)
        conn.write(b"".join(conn.publish("sensors/x/temp", f"g{i}".encode(), 1, i + 1)
                            for i in range(20)))
        await conn.acks(4, 20)
        await conn.until_closed()
    server = ScriptedMqttServer([bad, good]).start()
    topic = f"/default/bad_{uuid.uuid4().hex[:8]}"
    try:
        conn = await started(tmp_path, broker, server, topic)
        async with DanubeClient(f"http://{broker.client_addr}") as client:
            got = await Collector(client, topic).start()
            await async_wait_for(lambda: server.connections >= 2, 60, "a second connection")
            gate.set()
            await async_wait_for(lambda: len(got.messages) >= 20, 60, "20 messages")
            assert got.payloads() == [f"g{i}".encode() for i in range(20)]
            await got.stop()
        await async_wait_for(lambda: server.acks(4, 2) == list(range(1, 21)), 60,
                             "the 20 PUBACKs")
        await async_wait_for(lambda: "breaks the protocol: PUBLISH with QoS 3" in conn.log(),
                             60, "the protocol break in the connector's log")
        disconnect = [body for n, kind, body in server.packets if n == 1 and kind == 14]
        assert disconnect and disconnect[0][0] == 0x81
        assert conn.metric("danube_connector_errors_total", kind="mqtt_disconnect") >= 1
        assert server.errors == []
        assert conn.stop() == 0
    finally:
        server.stop()


async def test_qos0_burst_past_the_buffer_is_dropped_and_counted(tmp_path, broker):
    """2,000 QoS 0 messages in one write to a connector holding at most 50: what does not
    fit is dropped and counted as failed, never held; what is kept goes out in order."""
    total = 2000
    gate = threading.Event()

    async def burst(conn):
        await conn.handshake()
        await conn.wait(gate)
        conn.write(b"".join(conn.publish("sensors/z/temp", f"z{i}".encode(), 0)
                            for i in range(total)))
        await conn.until_closed()
    server = ScriptedMqttServer([burst]).start()
    topic = f"/default/burst_{uuid.uuid4().hex[:8]}"
    sent = [f"z{i}".encode() for i in range(total)]
    try:
        conn = await started(tmp_path, broker, server, topic, qos="AtMostOnce",
                             extra="max_buffered = 50")
        async with DanubeClient(f"http://{broker.client_addr}") as client:
            got = await Collector(client, topic).start()
            gate.set()

            def accounted():
                dropped = conn.metric("danube_connector_messages_failed_total",
                                      topic="mqtt-qos0-dropped") or 0
                done = conn.metric("danube_connector_messages_processed_total",
                                   topic=topic) or 0
                return dropped + done == total and (dropped, done)
            dropped, done = await async_wait_for(accounted, 60, "every message forwarded "
                                                                "or counted as dropped")
            await async_wait_for(lambda: len(got.messages) >= done, 60, "what was kept")
            await got.stop()
        assert dropped > 0 and done >= 50
        kept = got.payloads()
        assert kept == [p for p in sent if p in set(kept)], "kept out of order"
        assert conn.stop() == 0
    finally:
        server.stop()


async def test_inflight_bound_stops_reading_until_acks():
    """The client itself (in this process) against a server sending 10 QoS 1 messages, then
    40 more: with max_inflight 10 it stops reading at the bound, reads nothing more while
    none is acknowledged, and takes the rest once the first 10 are; nothing is lost."""
    gate, written = threading.Event(), threading.Event()

    async def script(conn):
        await conn.handshake()
        conn.write(b"".join(conn.publish("a/b", b"m%d" % i, 1, i + 1) for i in range(10)))
        await conn.wait(gate)
        conn.write(b"".join(conn.publish("a/b", b"m%d" % i, 1, i + 1) for i in range(10, 50)))
        await conn.writer.drain()
        written.set()
        await conn.acks(4, 50)
        await conn.until_closed()
    server = ScriptedMqttServer([script]).start()
    got = []
    client = MqttClient(
        Options("127.0.0.1", server.port, "inflight", level=4, max_inflight=10,
                subscriptions=[("a/#", 1)]),
        on_publish=lambda publishes, generation: got.extend(
            (p, generation) for p in publishes),
        backoff=Backoff(100, 1000, 3))
    try:
        await client.start()
        await async_wait_for(lambda: len(got) == 10, 30, "the first 10")
        assert client.conn.paused and not client.conn.transport.is_reading()
        gate.set()
        await async_wait_for(written.is_set, 30, "the 40 more written")
        await async_holds_for(lambda: len(got) == 10, 0.5, "nothing read past the bound")
        assert client.ack([(p[2], p[3], g) for p, g in got]) == 10
        await async_wait_for(lambda: len(got) == 50, 30, "the other 40")
        assert client.ack([(p[2], p[3], g) for p, g in got[10:]]) == 40
        await async_wait_for(lambda: server.acks(4) == list(range(1, 51)), 30, "50 PUBACKs")
        assert [p[1] for p, _ in got] == [b"m%d" % i for i in range(50)]
        assert server.errors == []
    finally:
        await client.close()
        server.stop()


async def test_keep_alive_pings_and_a_silent_server_is_left():
    """keep_alive 1 s: PINGREQ when nothing was written for 3/4 of it; a server that stops
    answering is given up after 1.5 x keep_alive, and the client connects again."""
    async def first(conn):
        await conn.handshake()
        await conn.expect(12)
        conn.write(b"\xd0\x00")
        await conn.expect(12)                   # not answered: the server fell silent
        await conn.until_closed()

    async def second(conn):
        await conn.handshake(session_present=True)
        await conn.until_closed()
    server = ScriptedMqttServer([first, second]).start()
    reasons = []
    client = MqttClient(
        Options("127.0.0.1", server.port, "keepalive", level=5, keep_alive=1,
                subscriptions=[("a/#", 1)]),
        on_publish=lambda publishes, generation: None, on_disconnect=reasons.append,
        backoff=Backoff(50, 200, 3))
    try:
        await client.start()
        await async_wait_for(lambda: server.connections >= 2 and client.connected, 30,
                             "a second connection")
        assert reasons and "keep-alive" in reasons[0]
        assert server.errors == []
    finally:
        await client.close()
        server.stop()


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
async def test_publish_over_max_packet_size(tmp_path, broker, mosquitto, protocol):
    """max_packet_size 1024 and a 5,000-byte message between small ones. MQTT 5 announces
    the limit and Mosquitto keeps the message back; MQTT 3.1.1 cannot, so the connector
    passes it over, acknowledges it and counts it as failed, instead of disconnecting and
    being sent it again on every connection. Either way the stream goes on."""
    topic = f"/default/over_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic,
                         extra=f'max_packet_size = 1024\nprotocol = "{protocol}"')
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        await asyncio.to_thread(publish_all, pub, "sensors/o/temp",
                                [b"before", b"x" * 5000, b"after"])
        await async_wait_for(lambda: len(got.messages) >= 2, 60, "the small messages")
        assert got.payloads() == [b"before", b"after"]
        pub.loop_stop()
        await got.stop()
    if protocol == "3.1.1":
        assert conn.metric("danube_connector_messages_failed_total",
                           topic="mqtt-oversized") == 1
        await async_wait_for(
            lambda: "exceeds max_packet_size (1024 bytes): dropped" in conn.log(), 60,
            "the dropped packet in the connector's log")
    assert not conn.metric("danube_connector_errors_total", kind="mqtt_disconnect")
    assert conn.stop() == 0


async def test_qos2_handshake_after_the_ack():
    """QoS 2: PUBREC only when the message is acknowledged (after the Danube ack, in the
    connector), then the server's PUBREL is answered with PUBCOMP at once."""
    async def script(conn):
        await conn.handshake()
        conn.write(conn.publish("a/b", b"once", 2, 42))
        assert await conn.acks(5, 1) == [42]
        conn.write(bytes([0x62, 2, 0, 42]))
        assert await conn.acks(7, 1) == [42]
        await conn.until_closed()
    server = ScriptedMqttServer([script]).start()
    got = []
    client = MqttClient(
        Options("127.0.0.1", server.port, "qos2", level=5, subscriptions=[("a/#", 2)]),
        on_publish=lambda publishes, generation: got.extend(
            (p, generation) for p in publishes),
        backoff=Backoff(100, 1000, 3))
    try:
        await client.start()
        await async_wait_for(lambda: got, 30, "the QoS 2 message")
        (p, generation), = got
        assert p == ("a/b", b"once", 2, 42, False, False)
        assert server.acks(5) == []                 # nothing before the ack
        assert client.ack([(2, 42, generation)]) == 1
        await async_wait_for(lambda: server.acks(7) == [42], 30, "PUBCOMP")
        assert server.errors == []
    finally:
        await client.close()
        server.stop()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_clean_session(tmp_path, broker, mosquitto, protocol):
    """clean_session = true (upstream's default): a new session at every connection, and
    the stream flows as with a kept one."""
    topic = f"/default/clean_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic, clean=True,
                         extra=f'protocol = "{protocol}"')
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        sent = [f"n{i}".encode() for i in range(500)]
        await asyncio.to_thread(publish_all, pub, "sensors/n/temp", sent)
        await async_wait_for(lambda: len(got.messages) >= 500, 60, "500 messages")
        assert got.payloads() == sent
        pub.loop_stop()
        await got.stop()
    assert any(r.get("session_present") is False for r in conn.records())
    assert conn.stop() == 0
