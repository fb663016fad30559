"""The batched publish path (danube.broker._stamp.parse_message_batch) refuses what
protobuf's parser, and so SendMessage, refuses: strings that are not UTF-8 (producer_name,
subscription_name, routing_key, msg_id's topic_name and broker_addr, attribute keys and
values) and malformed attribute entries. Its C UTF-8 check agrees with Python's decoder."""

import random

import pytest

from danube.broker._stamp import parse_message_batch
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext


def batch(*raw):
    return ext.MessageBatchRaw(request_id=1, producer_id=1, messages=list(raw)) \
        .SerializeToString()


def field(number, value):
    return bytes([number << 3 | 2, len(value)]) + value


def test_the_utf8_check_agrees_with_pythons_decoder():
    rng = random.Random(3)
    tricky = [0xC0, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    for _ in range(20_000):
        value = bytes(rng.choice((rng.randint(0, 255), rng.randint(0x80, 0xBF),
                                  rng.choice(tricky))) for _ in range(rng.randint(0, 6)))
        try:
            value.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        raw = pb.StreamMessage(payload=b"x").SerializeToString() + field(10, value)
        if valid:
            assert len(parse_message_batch(batch(raw))) == 1
        else:
            with pytest.raises(ValueError, match="routing_key is not valid UTF-8"):
                parse_message_batch(batch(raw))


@pytest.mark.parametrize("cp", [0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF,
                                0x10000, 0x10FFFF])
def test_every_length_of_code_point_is_taken(cp):
    message = pb.StreamMessage(routing_key=chr(cp), producer_name=chr(cp))
    message.attributes[chr(cp)] = chr(cp)
    message.msg_id.topic_name = chr(cp)
    assert len(parse_message_batch(batch(message.SerializeToString()))) == 1


@pytest.mark.parametrize("raw, named", [
    (field(5, b"\xc0\xaf"), "producer_name"),                        # overlong
    (field(6, b"\xed\xa0\x80"), "subscription_name"),                # a surrogate
    (field(10, b"\xf4\x90\x80\x80"), "routing_key"),                 # above U+10FFFF
    (field(2, field(2, b"\xc3\x28")), "msg_id"),                     # topic_name
    (field(2, field(3, b"\xe2\x82")), "msg_id"),                     # broker_addr, cut short
    (field(7, b"\x0a\x01k" + field(2, b"\xff")), "an attributes entry"),
    (field(7, field(1, b"\xfe") + b"\x12\x01v"), "an attributes entry"),
])
def test_strings_that_are_not_utf8_are_named(raw, named):
    ok = pb.StreamMessage(payload=b"ok").SerializeToString()
    with pytest.raises(ValueError, match=f"StreamMessage 1 of the batch: {named}"):
        parse_message_batch(batch(ok, raw))


def test_a_malformed_attributes_entry_is_refused():
    with pytest.raises(ValueError, match="malformed StreamMessage 0 of the batch"):
        parse_message_batch(batch(field(7, b"\x0a\x05k")))     # its key runs past the end


def test_payloads_are_bytes_and_not_checked():
    raw = pb.StreamMessage(payload=b"\xff\xfe\xed\xa0\x80").SerializeToString()
    assert len(parse_message_batch(batch(raw))) == 1
