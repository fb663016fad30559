"""The edge against hostile MQTT clients (as tests/e2e/test_rpc_hostile_conn.py does for
HTTP/2): each bound of mqtt.max_payload_size, mqtt.max_connections and mqtt.limits is hit
by a raw socket, and the edge closes with the right reason (an MQTT 5 DISCONNECT or CONNACK
reason code; a 3.1.1 client sees the connection close or a CONNACK return code), then keeps
serving everyone else. Raw topics need nothing from a cluster, so the edge here points at
an address where none listens."""

import socket
import struct

import paho.mqtt.client as mqtt
import pytest

from edge_process import EdgeProcess, edge_yaml
from mqtt_raw import RawClient, connect, packet, publish, string, varint
from waiting import wait_for

USER, PASSWORD = "device", "s3cret"
CONNACK, PUBACK, DISCONNECT = 2, 4, 14


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    text = edge_yaml("127.0.0.1:1", mqtt_extra={
        "max_payload_size": 1024, "max_connections": 8,
        "limits": {"max_connections_per_ip": 6, "max_topic_length": 32, "max_inflight": 4,
                   "connect_timeout_ms": 500},
        "auth": {"users": {USER: PASSWORD}}})
    e = EdgeProcess(text, data_dir=tmp_path_factory.mktemp("edge-limits") / "d").start()
    yield e
    e.stop()


def session(edge, level=4, client_id="raw", keep_alive=60):
    c = RawClient(edge.mqtt_port)
    c.send(connect(client_id, level, keep_alive, username=USER, password=PASSWORD))
    kind, _, body = c.read_packet()
    assert kind == CONNACK and body[1] == 0, body
    return c


def expect_disconnect(c, reason):
    got = c.read_packet()
    assert got is not None and got[0] == DISCONNECT, got
    assert got[2][0] == reason, hex(got[2][0])
    assert c.closed_within(10)


def still_serving(edge):
    c = session(edge, client_id="probe")
    c.send(publish("device/x/telemetry", b"ok", qos=1, packet_id=7))
    kind, _, body = c.read_packet()
    assert kind == PUBACK and body[:2] == b"\x00\x07"
    c.close()


def test_bad_credentials(edge):
    for level, code in ((4, 4), (5, 0x86)):
        c = RawClient(edge.mqtt_port)
        c.send(connect("intruder", level, username=USER, password="wrong"))
        kind, _, body = c.read_packet()
        assert kind == CONNACK and body[1] == code
        assert c.closed_within(10)
    c = RawClient(edge.mqtt_port)
    c.send(connect("anonymous", 4))
    assert c.read_packet()[2][1] == 4


def test_packet_too_large(edge):
    c = session(edge, level=5)
    c.send(publish("t", b"x" * 2000, qos=1, level=5))
    expect_disconnect(c, 0x95)
    c = session(edge, level=4)
    c.send(publish("t", b"x" * 2000, qos=1))
    assert c.read_packet() is None        # 3.1.1: the connection just closes
    still_serving(edge)


def test_announced_size_is_refused_before_the_body(edge):
    """A fixed header announcing 200 MB is refused at once, not buffered."""
    c = session(edge, level=5)
    c.send(b"\x32" + varint(200_000_000) + b"\x00")
    expect_disconnect(c, 0x95)


def test_topic_too_long_and_wildcards(edge):
    c = session(edge, level=5)
    c.send(publish("a" * 40, b"x", qos=1, level=5))
    expect_disconnect(c, 0x90)
    c = session(edge, level=5)
    c.send(publish("device/+/telemetry", b"x", qos=0, level=5))
    expect_disconnect(c, 0x90)


def test_inflight_over_receive_maximum(edge):
    """An MQTT 5 client announced Receive Maximum 4; sending more unacked QoS 1 messages in
    one go is a protocol violation (0x93)."""
    c = RawClient(edge.mqtt_port)
    c.send(connect("greedy", 5, username=USER, password=PASSWORD))
    kind, _, body = c.read_packet()
    assert kind == CONNACK
    # Receive Maximum (0x21) is announced in the CONNACK's properties.
    assert b"\x21\x00\x04" in body
    c.send(b"".join(publish("device/g/telemetry", b"x", qos=1, packet_id=i, level=5)
                    for i in range(1, 40)))
    acks = 0
    while True:
        got = c.read_packet()
        assert got is not None
        if got[0] == PUBACK:
            acks += 1
            continue
        assert got[0] == DISCONNECT and got[2][0] == 0x93
        break
    assert acks <= 4
    assert c.closed_within(10)


