"""StreamMessage batches built, parsed and stamped in C must match what protobuf does."""

import pytest
from hypothesis import given, strategies as st

from danube.broker._canon import DeliveryStamp, canonical_stream_message
from danube.broker._stamp import parse_message_batch
from danube.codec.msgbatch import encode_message_batch
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext

u64 = st.integers(min_value=0, max_value=2**64 - 1)


def _split(data, ends):
    out, prev = [], 0
    for e in ends:
        out.append(data[prev:e])
        prev = e
    return out


@given(st.lists(st.one_of(st.binary(max_size=300), st.text(max_size=50)), max_size=30),
       u64, u64, u64.filter(lambda x: x < 2**64 - 40), u64, st.booleans())
def test_encode_message_batch_matches_protobuf(payloads, request_id, producer_id, first_id,
                                               publish_time, as_range):
    ours = encode_message_batch(payloads, request_id, producer_id, first_id, publish_time,
                                as_range)
    ref = ext.MessageBatch(
        request_id=request_id, producer_id=producer_id, offsets_as_range=as_range,
        messages=[pb.StreamMessage(request_id=first_id + i, publish_time=publish_time,
                                   payload=p.encode() if isinstance(p, str) else p)
                  for i, p in enumerate(payloads)]).SerializeToString()
    assert ours == ref
    # Any bytes-like payload, and any sequence of them.
    assert encode_message_batch(tuple(bytearray(p.encode() if isinstance(p, str) else p)
                                      for p in payloads), request_id, producer_id, first_id,
                                publish_time, as_range) == ref


def test_encode_message_batch_refuses_non_buffers():
    with pytest.raises(TypeError):
        encode_message_batch([1], 1, 1, 1, 1)
    with pytest.raises(ValueError):
        encode_message_batch([b"a", b"b"], 1, 1, 2**64 - 1, 1)


messages_st = st.lists(st.builds(
    lambda payload, rid, with_id, attrs, key: pb.StreamMessage(
        request_id=rid, payload=payload, attributes=attrs, routing_key=key,
        msg_id=pb.MsgID(producer_id=99, topic_name="client", broker_addr="http://c:1")
        if with_id else None),
    st.binary(max_size=200), u64, st.booleans(),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
    st.one_of(st.none(), st.text(max_size=5))), max_size=20)


@given(messages_st, u64, u64, st.booleans(), st.integers(0, 2**63),
       st.text(min_size=1, max_size=30))
def test_parse_and_stamp_match_protobuf(msgs, request_id, producer_id, as_range, first,
                                        topic):
    body = ext.MessageBatch(request_id=request_id, producer_id=producer_id, messages=msgs,
                            offsets_as_range=as_range).SerializeToString()
    view = parse_message_batch(body)
    assert (view.request_id, view.producer_id, view.offsets_as_range, len(view)) == \
        (request_id, producer_id, as_range, len(msgs))
    assert [pb.StreamMessage.FromString(r) for r in view.messages()] == msgs
    assert view.max_payload == max((len(m.payload) for m in msgs), default=0)
    assert view.payload_bytes == sum(len(m.payload) for m in msgs)
    data, ends = view.stamp(first, pb.MsgID(producer_id=7).SerializeToString(),
                            pb.MsgID(topic_name=topic).SerializeToString(),
                            pb.StreamMessage(producer_name="registered").SerializeToString())
    # What a reliable topic delivers: its read_head, then the stored frame.
    head = pb.StreamMessage(msg_id=pb.MsgID(topic_name=topic, broker_addr="http://broker:1")
                            ).SerializeToString()
    assert ends.typecode == "Q" and len(ends) == len(msgs)
    for i, (raw, m) in enumerate(zip(_split(data, ends), msgs)):
        stored = pb.StreamMessage.FromString(raw)
        assert stored.msg_id.topic_name == (topic if m.HasField("msg_id") else "")
        assert stored.msg_id.broker_addr == m.msg_id.broker_addr     # never stamped
        got = pb.StreamMessage.FromString(head + raw)
        # Delivery gives the same values as that merge, in one msg_id (test_canonical.py).
        assert pb.StreamMessage.FromString(canonical_stream_message(
            raw, DeliveryStamp(topic, "http://broker:1"))) == got
        want = pb.StreamMessage()
        want.CopyFrom(m)
        want.producer_name = "registered"
        want.msg_id.producer_id = 7
        want.msg_id.topic_name = topic
        want.msg_id.topic_offset = first + i
        if not m.msg_id.broker_addr:
            want.msg_id.broker_addr = "http://broker:1"     # the client's is kept otherwise
        assert got == want


