"""The edge's pure parts: the MQTT packet codec (sans I/O, driven byte by byte and in one
piece, checked against paho-mqtt's own encoder), upstream's edge.yaml and its refusals, the
topic router, and the cluster's dedup of replicated batches."""

import os

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from danube.broker.edges import _unseen
from danube.config_errors import ConfigError
from danube.edge import config as edge_config
from danube.mqtt import codec
from danube.edge.router import Router
from danube.proto import DanubeApi_pb2 as pb

UPSTREAM = os.path.join(os.path.dirname(__file__), "..", "support", "upstream_edge.yaml")


def _paho_bytes(fn, protocol):
    """The bytes paho-mqtt writes for ``fn(client)`` (its socket replaced by a list)."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="dev-1", protocol=protocol)
    out = []

    class Sock:
        def send(self, data):
            out.append(bytes(data))
            return len(data)

        def fileno(self):
            return -1

        def setblocking(self, flag):
            pass

        def close(self):
            pass

    c._sock = Sock()
    c._state = mqtt._ConnectionState.MQTT_CS_CONNECTED
    fn(c)
    c._packet_write()
    return b"".join(out)


@pytest.mark.parametrize("protocol,level", [(mqtt.MQTTv311, 4), (mqtt.MQTTv5, 5)])
def test_decodes_what_paho_encodes(protocol, level):
    props = None
    if level == 5:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("unit", "C")
        props.ContentType = "application/json"
    data = _paho_bytes(lambda c: c.publish("device/a/telemetry", b'{"t": 1}', qos=1,
                                           properties=props), protocol)
    for chunking in (len(data), 1):         # whole, and one byte at a time
        d = codec.Decoder(1 << 20, 1024)
        d.level = level
        d.runs = False
        packets = []
        for i in range(0, len(data), chunking):
            packets += d.feed(data[i:i + chunking])
        (p,) = packets
        assert (p.topic, p.payload, p.qos, p.packet_id) == ("device/a/telemetry", b'{"t": 1}',
                                                            1, 1)
        if level == 5:
            assert (codec.USER_PROPERTY, ("unit", "C")) in p.properties
            assert (codec.CONTENT_TYPE, "application/json") in p.properties


def test_runs_of_publishes_in_c():
    """A run of plain PUBLISH packets to one topic comes out as one Run, encoded in C into
    the same StreamMessages protobuf reads, with the QoS 1 ones' PUBACKs."""
    from mqtt_raw import publish
    from danube.codec.mqtt import encode_run
    data = b"".join(publish("d/1", b"p%d" % i, qos=i % 2, packet_id=i + 1) for i in range(5))
    data += publish("d/2", b"other", qos=1, packet_id=9) + b"\x30"   # a partial one after
    (run, other) = codec.Decoder(4096, 64).feed(data)
    assert (run.topic, run.count, run.qos1) == ("d/1", 5, 2)
    assert (other.topic, other.count) == ("d/2", 1)
    prefix = pb.StreamMessage(msg_id=pb.MsgID(topic_name="/e/t")).SerializeToString()
    suffix = pb.StreamMessage(producer_name="mqtt-gateway",
                              attributes={"k": "v"}).SerializeToString()
    raw, ends, acks = encode_run(run.raw, 0, run.count, False, prefix, suffix, 1234)
    starts = [0, *ends[:-1]]
    msgs = [pb.StreamMessage.FromString(raw[a:b]) for a, b in zip(starts, ends)]
    assert [m.payload for m in msgs] == [b"p%d" % i for i in range(5)]
    assert all(m.msg_id.topic_name == "/e/t" and m.publish_time == 1234
               and dict(m.attributes) == {"k": "v"} for m in msgs)
    assert acks == b"\x40\x02\x00\x02\x40\x02\x00\x04"
    # MQTT 5: a PUBLISH with properties ends the run (the general decoder reads it).
    d5 = codec.Decoder(4096, 64)
    d5.level = 5
    out = d5.feed(publish("a", b"x", 1, 1, level=5) + publish("a", b"y", 1, 2, level=5,
                                                                props=b"\x01\x01"))
    assert [type(p).__name__ for p in out] == ["Run", "Publish"]


def test_connect_fields():
    from mqtt_raw import connect
    d = codec.Decoder(4096, 64)
    (c,) = d.feed(connect("dev", level=5, keep_alive=30, username="u", password="p"))
    assert (c.level, c.client_id, c.keep_alive, c.username, c.password, c.clean) == \
        (5, "dev", 30, "u", b"p", True)
    assert d.level == 5


@pytest.mark.parametrize("data,reason", [
    (b"\x30\xff\xff\xff\xff\x01", codec.MALFORMED),          # 5-byte remaining length
    (b"\x36\x05\x00\x01t\x00\x01", codec.MALFORMED),         # QoS 3
    (b"\x38\x03\x00\x01t", codec.MALFORMED),                 # DUP at QoS 0
    (b"\x32\x05\x00\x01t\x00\x00", codec.PROTOCOL_ERROR),    # packet id 0
    (b"\x30\x05\x00\x03a/+", codec.TOPIC_NAME_INVALID),      # wildcard in a topic name
    (b"\x30\x04\x00\x02\xff\xfe", codec.MALFORMED),          # topic not UTF-8
    (b"\x20\x02\x00\x00", codec.PROTOCOL_ERROR),             # CONNACK from a client
    (b"\x82\x03\x00\x01\x00", codec.MALFORMED),              # SUBSCRIBE flags 0
    (b"\xc0\x01\x00", codec.MALFORMED),                      # PINGREQ with a body
    (b"\x00\x00", codec.PROTOCOL_ERROR),                     # reserved type 0
])
def test_refusals(data, reason):
    with pytest.raises(codec.ProtocolError) as err:
        codec.Decoder(4096, 64).feed(data)
    assert err.value.reason == reason


