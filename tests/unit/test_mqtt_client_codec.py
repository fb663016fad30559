"""danube/mqtt/client_codec.py: what a client sends, read back by the server's decoder of
danube/mqtt/codec.py, and what a server sends, cut by ClientDecoder whole, byte by byte and
across a packet larger than a read; packets that break the protocol raise ProtocolError
with the reason a client disconnects with."""

import struct

import pytest

from danube.mqtt import client_codec as cc
from danube.mqtt import codec
from danube.mqtt.codec import ProtocolError

from mqtt_raw import packet, string, varint


def publish(topic, payload, qos=1, packet_id=1, level=4, props=b"", dup=False, retain=False):
    body = string(topic)
    if qos:
        body += struct.pack(">H", packet_id)
    if level == 5:
        body += varint(len(props)) + props
    return packet(0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0),
                  body + payload)


@pytest.mark.parametrize("level", [4, 5])
def test_connect_read_back_by_the_server_codec(level):
    props = [(codec.SESSION_EXPIRY, 3600), (codec.RECEIVE_MAXIMUM, 2000),
             (codec.MAXIMUM_PACKET_SIZE, 1 << 20)] if level == 5 else []
    raw = cc.encode_connect(level, "dev-1", clean=False, keep_alive=30, username="u",
                            password="p\u00e9", properties=props)
    c = codec.Decoder(1 << 20, 256).feed(raw)[0]
    assert (c.level, c.client_id, c.clean, c.keep_alive, c.username, c.password) == \
        (level, "dev-1", False, 30, "u", "p\u00e9".encode())
    assert c.properties == props


def test_connect_refuses_what_the_protocol_cannot_say():
    with pytest.raises(ValueError, match="only with a user name"):
        cc.encode_connect(4, "x", clean=True, keep_alive=60, password="p")
    with pytest.raises(ValueError, match="keep alive"):
        cc.encode_connect(5, "x", clean=True, keep_alive=70000)
    # MQTT 5 allows a password alone.
    assert cc.encode_connect(5, "x", clean=True, keep_alive=60, password=b"p")


@pytest.mark.parametrize("level", [4, 5])
def test_subscribe_read_back(level):
    d = codec.Decoder(1 << 20, 256)
    d.level = level
    p = d.feed(cc.encode_subscribe(7, [("a/+/b", 1), ("c/#", 2)], level))[0]
    assert (p.kind, p.packet_id, p.filters) == (codec.SUBSCRIBE, 7, ["a/+/b", "c/#"])


@pytest.mark.parametrize("level", [4, 5])
def test_server_packets_whole_and_byte_by_byte(level):
    props = b"\x00" if level == 5 else b""
    stream = (packet(0x20, b"\x01\x00" + props)
              + packet(0x90, b"\x00\x07" + props + b"\x01\x80")
              + publish("s/1", b"one", 1, 5, level)
              + publish("s/1", b"two", 0, level=level, retain=True)
              + publish("s/2", b"", 2, 6, level, dup=True)
              + packet(0x62, b"\x00\x06")
              + b"\xd0\x00")
    whole = cc.ClientDecoder(1 << 20, level).feed(stream)
    d = cc.ClientDecoder(1 << 20, level)
    pieces = []
    for i in range(len(stream)):
        pieces += d.feed(stream[i:i + 1])
    for got in (whole, pieces):
        connack, suback, *publishes, pubrel, pingresp = got
        assert (connack.session_present, connack.reason) == (True, 0)
        assert (suback.kind, suback.packet_id, suback.data) == (codec.SUBACK, 7, b"\x01\x80")
        assert publishes == [("s/1", b"one", 1, 5, False, False),
                             ("s/1", b"two", 0, None, False, True),
                             ("s/2", b"", 2, 6, True, False)]
        assert (pubrel.kind, pubrel.packet_id) == (codec.PUBREL, 6)
        assert pingresp.kind == codec.PINGRESP
    d.feed(publish("s/1", b"x", 1, 1, level) + publish("s/1", b"y", 0, level=level))
    assert (d.controls, d.acked_publishes) == (0, 1)


def test_publish_properties_are_skipped_and_a_topic_alias_refused():
    user = b"\x26" + string("k") + string("v")
    d = cc.ClientDecoder(1 << 20, 5)
    assert d.feed(publish("t", b"p", 1, 3, 5, props=b"\x01\x01" + user)) == \
        [("t", b"p", 1, 3, False, False)]
    with pytest.raises(ProtocolError) as e:
        d.feed(publish("t", b"p", 1, 3, 5, props=b"\x23\x00\x01"))
    assert e.value.reason == codec.TOPIC_ALIAS_INVALID


def test_a_packet_larger_than_a_read_is_joined_once():
    big = b"z" * 700_000
    stream = publish("big/1", big, 1, 9) + publish("small", b"s", 1, 10)
    d = cc.ClientDecoder(1 << 20, 4)
    out = []
    for i in range(0, len(stream), 65536):
        out += d.feed(stream[i:i + 65536])
        if i + 65536 < 700_000:
            assert d._chunks is not None          # the pieces kept, not re-joined each read
    assert out == [("big/1", big, 1, 9, False, False), ("small", b"s", 1, 10, False, False)]