def test_inflight_3_1_1_client_is_paced_not_dropped(edge):
    """A 3.1.1 client has no Receive Maximum: it is read from more slowly, and every
    message is acked, in order."""
    c = session(edge, client_id="pacer")
    c.send(b"".join(publish("device/p/telemetry", b"x", qos=1, packet_id=i)
                    for i in range(1, 201)))
    ids = []
    while len(ids) < 200:
        kind, _, body = c.read_packet()
        assert kind == PUBACK
        ids.append(struct.unpack(">H", body[:2])[0])
    assert ids == list(range(1, 201))
    c.close()


def test_connections_per_ip_and_in_all(edge):
    clients = [session(edge, client_id=f"c{i}") for i in range(6)]
    extra = RawClient(edge.mqtt_port)
    assert extra.closed_within(10)          # the 7th from 127.0.0.1 is closed at once
    for c in clients:
        c.close()
    wait_for(lambda: _accepts(edge), timeout=20, what="room again after the closes")


def _accepts(edge):
    try:
        session(edge, client_id="again").close()
        return True
    except (AssertionError, TypeError, OSError):
        return False


def test_no_connect_in_time(edge):
    c = RawClient(edge.mqtt_port)
    assert c.closed_within(10)


def test_keep_alive_expiry(edge):
    c = session(edge, level=5, client_id="sleeper", keep_alive=1)
    got = c.read_packet()                   # nothing sent for 1.5 s: DISCONNECT 0x8D
    assert got is not None and got[0] == DISCONNECT and got[2][0] == 0x8D


def test_bad_first_packet_and_malformed(edge):
    c = RawClient(edge.mqtt_port)
    c.send(b"\xc0\x00")                      # PINGREQ before CONNECT
    assert c.closed_within(10)
    c = RawClient(edge.mqtt_port)
    c.send(connect("old", level=6))          # unknown protocol level: return code 1
    kind, _, body = c.read_packet()
    assert kind == CONNACK and body[1] == 1
    c = session(edge, level=5)
    c.send(b"\x30\xff\xff\xff\xff\x7f")      # remaining length of 5 bytes
    expect_disconnect(c, 0x81)
    c = session(edge, level=5)
    c.send(packet(0x36, string("t") + b"\x00\x01\x00x"))    # QoS 3
    expect_disconnect(c, 0x81)
    c = session(edge, level=5)
    c.send(packet(0x22, b"\x00\x00"))        # CONNACK from a client
    expect_disconnect(c, 0x82)
    c = session(edge, level=5)
    c.send(publish("device/a/telemetry", b"x", qos=1, level=5, props=b"\x23\x00\x01"))
    expect_disconnect(c, 0x94)               # topic alias: none allowed
    still_serving(edge)


def test_session_taken_over(edge):
    first = session(edge, level=5, client_id="same-id")
    second = session(edge, level=5, client_id="same-id")
    expect_disconnect(first, 0x8E)
    second.close()


def test_subscribe_refused_as_upstream(edge):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sub", protocol=mqtt.MQTTv311)
    c.username_pw_set(USER, PASSWORD)
    granted = []
    c.on_subscribe = lambda client, userdata, mid, codes, props: granted.extend(
        [int(x.value) if hasattr(x, "value") else int(x) for x in codes])
    c.connect("127.0.0.1", edge.mqtt_port)
    c.loop_start()
    c.subscribe([("a/b", 1), ("c/#", 0)])
    wait_for(lambda: len(granted) == 2, timeout=20)
    c.disconnect()
    c.loop_stop()
    assert granted == [0x80, 0x80]


def test_stop_with_a_client_that_does_not_read(tmp_path):
    """A device that floods QoS 1 messages and never reads its acks leaves the edge's writes
    paused; SIGTERM still stops the edge (connections are dropped, not flushed)."""
    edge = EdgeProcess(edge_yaml("127.0.0.1:1"), data_dir=tmp_path / "d").start()
    c = RawClient(edge.mqtt_port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.send(connect("deaf", 4))
    flood = b"".join(publish("device/x/telemetry", b"x" * 200, qos=1, packet_id=i % 65535 + 1)
                     for i in range(2000))
    c.sock.settimeout(5)
    try:
        for _ in range(50):
            c.send(flood)
    except (TimeoutError, OSError):
        pass                                 # the edge stopped reading: as intended
    edge.stop(timeout=60)
    assert edge.proc.returncode == 0
    c.close()
