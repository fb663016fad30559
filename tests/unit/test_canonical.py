"""StreamMessages rewritten in canonical form in C (danube.broker._canon.canonical_stream_message,
DeliveryStamp, Outbox.offer, MessageBatchView.stamp) against protobuf's own merge of the
same bytes, and against the strict wire walker (tests/support/wire_walker.py)."""

import pytest
from hypothesis import given, settings, strategies as st

from danube.broker._canon import DeliveryStamp, canonical_stream_message
from danube.broker._fanout import Outbox
from danube.broker._stamp import parse_message_batch
from danube.codec.grpcframe import GrpcDeframer
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
import wire_walker
from wire_walker import NotCanonical, encode_field as field

TOPIC, BROKER = "/default/t", "http://127.0.0.1:6650"
HEAD = pb.StreamMessage(msg_id=pb.MsgID(topic_name=TOPIC, broker_addr=BROKER)
                        ).SerializeToString()


def merged(data, head=b""):
    """What protobuf makes of ``head + data``, without the unknown fields (which prost, and
    the canonical form, drop)."""
    msg = pb.StreamMessage.FromString(head + data)
    msg.DiscardUnknownFields()
    return msg


def assert_same(ours, msg):
    """``ours`` decodes to ``msg`` and, unless it has two map entries (whose order upb
    chooses its own way), is byte for byte what protobuf writes for it."""
    assert pb.StreamMessage.FromString(ours) == msg
    if len(wire_walker.check(ours).get("attributes", [])) <= 1:
        assert ours == msg.SerializeToString()


def delivered(data, stamp):
    box = Outbox()
    assert box.offer(data, stamp)
    [out] = GrpcDeframer().feed(bytes(box.take()))
    assert canonical_stream_message(data, stamp) == out
    return out


# -- the walker itself -------------------------------------------------------------------

@pytest.mark.parametrize("data, why", [
    (field(2, field(1, 5)) + field(2, field(2, b"t")), "occurs more than once"),
    (field(3, b"x") + field(1, 4), "after field 3"),
    (field(2, field(5, 1) + field(1, 2)), "StreamMessage.msg_id.producer_id"),
    (field(2, field(2, b"a") + field(2, b"b")), "occurs more than once"),
    (field(11, 1), "unknown field 11"),
    (field(2, field(4, 1)), "unknown field 4"),
    (field(1, b"x"), "wire type 2"),
])
def test_walker_refuses(data, why):
    with pytest.raises(NotCanonical, match=why):
        wire_walker.check(data)


def test_walker_takes_what_protobuf_writes():
    msg = pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=2, topic_name="t",
                                                         broker_addr="b", topic_offset=3),
                           payload=b"p", publish_time=4, producer_name="n",
                           subscription_name="s", attributes={"a": "1", "b": "2"},
                           schema_id=0, schema_version=1, routing_key="k")
    got = wire_walker.check(msg.SerializeToString())
    assert got["msg_id"] == {"producer_id": 2, "topic_name": b"t", "broker_addr": b"b",
                             "topic_offset": 3}
    assert len(got["attributes"]) == 2 and got["schema_id"] == 0


# -- edge cases ----------------------------------------------------------------------------

STAMP = DeliveryStamp(TOPIC, BROKER)

CASES = {
    "no msg_id": field(1, 7) + field(3, b"pay"),
    "msg_id once": field(1, 7) + field(2, field(1, 9) + field(5, 4)) + field(3, b"pay"),
    "msg_id twice, stamp first": (field(2, field(2, b"/x/y") + field(3, b"http://a:1"))
                                  + field(1, 7) + field(2, field(1, 9) + field(5, 4))),
    "msg_id twice, producer's first": (field(2, field(1, 9) + field(2, b"/own"))
                                       + field(3, b"p") + field(2, field(5, 12))),
    "msg_id thrice, scalars overridden": (field(2, field(5, 1) + field(1, 2))
                                          + field(2, field(5, 3))
                                          + field(2, field(1, 4) + field(5, 0))),
    "fields out of order": (field(10, b"key") + field(5, b"prod") + field(3, b"p")
                            + field(1, 3) + field(2, field(5, 8)) + field(4, 99)),
    "scalars repeated": field(1, 1) + field(3, b"a") + field(1, 2) + field(3, b"bb"),
    "attributes split": (field(7, field(1, b"a") + field(2, b"1")) + field(8, 5)
                         + field(7, field(1, b"b") + field(2, b"2")) + field(2, b"")),
    "optional fields zero": field(8, 0) + field(9, 0) + field(10, b"") + field(2, b""),
    "plain fields zero": field(1, 0) + field(3, b"") + field(4, 0) + field(5, b"")
                         + field(2, field(1, 0) + field(2, b"") + field(5, 0)),
    "unknown fields": (field(11, 1) + field(2, field(4, 7) + field(6, b"z")) + field(1, b"x")
                       + b"\x63\x08\x01\x64" + field(3, b"p")),   # and a group (12)
    "empty": b"",
}