@pytest.mark.parametrize("raw,reason,words", [
    (bytes([0x36, 5, 0, 1, 0x61, 0, 1]), codec.MALFORMED, "QoS 3"),
    (bytes([0x38, 4, 0, 1, 0x61, 0x62]), codec.MALFORMED, "DUP set at QoS 0"),
    (bytes([0x32, 5, 0, 1, 0x61, 0, 0]), codec.PROTOCOL_ERROR, "packet identifier 0"),
    (bytes([0x30, 4, 0, 9, 0x61, 0x62]), codec.MALFORMED, "topic name runs past"),
    (bytes([0x30, 4, 0, 1, 0x23, 0x62]), codec.TOPIC_NAME_INVALID, "wildcard"),
    (bytes([0x30, 4, 0, 2, 0xC3, 0x28]), codec.MALFORMED, "not UTF-8"),
    (bytes([0x30, 2, 0, 0]), codec.TOPIC_NAME_INVALID, "empty topic"),
    (bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]), codec.MALFORMED, "longer than 4 bytes"),
    (bytes([0x40, 2, 0, 1]), codec.PROTOCOL_ERROR, "packet type 4"),
    (bytes([0x10, 0]), codec.PROTOCOL_ERROR, "packet type 1"),
    (bytes([0x21, 2, 0, 0]), codec.MALFORMED, "fixed-header flags"),
    (bytes([0x20, 3, 0, 0, 0]), codec.MALFORMED, "CONNACK longer"),
    (bytes([0xE0, 0]), codec.PROTOCOL_ERROR, "DISCONNECT from an MQTT 3.1.1"),
    (bytes([0x90, 2, 0, 1]), codec.PROTOCOL_ERROR, "SUBACK without a return code"),
])
def test_packets_that_break_the_protocol(raw, reason, words):
    with pytest.raises(ProtocolError, match=words) as e:
        cc.ClientDecoder(1 << 20, 4).feed(raw)
    assert e.value.reason == reason


def test_too_large_is_refused_at_its_header():
    d = cc.ClientDecoder(1024, 4)
    with pytest.raises(ProtocolError) as e:
        d.feed(bytes([0x32]) + varint(5000))
    assert e.value.reason == codec.PACKET_TOO_LARGE


@pytest.mark.parametrize("topic_filter,topic,matches", [
    ("a/b", "a/b", True), ("a/b", "a/c", False), ("a/+", "a/b", True), ("a/+", "a", False),
    ("a/+", "a/b/c", False), ("a/#", "a", True), ("a/#", "a/b/c", True), ("#", "x/y", True),
    ("+/+", "/x", True), ("+", "$SYS", False), ("#", "$SYS/x", False),
    ("$SYS/#", "$SYS/x", True), ("a/+/c", "a//c", True), ("a/b/", "a/b", False),
])
def test_filter_matches(topic_filter, topic, matches):
    assert cc.filter_matches(topic_filter, topic) is matches


@pytest.mark.parametrize("piece", [7, 100, 1 << 20])
def test_oversized_publish_passed_over_when_asked(piece):
    """MQTT 3.1.1: a PUBLISH over the limit comes out as a Packet naming it (to be
    acknowledged and counted) and its bytes are passed over, never held."""
    stream = publish("s/a", b"one", 1, 1) + publish("s/big", b"b" * 5000, 2, 2) + \
        publish("s/a", b"two", 0)
    d = cc.ClientDecoder(1024, 4)
    d.skip_oversized = True
    out = []
    for i in range(0, len(stream), piece):
        out += d.feed(stream[i:i + piece])
        assert len(d._rest) <= 1024
    first, skipped, last = out
    assert first == ("s/a", b"one", 1, 1, False, False)
    assert (skipped.kind, skipped.packet_id, skipped.reason, skipped.data) == \
        (codec.PUBLISH, 2, 2, ("s/big", 5000 + 2 + 5 + 2 + 3))
    assert last == ("s/a", b"two", 0, None, False, False)


@pytest.mark.parametrize("level", [4, 5])
def test_mutated_streams_give_packets_or_protocol_error(level):
    """Valid server streams with bytes flipped, cut and inserted (a fixed seed): the decoder
    returns packets or raises ProtocolError, nothing else, whole or in pieces."""
    import random
    rng = random.Random(39)
    props = b"\x00" if level == 5 else b""
    base = (packet(0x20, b"\x00\x00" + props) + packet(0x90, b"\x00\x01" + props + b"\x01")
            + publish("s/1", b"abc", 1, 5, level) + publish("s/2", b"x" * 300, 0, level=level)
            + publish("s/3", b"q2", 2, 9, level, props=b"\x01\x01") + packet(0x62, b"\x00\x09")
            + b"\xd0\x00")
    for _ in range(3000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            op = rng.random()
            if op < 0.6:
                data[at] = rng.randrange(256)
            elif op < 0.8:
                del data[at]
            else:
                data.insert(at, rng.randrange(256))
        for piece in (len(data), rng.randint(1, 40)):
            d = cc.ClientDecoder(512, level)
            d.skip_oversized = rng.random() < 0.5
            try:
                for i in range(0, len(data), piece):
                    d.feed(bytes(data[i:i + piece]))
            except ProtocolError:
                pass