def test_size_limits_are_checked_before_the_body_arrives():
    d = codec.Decoder(100, 8)
    with pytest.raises(codec.ProtocolError) as err:
        d.feed(b"\x30\xe8\x07")                 # announces 1000 bytes; none sent yet
    assert err.value.reason == codec.PACKET_TOO_LARGE
    with pytest.raises(codec.ProtocolError) as err:
        codec.Decoder(100, 8).feed(b"\x30\x0b\x00\x09abcdefghi")
    assert err.value.reason == codec.TOPIC_NAME_INVALID


def test_v5_properties_of_every_kind_round_trip():
    props = [(codec.RECEIVE_MAXIMUM, 10), (codec.MAXIMUM_PACKET_SIZE, 1 << 20),
             (codec.RETAIN_AVAILABLE, 0), (codec.ASSIGNED_CLIENT_ID, "x"),
             (codec.USER_PROPERTY, ("k", "v")), (0x0B, 300), (0x09, b"\x00\x01")]
    raw = codec.encode_properties(props)
    assert codec._properties(raw, 0, len(raw)) == (props, len(raw))


def test_upstream_edge_yaml():
    cfg = edge_config.load(UPSTREAM)
    assert (cfg.edge_name, cfg.cluster_url, cfg.heartbeat_interval_ms) == \
        ("edge1", "http://cluster-broker:6650", 30000)
    assert (cfg.replicator_batch_size, cfg.replicator_batch_timeout_ms) == (100, 1000)
    assert cfg.listener == "0.0.0.0:1883" and cfg.max_payload_size == 262_144
    assert [t.danube_topic for t in cfg.danube_topics()] == [
        "/edge1/telemetry", "/edge1/sensors", "/edge1/unrouted"]
    router = Router(cfg.topic_mappings)
    r = router.resolve("sensors/temp/avg")
    assert (r.topic, r.attributes) == ("/edge1/sensors",
                                       {"sensor_type": "temp", "measurement": "avg"})
    assert router.resolve("device/d1/telemetry").attributes == {"device_id": "d1"}
    assert router.resolve("device/d1/telemetry/extra").topic == "/edge1/unrouted"
    assert router.resolve("x").topic == "/edge1/unrouted"


@pytest.mark.parametrize("text,words", [
    ("mqtt: {}", "edge is required"),
    ("edge: {edge_name: 'a b', cluster_url: x}", "edge_name"),
    ("edge: {edge_name: e}", "cluster_url is required"),
    ("edge: {edge_name: e, cluster_url: x}\nreplicator: {batch_size: 0}", "batch_size"),
    ("edge: {edge_name: e, cluster_url: x}\nmqtt: {topic_mappings: [{mqtt_pattern: 'a/#/b', "
     "danube_topic: /e/t}]}", "'#'"),
    ("edge: {edge_name: e, cluster_url: x}\nmqtt: {topic_mappings: [{mqtt_pattern: a, "
     "danube_topic: /other/t}]}", "under the edge's namespace"),
    ("edge: {edge_name: e, cluster_url: x}\nmqtt: {topic_mappings: [{mqtt_pattern: a, "
     "danube_topic: /e/t, extract_attributes: {d: '1'}}]}", "captures"),
    ("edge: {edge_name: e, cluster_url: x}\nmqtt: {limits: {max_sessions: 3}}", "max_sessions"),
])
def test_config_refusals(text, words):
    with pytest.raises(ConfigError) as err:
        edge_config.parse(text)
    assert words in str(err.value)


def _m(offset):
    return pb.StreamMessage(msg_id=pb.MsgID(topic_offset=offset), payload=b"%d" % offset)


def test_dedup_by_edge_offsets():
    batch = [_m(i) for i in range(5, 10)]
    assert _unseen(batch, 9, None) == batch
    assert [m.msg_id.topic_offset for m in _unseen(batch, 9, 6)] == [7, 8, 9]
    assert _unseen(batch, 9, 9) == []
    # Offsets not numbered (all 0): whole batch by batch_last_offset, as upstream.
    flat = [_m(0) for _ in range(3)]
    assert _unseen(flat, 9, 4) == flat and _unseen(flat, 9, 9) == []


@pytest.mark.parametrize("raw,count", [
    (b"", 1),
    (b"\x34\x03\x00\x01t", 1),                       # QoS 2
    (b"\x32\x10\x00\x01t", 1),                       # shorter than announced
    (b"\x30\x03\x00\x01t", 2),                       # fewer packets than count
    (b"\x30\x01\x00", 1),                            # shorter than its topic length field
    (b"\xc0\x00", 1),                                # not a PUBLISH
])
def test_encode_run_refuses_what_is_not_a_run(raw, count):
    from danube.codec.mqtt import encode_run
    with pytest.raises(ValueError):
        encode_run(raw, 0, count, False, b"", b"", 0)
