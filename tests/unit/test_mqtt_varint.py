"""MQTT's variable byte integer (danube/mqtt/codec.py), read once for the Remaining Length of
a fixed header (where the bytes may not all be here yet) and for the lengths inside a
packet (where they must be)."""

import pytest

from danube.mqtt import codec


@pytest.mark.parametrize("encoded, value", [
    (b"\x00", 0), (b"\x7f", 127), (b"\x80\x01", 128), (b"\xff\x7f", 16383),
    (b"\x80\x80\x01", 16384), (b"\xff\xff\xff\x7f", 268435455)])
def test_each_length_of_the_encoding(encoded, value):
    buf = b"\x30" + encoded + b"body"
    assert codec.remaining_length(buf, 0, len(buf)) == (value, 1 + len(encoded))
    assert codec._varint(buf, 1, len(buf)) == (value, 1 + len(encoded))
    assert codec._encode_varint(value) == encoded


@pytest.mark.parametrize("have", [1, 2, 3, 4])
def test_a_header_cut_short_asks_for_more_and_a_packet_cut_short_is_malformed(have):
    buf = b"\x30" + b"\xff\xff\xff\x7f"[:have - 1] if have > 1 else b"\x30"
    assert codec.remaining_length(buf, 0, len(buf))[0] == -1
    with pytest.raises(codec.ProtocolError, match="runs past the packet"):
        codec._varint(buf, 1, len(buf))


def test_a_fifth_byte_is_malformed_whether_or_not_it_came():
    for buf in (b"\x30\xff\xff\xff\xff", b"\x30\xff\xff\xff\xff\x01"):
        with pytest.raises(codec.ProtocolError, match="remaining length longer than 4"):
            codec.remaining_length(buf, 0, len(buf))
        with pytest.raises(codec.ProtocolError, match="integer longer than 4"):
            codec._varint(buf, 1, len(buf))
