"""Request messages that do not parse: INVALID_ARGUMENT with what is wrong and where.

The protobuf runtime only says "Error parsing message" when a request does not decode. A
client (a raw one: protobuf libraries never produce invalid UTF-8 in a string) is better
served by the field at fault, so the request's wire format is walked along its descriptor to
find it: invalid UTF-8 in a string field, a length running past the end, a truncated varint,
a wire type that does not exist, nesting deeper than the runtime allows.
"""

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from danube.rpc.status import RpcError, StatusCode

# upb's default recursion limit: a request nested deeper does not parse.
MAX_DEPTH = 100


class _Malformed(Exception):
    pass


def _varint(data, pos, what):
    value = shift = 0
    while True:
        if pos >= len(data):
            raise _Malformed(f"truncated varint in {what}")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _Malformed(f"varint longer than 10 bytes in {what}")


def _walk(descriptor, data, prefix, depth, group=None):
    """Walk a message's fields; returns the position after it (after the end-group tag of
    `group`, the field number of the group being walked, if any)."""
    if depth > MAX_DEPTH:
        raise _Malformed(f"{prefix.rstrip('.') or 'message'} nested more than {MAX_DEPTH} deep")
    pos, n = 0, len(data)
    while pos < n:
        key, pos = _varint(data, pos, f"a field tag of {prefix.rstrip('.') or 'the message'}")
        number, wire = key >> 3, key & 7
        field = descriptor.fields_by_number.get(number) if descriptor is not None else None
        name = prefix + (field.name if field is not None else f"#{number}")
        if number == 0:
            raise _Malformed(f"field number 0 in {prefix.rstrip('.') or 'the message'}")
        if wire == 0:
            _, pos = _varint(data, pos, f"field {name}")
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            if pos > n:
                raise _Malformed(f"field {name} is cut short")
        elif wire == 2:
            length, pos = _varint(data, pos, f"the length of field {name}")
            end = pos + length
            if end > n:
                raise _Malformed(f"field {name}: length {length} runs past the end of the "
                                 f"message")
            _check_value(field, data[pos:end], name, depth)
            pos = end
        elif wire == 3:
            pos += _walk(None, memoryview(data)[pos:], name + ".", depth + 1, number)
        elif wire == 4:
            if group != number:
                raise _Malformed(f"unmatched end-group tag for field {name}")
            return pos
        else:
            raise _Malformed(f"field {name} has invalid wire type {wire}")
    if group is not None:
        raise _Malformed(f"group field {prefix.rstrip('.')} is not closed")
    return pos


def _check_value(field, value, name, depth):
    if field is None:
        return
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Malformed(f"field {name} is not valid UTF-8 (byte {exc.start} of its "
                             f"value)") from None
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        _walk(field.message_type, value, name + ".", depth + 1)


def explain(descriptor, data) -> str:
    """What is wrong with `data` as a `descriptor` message, as precisely as can be told."""
    try:
        _walk(descriptor, data, "", 1)
    except _Malformed as exc:
        return f"invalid {descriptor.name}: {exc}"
    return f"invalid {descriptor.name}: the request does not parse as one"


def request_parser(message_cls):
    """`message_cls.FromString`, refusing what does not parse with INVALID_ARGUMENT that
    names the problem."""
    from_string = message_cls.FromString
    descriptor = message_cls.DESCRIPTOR

    def parse(data):
        try:
            return from_string(data)
        except DecodeError:
            raise RpcError(StatusCode.INVALID_ARGUMENT, explain(descriptor, data)) from None

    return parse