def test_parse_skips_unknown_fields_and_takes_the_last_scalar():
    msg = pb.StreamMessage(payload=b"x").SerializeToString()
    body = (b"\x08\x05" + b"\x10\x03" + b"\x1a" + bytes([len(msg)]) + msg
            + b"\x28\x07" + b"\x31" + b"\0" * 8 + b"\x3d" + b"\0" * 4 + b"\x42\x02hi"
            + b"\x08\x06" + b"\x0a\x01z")      # field 1 again; field 1 as LEN: unknown
    view = parse_message_batch(body)
    assert (view.request_id, view.producer_id, len(view), view.messages()) == (6, 3, 1, [msg])
    assert parse_message_batch(bytearray(body)).request_id == 6
    assert len(parse_message_batch(b"")) == 0


@pytest.mark.parametrize("body", [
    b"\x08",                                   # varint cut short
    b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",   # varint over 10 bytes
    b"\x1a\x05abc",                            # LEN past the end
    b"\x00\x01",                               # field number 0
    b"\x0b\x0c",                               # a group
    b"\x31\0\0",                               # fixed64 cut short
    b"\x1a\x02\x1a\x05",                       # a message whose payload runs past it
    b"\x1a\x02\x12\x01",                       # a msg_id that runs past the message
    b"\x1a\x03\x12\x01\x08",                   # a msg_id with a varint cut short
])
def test_parse_refuses_malformed_batches(body):
    with pytest.raises(ValueError, match="malformed"):
        parse_message_batch(body)


def test_stamp_of_an_empty_batch():
    data, ends = parse_message_batch(b"\x08\x01").stamp(5, b"", b"", b"")
    assert (data, list(ends)) == (b"", [])
    with pytest.raises(ValueError):
        parse_message_batch(b"\x1a\x00\x1a\x00").stamp(2**64 - 1, b"")


def _batch_of(*messages):
    return parse_message_batch(ext.MessageBatch(producer_id=1, messages=list(messages))
                               .SerializeToString())


def test_schema_fields_of_a_batch():
    ok = pb.StreamMessage(payload=b"a", schema_id=7, schema_version=2)
    latest = pb.StreamMessage(payload=b"bb", schema_id=7)
    batch = _batch_of(ok, latest, ok)
    assert batch.schema_mismatch(7) == (-1, None)
    assert batch.payloads_and_versions() == ([b"a", b"bb", b"a"], [2, 0, 2])
    assert batch.payloads_and_versions(False) == ([], [2, 0, 2])
    # The first message without the id, or with another, is named.
    assert _batch_of(ok, pb.StreamMessage(payload=b"x"), ok).schema_mismatch(7) == (1, None)
    assert _batch_of(ok, ok, pb.StreamMessage(schema_id=8)).schema_mismatch(7) == (2, 8)
    # schema_id 0 is present (proto3 optional), not absent.
    assert _batch_of(pb.StreamMessage(schema_id=0)).schema_mismatch(0) == (-1, None)
    # The last occurrence of a field wins, as protobuf merges.
    merged = ok.SerializeToString() + pb.StreamMessage(payload=b"z", schema_id=9) \
        .SerializeToString()
    raw = ext.MessageBatchRaw(producer_id=1, messages=[merged]).SerializeToString()
    assert parse_message_batch(raw).schema_mismatch(9) == (-1, None)
    assert parse_message_batch(raw).payloads_and_versions() == ([b"z"], [2])


def test_distinct_versions_of_a_batch():
    msgs = [pb.StreamMessage(schema_id=1, schema_version=v) for v in (2, 2, 3, 2)]
    assert _batch_of(*msgs).distinct_versions() == {2, 3}
    assert _batch_of(pb.StreamMessage(schema_id=1)).distinct_versions() == {0}
    assert _batch_of().distinct_versions() == set()


def test_groups_are_malformed_in_a_batch_but_skipped_in_stored_frames():
    group = b"\xab\x06\x08\x01\xac\x06"          # field 101, a group holding a varint
    raw = ext.MessageBatchRaw(producer_id=1,
                              messages=[pb.StreamMessage(payload=b"a").SerializeToString()
                                        + group]).SerializeToString()
    with pytest.raises(ValueError, match="malformed StreamMessage 0"):
        parse_message_batch(raw)
    stored = pb.StreamMessage(payload=b"a").SerializeToString() + group
    assert pb.StreamMessage.FromString(canonical_stream_message(stored)).payload == b"a"
