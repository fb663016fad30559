"""StreamMessage bytes built and amended in C must equal what protobuf produces."""

import pytest
from hypothesis import given, strategies as st

from danube._core import encode_stream_messages, stamp_messages
from danube.proto import DanubeApi_pb2 as pb

u64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(st.lists(st.binary(max_size=300), max_size=20), u64.filter(lambda x: x < 2**64 - 40),
       u64, st.text(max_size=20), st.text(max_size=40))
def test_encode_matches_protobuf(payloads, first_id, publish_time, name, topic):
    mid = pb.MsgID(producer_id=3, topic_name=topic, broker_addr="http://b:1")
    ours = encode_stream_messages(payloads, first_id, publish_time, mid.SerializeToString(),
                                  name.encode())
    ref = [pb.StreamMessage(request_id=first_id + i, msg_id=mid, payload=p,
                            publish_time=publish_time, producer_name=name).SerializeToString()
           for i, p in enumerate(payloads)]
    assert ours == ref


@given(st.lists(st.binary(max_size=100), min_size=1, max_size=10),
       st.integers(min_value=0, max_value=2**63), st.integers(min_value=1, max_value=2**63),
       st.text(max_size=30))
def test_stamp_merges_msg_id_and_keeps_the_rest(payloads, first, producer_id, topic):
    raws = [pb.StreamMessage(request_id=i, payload=p, producer_name="client-side",
                             attributes={"k": str(i)}, routing_key="rk",
                             msg_id=pb.MsgID(broker_addr="http://b:1", producer_id=99))
            .SerializeToString() for i, p in enumerate(payloads)]
    stamped = stamp_messages(raws, first, pb.MsgID(producer_id=producer_id,
                                                   topic_name=topic).SerializeToString(),
                             pb.StreamMessage(producer_name="registered").SerializeToString())
    for i, (raw, p) in enumerate(zip(stamped, payloads)):
        m = pb.StreamMessage.FromString(raw)
        assert (m.payload, m.request_id, m.attributes["k"], m.routing_key) == (p, i, str(i), "rk")
        assert m.producer_name == "registered"
        assert (m.msg_id.producer_id, m.msg_id.topic_name, m.msg_id.broker_addr,
                m.msg_id.topic_offset) == (producer_id, topic, "http://b:1", first + i)


def test_non_bytes_are_refused():
    with pytest.raises(TypeError):
        encode_stream_messages([bytearray(b"x")], 1, 1, b"", b"")
    with pytest.raises(TypeError):
        stamp_messages(["text"], 0, b"")
