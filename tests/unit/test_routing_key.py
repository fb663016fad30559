"""The KeyShared routing key read in C from a stored StreamMessage (_canon.routing_key)
equals what protobuf reads: routing_key when present, even empty, else producer_name; the
last occurrence wins; malformed bytes and names that are not UTF-8 are refused."""

import random

import pytest

from danube.broker._canon import routing_key
from danube.proto import DanubeApi_pb2 as pb


def protobuf_key(data):
    msg = pb.StreamMessage.FromString(data)
    return msg.routing_key if msg.HasField("routing_key") else msg.producer_name


NAMES = ["", "p", "producer-7", "ключ", "键🔑", "x" * 300]


def random_message(rng):
    msg = pb.StreamMessage(request_id=rng.randint(0, 1 << 40), payload=rng.randbytes(20),
                           publish_time=rng.randint(0, 1 << 42),
                           msg_id=pb.MsgID(topic_offset=rng.randint(0, 1000)))
    if rng.random() < 0.8:
        msg.producer_name = rng.choice(NAMES)
    if rng.random() < 0.5:
        msg.routing_key = rng.choice(NAMES)
    if rng.random() < 0.3:
        msg.attributes["k"] = rng.choice(NAMES)
    return msg.SerializeToString()


def test_equals_protobuf_on_random_and_concatenated_messages():
    rng = random.Random(11)
    for _ in range(2000):
        data = random_message(rng)
        if rng.random() < 0.3:
            data += random_message(rng)         # a second occurrence of each field wins
        assert routing_key(data) == protobuf_key(data)


def test_an_empty_routing_key_is_the_key():
    data = pb.StreamMessage(producer_name="p", routing_key="").SerializeToString()
    assert routing_key(data) == "" == protobuf_key(data)


def test_malformed_and_non_utf8_are_refused():
    with pytest.raises(ValueError, match="malformed StreamMessage"):
        routing_key(b"\x52\x05ab")              # routing_key's length runs past the end
    with pytest.raises(ValueError):
        routing_key(b"\x52\x02\xff\xfe")        # not UTF-8
