"""The edge's CONNECT deadline and PUBLISH topic names, against raw sockets (issue 52):

- `mqtt.limits.connect_timeout_ms` counts from the connection's start: a client that sends
  a valid CONNECT a byte at a time, each byte well inside the timeout, is still closed when
  the deadline passes, and never gets a CONNACK;
- a PUBLISH with an empty topic name is refused: MQTT 3.1.1 [MQTT-4.7.3-1] (topic names have
  at least one character: the connection is closed), MQTT 5.0 3.3.2.1 (empty without a
  Topic Alias is a Protocol Error: DISCONNECT 0x82), and nothing is acknowledged; a QoS 1
  PUBLISH with packet id 0 is a Protocol Error too (5.0 2.2.1: DISCONNECT 0x82)."""

import socket
import time

import pytest

from edge_process import EdgeProcess, edge_yaml
from mqtt_raw import RawClient, connect, publish

CONNACK, PUBACK, DISCONNECT = 2, 4, 14
CONNECT_TIMEOUT = 1.0
STEP = 0.25                 # seconds between two bytes of the trickled CONNECT


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    text = edge_yaml("127.0.0.1:1", mqtt_extra={
        "limits": {"connect_timeout_ms": int(CONNECT_TIMEOUT * 1000)}})
    e = EdgeProcess(text, data_dir=tmp_path_factory.mktemp("edge-connect") / "d").start()
    yield e
    e.stop()


def session(edge, level, client_id):
    c = RawClient(edge.mqtt_port)
    c.send(connect(client_id, level))
    kind, _, body = c.read_packet()
    assert kind == CONNACK and body[1] == 0, body
    return c


def test_trickled_connect_is_closed_at_the_deadline(edge):
    """82 bytes of a valid CONNECT, one every 0.25 s (~20 s in all, each byte well inside
    the 1 s timeout): closed about 1 s after the connection opened, no CONNACK."""
    data = connect("trickle-" + "x" * 60, level=4)
    assert len(data) >= 80
    c = RawClient(edge.mqtt_port)
    start = time.monotonic()
    received, closed_at, sent = b"", None, 0
    for byte in data:
        try:
            c.sock.sendall(bytes([byte]))
        except OSError:         # the edge closed while we were still sending
            closed_at = time.monotonic()
            break
        sent += 1
        # The pause between two bytes is a wait for the edge to close.
        c.sock.settimeout(STEP)
        try:
            chunk = c.sock.recv(4096)
        except socket.timeout:
            continue
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            closed_at = time.monotonic()
            break
        received += chunk
    else:
        # The whole CONNECT went out: whatever the edge answers, it must not be a CONNACK.
        c.sock.settimeout(10)
        try:
            received += c.sock.recv(4096)
        except (socket.timeout, ConnectionResetError):
            pass
    c.close()
    assert received == b"", f"the edge answered a CONNECT sent over {sent * STEP:.1f} s: " \
                            f"{received!r}"
    assert closed_at is not None, "the trickled CONNECT kept the connection open"
    assert sent < len(data)
    # From the connection's start: not before the deadline, and long before the CONNECT's
    # last byte would have come.
    assert closed_at - start >= CONNECT_TIMEOUT * 0.9
    assert closed_at - start < len(data) * STEP


def test_empty_topic_name_3_1_1_closes_the_connection(edge):
    for qos in (1, 0):
        c = session(edge, 4, f"empty-v4-q{qos}")
        c.send(publish("", b"0123456789", qos=qos, packet_id=1))
        # 3.1.1 gives the server no reason code after CONNECT: the connection closes, and
        # nothing is acknowledged.
        assert c.read_packet() is None
        c.close()


def test_empty_topic_name_5_0_is_a_protocol_error(edge):
    for qos in (1, 0):
        c = session(edge, 5, f"empty-v5-q{qos}")
        c.send(publish("", b"0123456789", qos=qos, packet_id=1, level=5))
        got = c.read_packet()
        assert got is not None and got[0] == DISCONNECT, got
        assert got[2][0] == 0x82, hex(got[2][0])
        assert c.read_packet() is None
        c.close()
    # Packet id 0 on a QoS 1 PUBLISH parses, and is a Protocol Error (0x82), not Malformed.
    c = session(edge, 5, "zero-id")
    c.send(publish("device/z/telemetry", b"x", qos=1, packet_id=0, level=5))
    got = c.read_packet()
    assert got is not None and got[0] == DISCONNECT and got[2][0] == 0x82, got
    c.close()
    # The edge serves the next client as before.
    c = session(edge, 5, "after")
    c.send(publish("device/a/telemetry", b"ok", qos=1, packet_id=9, level=5))
    kind, _, body = c.read_packet()
    assert kind == PUBACK and body[:2] == b"\x00\x09"
    c.close()