@pytest.mark.parametrize("name", list(CASES))
def test_edge_cases_match_protobuf(name):
    data = CASES[name]
    plain = canonical_stream_message(data)
    wire_walker.check(plain)
    assert_same(plain, merged(data))
    out = delivered(data, STAMP)
    wire_walker.check(out)
    # The stamp's fields act as a msg_id in front: the message's own values win.
    assert_same(out, merged(data, HEAD))


def test_canonical_bytes_come_back_unchanged():
    data = pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=3), payload=b"x",
                            attributes={"k": "v"}, routing_key="").SerializeToString()
    assert canonical_stream_message(data) is data


@pytest.mark.parametrize("data", [b"\x08", b"\x12\x05ab", b"\x12\x02\x08", b"\x00\x01",
                                  b"\x0c", b"\x63\x08"])
def test_malformed_messages_are_refused(data):
    with pytest.raises(ValueError, match="malformed"):
        canonical_stream_message(data)
    with pytest.raises(ValueError, match="malformed"):
        Outbox().offer(data, STAMP)


def test_outbox_limit_counts_the_stamped_size():
    data = field(3, b"x" * 10)
    size = len(canonical_stream_message(data, STAMP))
    box = Outbox(limit=2 * (size + 5))
    assert box.offer(data, STAMP) and box.offer(data, STAMP)
    assert not box.offer(data, STAMP)
    assert box.delivered_bytes == 2 * 10           # the payloads' bytes, not the messages'


# -- random messages -------------------------------------------------------------------------

u64 = st.integers(0, 2**64 - 1)
text = st.binary(max_size=6).map(lambda b: b.hex().encode())
id_field = st.one_of(st.builds(field, st.just(1), u64), st.builds(field, st.just(2), text),
                     st.builds(field, st.just(3), text), st.builds(field, st.just(5), u64),
                     st.builds(field, st.just(4), u64))
top_field = st.one_of(
    st.builds(field, st.sampled_from([1, 4, 8]), u64),
    st.builds(field, st.just(9), st.integers(0, 2**32 - 1)),
    st.builds(field, st.sampled_from([3, 5, 6, 10]), text),
    st.builds(lambda k, v: pb.StreamMessage(attributes={k: v}).SerializeToString(),
              st.text(max_size=4), st.text(max_size=4)),
    st.builds(field, st.just(2), st.lists(id_field, max_size=5).map(b"".join)),
    st.builds(field, st.just(13), text),
)


@settings(max_examples=300)
@given(st.lists(top_field, max_size=12).map(b"".join))
def test_random_messages_match_protobuf(data):
    plain = canonical_stream_message(data)
    wire_walker.check(plain)
    assert_same(plain, merged(data))
    out = delivered(data, STAMP)
    wire_walker.check(out)
    assert_same(out, merged(data, HEAD))


# -- the batched publish's stamp -------------------------------------------------------------

@settings(max_examples=100)
@given(st.lists(st.lists(top_field, max_size=8).map(b"".join), max_size=10),
       st.integers(0, 2**63), st.integers(1, 2**64 - 1))
def test_batch_stamped_frames_are_delivered_canonical(msgs, first, producer_id):
    """The batch stamp appends fields for protobuf to merge (cheap on the publish path);
    what is delivered from such a frame is canonical and holds the merged values."""
    body = ext.MessageBatchRaw(producer_id=producer_id, messages=msgs).SerializeToString()
    view = parse_message_batch(body)
    data, ends = view.stamp(first, pb.MsgID(producer_id=producer_id).SerializeToString(),
                            pb.MsgID(topic_name=TOPIC).SerializeToString(),
                            pb.StreamMessage(producer_name="registered").SerializeToString())
    prev = 0
    for i, (raw, end) in enumerate(zip(msgs, ends)):
        stored = data[prev:end]
        prev = end
        out = delivered(stored, STAMP)
        wire_walker.check(out)
        assert_same(out, merged(stored, HEAD))
        want = merged(raw)
        want.producer_name = "registered"
        want.msg_id.producer_id = producer_id
        want.msg_id.topic_name = TOPIC
        want.msg_id.topic_offset = first + i
        # The client's own broker_addr (even an empty one it sent) wins over the topic's.
        want.msg_id.broker_addr = merged(raw, HEAD).msg_id.broker_addr
        assert pb.StreamMessage.FromString(out) == want
    assert prev == len(data)
