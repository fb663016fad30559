"""danube.client._delivery: deliveries decoded without protobuf objects must read exactly as
protobuf reads them, whatever the order, repetition or unknown fields of the input."""

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client import Message, MsgId
from danube.client._delivery import decode_delivery_batch, decode_stream_message
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=20)

stream_messages = st.builds(
    lambda rid, pid, topic, broker, off, payload, t, prod, sub, attrs, sid, ver, key:
        _message(rid, pid, topic, broker, off, payload, t, prod, sub, attrs, sid, ver, key),
    u64, u64, text, text, u64, st.binary(max_size=64), u64, text, text,
    st.dictionaries(text, text, max_size=3), st.none() | u64,
    st.none() | st.integers(0, 2**32 - 1), st.none() | text)


def _message(rid, pid, topic, broker, off, payload, t, prod, sub, attrs, sid, ver, key):
    m = pb.StreamMessage(request_id=rid, payload=payload, publish_time=t, producer_name=prod,
                         subscription_name=sub, attributes=attrs,
                         msg_id=pb.MsgID(producer_id=pid, topic_name=topic,
                                         broker_addr=broker, topic_offset=off))
    if sid is not None:
        m.schema_id = sid
    if ver is not None:
        m.schema_version = ver
    if key is not None:
        m.routing_key = key
    return m


def assert_same(ours, theirs):
    theirs.DiscardUnknownFields()         # kept by protobuf, skipped by ours
    assert ours.to_proto() == theirs
    assert ours == theirs
    assert ours.msg_id.topic_offset == theirs.msg_id.topic_offset
    assert ours.payload == theirs.payload
    assert dict(ours.attributes) == dict(theirs.attributes)
    for name in ("schema_id", "schema_version", "routing_key", "msg_id"):
        assert ours.HasField(name) == theirs.HasField(name)


@settings(max_examples=300, deadline=None)
@given(st.lists(stream_messages, max_size=8))
def test_a_batch_reads_as_protobuf_reads_it(messages):
    data = ext.DeliveryBatch(messages=messages).SerializeToString()
    ours = decode_delivery_batch(data)
    assert len(ours) == len(messages)
    for a, b in zip(ours, messages):
        assert_same(a, b)


@settings(max_examples=200, deadline=None)
@given(stream_messages, stream_messages, st.binary(max_size=3))
def test_repeated_fields_merge_and_unknown_fields_are_skipped(first, second, junk):
    # Protobuf's rules for concatenated messages: scalars last-wins, msg_id merged, map
    # entries added; an unknown field (here number 15, LEN) is skipped.
    unknown = b"\x7a" + bytes((len(junk),)) + junk
    data = first.SerializeToString() + unknown + second.SerializeToString()
    assert_same(decode_stream_message(data), pb.StreamMessage.FromString(data))


def test_a_known_field_with_another_wire_type_is_skipped_as_protobuf_skips_it():
    data = b"\x1d\x01\x02\x03\x04" + pb.StreamMessage(payload=b"x").SerializeToString()
    assert_same(decode_stream_message(data), pb.StreamMessage.FromString(data))


@pytest.mark.parametrize("data, fault", [
    (b"\x0a\x05\x1a\x10abc", "malformed StreamMessage at byte 2"),       # length past the end
    (b"\x0a\x02\x08\xff", "malformed StreamMessage at byte 2"),          # truncated varint
    (b"\x0a\x03\x2a\x01\xff", "invalid UTF-8 in StreamMessage.producer_name"),
    (b"\x0a\x05\x12\x03\x12\x01\xc3", "invalid UTF-8 in MsgID.topic_name"),
    (b"\x0a\x01", "malformed DeliveryBatch at byte 0"),
    (b"\x0f", "malformed DeliveryBatch at byte 0"),                      # bad wire type
])
def test_malformed_batches_are_refused_naming_the_fault(data, fault):
    with pytest.raises(ValueError, match=fault):
        decode_delivery_batch(data)


def test_names_repeated_in_a_batch_are_decoded_once():
    batch = ext.DeliveryBatch(messages=[
        pb.StreamMessage(producer_name="p", msg_id=pb.MsgID(topic_name="/default/t"))
        for _ in range(3)])
    a, b, c = decode_delivery_batch(batch.SerializeToString())
    assert a.msg_id.topic_name is b.msg_id.topic_name is c.msg_id.topic_name
    assert a.producer_name is c.producer_name == "p"


def test_a_message_behaves_as_a_value():
    m = Message(request_id=3, msg_id=MsgId(1, "/default/t", "b:1", 9), payload=b"x",
                attributes={"k": "v"}, schema_id=4)
    assert pickle.loads(pickle.dumps(m)) == m
    assert pickle.loads(pickle.dumps(m.msg_id)) == m.msg_id
    assert {m.msg_id: 1}[MsgId(1, "/default/t", "b:1", 9)] == 1
    assert m.msg_id == pb.MsgID(producer_id=1, topic_name="/default/t", broker_addr="b:1",
                                topic_offset=9)
    assert "topic_offset=9" in repr(m) and "schema_id=4" in repr(m)
    assert m.HasField("schema_id") and not m.HasField("routing_key")
    with pytest.raises(ValueError, match="does not have presence"):
        m.HasField("payload")
    with pytest.raises(ValueError, match="has no"):
        m.HasField("nope")
    fresh = Message()
    fresh.attributes["a"] = "b"              # made on first use, and kept
    assert fresh.attributes == {"a": "b"}
