"""A strict reader of the protobuf wire format, independent of the broker's code and of
protobuf's parser: it checks that a StreamMessage is in canonical form, as upstream's prost
encoder writes it and as decoders that do not merge (protobufjs) need it. Every field of the
schema at most once (map entries excepted), in field-number order, with the schema's wire
type, and nothing the schema does not know."""

VARINT, LEN = 0, 2

# field -> (name, wire type, nested schema or None, repeated)
MAP_ENTRY = {1: ("key", LEN, None, False), 2: ("value", LEN, None, False)}
MSG_ID = {1: ("producer_id", VARINT, None, False), 2: ("topic_name", LEN, None, False),
          3: ("broker_addr", LEN, None, False), 5: ("topic_offset", VARINT, None, False)}
STREAM_MESSAGE = {
    1: ("request_id", VARINT, None, False), 2: ("msg_id", LEN, MSG_ID, False),
    3: ("payload", LEN, None, False), 4: ("publish_time", VARINT, None, False),
    5: ("producer_name", LEN, None, False), 6: ("subscription_name", LEN, None, False),
    7: ("attributes", LEN, MAP_ENTRY, True), 8: ("schema_id", VARINT, None, False),
    9: ("schema_version", VARINT, None, False), 10: ("routing_key", LEN, None, False),
}


class NotCanonical(AssertionError):
    pass


def _varint(data, pos):
    value = shift = 0
    while True:
        if pos >= len(data):
            raise NotCanonical("varint runs past the end")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise NotCanonical("varint longer than 10 bytes")


def fields(data):
    """(field number, wire type, value) for each field: an int for varints, bytes for LEN.
    Raises NotCanonical for any other wire type."""
    pos = 0
    out = []
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wt = tag >> 3, tag & 7
        if wt == VARINT:
            value, pos = _varint(data, pos)
        elif wt == LEN:
            n, pos = _varint(data, pos)
            if pos + n > len(data):
                raise NotCanonical(f"field {number} runs past the end")
            value, pos = bytes(data[pos:pos + n]), pos + n
        else:
            raise NotCanonical(f"field {number} has wire type {wt}")
        out.append((number, wt, value))
    return out


def check(data, schema=STREAM_MESSAGE, where="StreamMessage"):
    """Raise NotCanonical unless ``data`` is canonical for ``schema``; return its fields
    as {name: value} (lists for repeated fields; nested messages as dicts)."""
    seen = {}
    last = 0
    for number, wt, value in fields(data):
        if number not in schema:
            raise NotCanonical(f"{where}: unknown field {number}")
        name, want_wt, nested, repeated = schema[number]
        if wt != want_wt:
            raise NotCanonical(f"{where}.{name}: wire type {wt}, expected {want_wt}")
        if number < last:
            raise NotCanonical(f"{where}.{name} (field {number}) after field {last}")
        if number == last and not repeated:
            raise NotCanonical(f"{where}.{name} (field {number}) occurs more than once")
        last = number
        if nested is not None:
            value = check(value, nested, f"{where}.{name}")
        if repeated:
            seen.setdefault(name, []).append(value)
        else:
            seen[name] = value
    return seen


def check_delivered(messages):
    """``check`` every message; return their decoded fields."""
    return [check(m) for m in messages]


def encode_varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_field(number, value):
    """One field, for building test input by hand: an int as a varint, bytes as LEN."""
    if isinstance(value, int):
        return encode_varint(number << 3) + encode_varint(value)
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value
