"""MQTT 3.1, 3.1.1 and 5.0 packets, sans I/O: ``Decoder.feed(bytes)`` returns the whole
packets the bytes complete, ``encode_*`` build the packets the server sends.

A packet that breaks the protocol raises ``ProtocolError`` carrying the MQTT 5 reason code
the server closes with (0x81 malformed, 0x82 protocol error, 0x95 packet too large, ...), so
the session can say why before it closes the connection. The decoder never holds more than
one packet's worth of bytes beyond ``max_packet_size``: a fixed header announcing more is
refused as soon as it is read."""

import struct

from danube.codec.mqtt import publish_run

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)

# MQTT 5 reason codes the server sends (spec 2.4).
SUCCESS = 0x00
UNSPECIFIED = 0x80
MALFORMED = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_ERROR = 0x83
UNSUPPORTED_VERSION = 0x84
CLIENT_ID_INVALID = 0x85
BAD_CREDENTIALS = 0x86
NOT_AUTHORIZED = 0x87
SERVER_BUSY = 0x89
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_NAME_INVALID = 0x90
PACKET_ID_IN_USE = 0x91
PACKET_ID_NOT_FOUND = 0x92
RECEIVE_MAX_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
QUOTA_EXCEEDED = 0x97
PAYLOAD_FORMAT_INVALID = 0x99
QOS_NOT_SUPPORTED = 0x9B
CONNECTION_RATE_EXCEEDED = 0x9F

# MQTT 3.1.1 CONNACK return codes for the same refusals.
V3_RETURN = {UNSUPPORTED_VERSION: 1, CLIENT_ID_INVALID: 2, SERVER_BUSY: 3,
             BAD_CREDENTIALS: 4, NOT_AUTHORIZED: 5, QUOTA_EXCEEDED: 3,
             CONNECTION_RATE_EXCEEDED: 3}

MAX_REMAINING = 268_435_455          # the largest Remaining Length (spec 1.5.5)


class ProtocolError(Exception):
    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


# -- properties (MQTT 5, spec 2.2.2.2) -------------------------------------------------------

_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)
_PROPERTY_TYPES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _STR, 0x08: _STR, 0x09: _BIN, 0x0B: _VARINT, 0x11: _U32,
    0x12: _STR, 0x13: _U16, 0x15: _STR, 0x16: _BIN, 0x17: _BYTE, 0x18: _U32, 0x19: _BYTE,
    0x1A: _STR, 0x1C: _STR, 0x1F: _STR, 0x21: _U16, 0x22: _U16, 0x23: _U16, 0x24: _BYTE,
    0x25: _BYTE, 0x26: _PAIR, 0x27: _U32, 0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}
CONTENT_TYPE, RESPONSE_TOPIC, USER_PROPERTY, TOPIC_ALIAS = 0x03, 0x08, 0x26, 0x23
RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, SESSION_EXPIRY = 0x21, 0x27, 0x11
ASSIGNED_CLIENT_ID, REASON_STRING, RETAIN_AVAILABLE = 0x12, 0x1F, 0x25
WILDCARD_SUB_AVAILABLE, SHARED_SUB_AVAILABLE, SUB_ID_AVAILABLE = 0x28, 0x2A, 0x29
TOPIC_ALIAS_MAXIMUM, AUTH_METHOD = 0x22, 0x15


def _read_varint(buf, pos, end, what):
    """The variable byte integer at ``buf[pos]``: (value, index after it), or (-1, index)
    when ``buf[:end]`` ends inside it; ProtocolError past its 4 bytes."""
    value = shift = 0
    for i in range(pos, pos + 4):
        if i >= end:
            return -1, i
        b = buf[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i + 1
        shift += 7
    raise ProtocolError(MALFORMED, f"{what} longer than 4 bytes")


def _varint(buf, pos, end):
    """A variable byte integer inside a packet, which must hold all of it."""
    value, pos = _read_varint(buf, pos, end, "variable byte integer")
    if value < 0:
        raise ProtocolError(MALFORMED, "variable byte integer runs past the packet")
    return value, pos


def remaining_length(buf, pos, n):
    """The Remaining Length of the packet whose fixed header starts at ``buf[pos]``:
    (length, index of the body), or (-1, _) when ``buf[:n]`` ends inside it; ProtocolError
    past its 4 bytes. Shared by the server's and the client's decoders."""
    return _read_varint(buf, pos + 1, n, "remaining length")


def _u16(buf, pos, end, what):
    if pos + 2 > end:
        raise ProtocolError(MALFORMED, f"{what} runs past the packet")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def _binary(buf, pos, end, what):
    n, pos = _u16(buf, pos, end, what)
    if pos + n > end:
        raise ProtocolError(MALFORMED, f"{what} runs past the packet")
    return bytes(buf[pos:pos + n]), pos + n


def _string(buf, pos, end, what):
    raw, pos = _binary(buf, pos, end, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(MALFORMED, f"{what} is not UTF-8") from None
    if "\x00" in text:
        raise ProtocolError(MALFORMED, f"{what} contains U+0000")
    return text, pos


def _properties(buf, pos, end):
    """(list of (id, value), position after them)."""
    length, pos = _varint(buf, pos, end)
    stop = pos + length
    if stop > end:
        raise ProtocolError(MALFORMED, "properties run past the packet")
    props = []
    while pos < stop:
        pid = buf[pos]
        pos += 1
        kind = _PROPERTY_TYPES.get(pid)
        if kind is None:
            raise ProtocolError(MALFORMED, f"unknown property identifier 0x{pid:02x}")
        if kind == _BYTE:
            if pos >= stop:
                raise ProtocolError(MALFORMED, "property runs past its properties")
            value = buf[pos]
            pos += 1
        elif kind == _U16:
            value, pos = _u16(buf, pos, stop, "property")
        elif kind == _U32:
            if pos + 4 > stop:
                raise ProtocolError(MALFORMED, "property runs past its properties")
            value = struct.unpack_from(">I", buf, pos)[0]
            pos += 4
        elif kind == _VARINT:
            value, pos = _varint(buf, pos, stop)
        elif kind == _STR:
            value, pos = _string(buf, pos, stop, "property")
        elif kind == _BIN:
            value, pos = _binary(buf, pos, stop, "property")
        else:
            k, pos = _string(buf, pos, stop, "user property name")
            v, pos = _string(buf, pos, stop, "user property value")
            value = (k, v)
        props.append((pid, value))
    return props, stop


def _encode_varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _encode_string(text):
    raw = text.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


def encode_properties(props):
    body = bytearray()
    for pid, value in props:
        kind = _PROPERTY_TYPES[pid]
        body.append(pid)
        if kind == _BYTE:
            body.append(value)
        elif kind == _U16:
            body += struct.pack(">H", value)
        elif kind == _U32:
            body += struct.pack(">I", value)
        elif kind == _VARINT:
            body += _encode_varint(value)
        elif kind == _STR:
            body += _encode_string(value)
        elif kind == _BIN:
            body += struct.pack(">H", len(value)) + value
        else:
            body += _encode_string(value[0]) + _encode_string(value[1])
    return _encode_varint(len(body)) + bytes(body)


# -- packets --------------------------------------------------------------------------------

class Connect:
    __slots__ = ("level", "client_id", "clean", "keep_alive", "username", "password",
                 "will", "properties")

    def __repr__(self):
        return f"Connect(level={self.level}, client_id={self.client_id!r})"


class Publish:
    """PUBLISH: ``topic`` (str), ``payload`` (bytes), ``qos``, ``packet_id`` (None at QoS 0),
    ``dup``, ``retain`` and MQTT 5 ``properties``."""
    __slots__ = ("topic", "payload", "qos", "packet_id", "dup", "retain", "properties")

    def __init__(self, topic, payload, qos, packet_id, dup, retain, properties):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.packet_id = packet_id
        self.dup = dup
        self.retain = retain
        self.properties = properties


class Run:
    """Consecutive PUBLISH packets to one topic at QoS 0/1 without properties, as received
    (``raw``): danube.codec.mqtt.encode_run turns them into StreamMessages in one call."""
    __slots__ = ("topic", "raw", "count", "qos1")

    def __init__(self, topic, raw, count, qos1):
        self.topic = topic
        self.raw = raw
        self.count = count
        self.qos1 = qos1


class Packet:
    """Any other packet: ``kind`` (the type number), ``packet_id``, ``reason``,
    ``filters`` (SUBSCRIBE/UNSUBSCRIBE)."""
    __slots__ = ("kind", "packet_id", "reason", "filters")

    def __init__(self, kind, packet_id=None, reason=SUCCESS, filters=()):
        self.kind = kind
        self.packet_id = packet_id
        self.reason = reason
        self.filters = filters


_PROTOCOLS = {("MQTT", 4): 4, ("MQTT", 5): 5, ("MQIsdp", 3): 3}


def parse_connect(buf, end):
    """CONNECT's variable header and payload. Raises ProtocolError with
    UNSUPPORTED_VERSION for a protocol the server does not speak."""
    pos = 0
    name, pos = _string(buf, pos, end, "protocol name")
    if pos >= end:
        raise ProtocolError(MALFORMED, "CONNECT ends after the protocol name")
    level = buf[pos]
    pos += 1
    if (name, level) not in _PROTOCOLS:
        raise ProtocolError(UNSUPPORTED_VERSION,
                            f"unsupported protocol {name!r} level {level}")
    if pos + 3 > end:
        raise ProtocolError(MALFORMED, "CONNECT variable header is short")
    flags = buf[pos]
    keep_alive = (buf[pos + 1] << 8) | buf[pos + 2]
    pos += 3
    if flags & 0x01:
        raise ProtocolError(MALFORMED, "CONNECT reserved flag is set")
    c = Connect()
    c.level = level
    c.clean = bool(flags & 0x02)
    c.keep_alive = keep_alive
    c.properties = []
    if level == 5:
        c.properties, pos = _properties(buf, pos, end)
    c.client_id, pos = _string(buf, pos, end, "client identifier")
    c.will = None
    will_qos = (flags >> 3) & 0x03
    if flags & 0x04:
        if will_qos == 3:
            raise ProtocolError(MALFORMED, "will QoS 3")
        will_props = []
        if level == 5:
            will_props, pos = _properties(buf, pos, end)
        topic, pos = _string(buf, pos, end, "will topic")
        payload, pos = _binary(buf, pos, end, "will message")
        c.will = (topic, payload, will_qos, bool(flags & 0x20), will_props)
    elif will_qos or flags & 0x20:
        raise ProtocolError(MALFORMED, "will QoS or retain set without the will flag")
    c.username = c.password = None
    if flags & 0x80:
        c.username, pos = _string(buf, pos, end, "user name")
    if flags & 0x40:
        if level != 5 and not flags & 0x80:
            raise ProtocolError(MALFORMED, "password without user name")
        c.password, pos = _binary(buf, pos, end, "password")
    if pos != end:
        raise ProtocolError(MALFORMED, "bytes left after CONNECT's payload")
    return c


class Decoder:
    """Cuts a byte stream into packets. ``level`` (the CONNECT's, once one is read) says
    whether MQTT 5 properties are present."""

    def __init__(self, max_packet_size, max_topic_length):
        self.max_packet_size = max_packet_size
        self.max_topic_length = max_topic_length
        self.level = 4
        self._buf = bytearray()
        # Runs of plain PUBLISH packets come out as one Run (danube.codec.mqtt).
        self.runs = True

    def _run(self, buf, pos, n, limit):
        found = publish_run(buf, pos, n, limit, self.level == 5)
        if found is None:
            return None
        count, end, topic, qos1 = found
        if not topic or len(topic) > self.max_topic_length:
            return None                     # the general path says why
        try:
            name = topic.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "+" in name or "#" in name or "\x00" in name:
            return None
        return Run(name, bytes(buf[pos:end]), count, qos1)

    def feed(self, data):
        """The packets ``data`` completes: Connect, Publish or Packet objects (the raw
        CONNECT body is parsed by parse_connect when ``level`` is still unknown)."""
        buf = self._buf
        buf += data
        out = []
        pos = 0
        n = len(buf)
        limit = self.max_packet_size
        runs = self.runs
        while n - pos >= 2:
            first = buf[pos]
            if runs and first >> 4 == PUBLISH:
                run = self._run(buf, pos, n, limit)
                if run is not None:
                    out.append(run)
                    pos += len(run.raw)
                    continue
            length, i = remaining_length(buf, pos, n)
            if length < 0:
                break
            if i - pos + length > limit:
                raise ProtocolError(PACKET_TOO_LARGE,
                                    f"packet of {i - pos + length} bytes exceeds the maximum "
                                    f"packet size ({limit} bytes)")
            end = i + length
            if end > n:
                break
            out.append(self._packet(first, memoryview(buf)[i:end], length))
            pos = end
        if pos:
            del buf[:pos]
        return out

    def _packet(self, first, body, length):
        kind = first >> 4
        flags = first & 0x0F
        if kind == PUBLISH:
            return self._publish(flags, body, length)
        if kind == CONNECT:
            if flags:
                raise ProtocolError(MALFORMED, "CONNECT flags must be 0")
            connect = parse_connect(body, length)
            # Packets after it in the same bytes are read at its protocol level.
            self.level = connect.level
            return connect
        if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            if flags != (2 if kind == PUBREL else 0):
                raise ProtocolError(MALFORMED, f"wrong fixed-header flags on packet type {kind}")
            packet_id, pos = _u16(body, 0, length, "packet identifier")
            reason = body[pos] if length > 2 else SUCCESS
            return Packet(kind, packet_id, reason)
        if kind in (SUBSCRIBE, UNSUBSCRIBE):
            if flags != 2:
                raise ProtocolError(MALFORMED, f"wrong fixed-header flags on packet type {kind}")
            return self._subscribe(kind, body, length)
        if kind in (PINGREQ, DISCONNECT, AUTH):
            if flags:
                raise ProtocolError(MALFORMED, f"wrong fixed-header flags on packet type {kind}")
            if kind == PINGREQ and length:
                raise ProtocolError(MALFORMED, "PINGREQ with a body")
            reason = body[0] if length and kind != PINGREQ else SUCCESS
            return Packet(kind, None, reason)
        # CONNACK, SUBACK, UNSUBACK, PINGRESP: server-to-client only; 0: reserved.
        raise ProtocolError(PROTOCOL_ERROR, f"packet type {kind} is not sent by a client")

    def _publish(self, flags, body, length):
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise ProtocolError(MALFORMED, "PUBLISH with QoS 3")
        dup = bool(flags & 0x08)
        if dup and qos == 0:
            raise ProtocolError(MALFORMED, "PUBLISH with DUP set at QoS 0")
        tlen, pos = _u16(body, 0, length, "topic name")
        if tlen > self.max_topic_length:
            raise ProtocolError(TOPIC_NAME_INVALID,
                                f"topic name of {tlen} bytes exceeds the maximum "
                                f"({self.max_topic_length} bytes)")
        topic, pos = _string(body, 0, length, "topic name")
        if "+" in topic or "#" in topic:
            raise ProtocolError(TOPIC_NAME_INVALID, f"topic name {topic[:64]!r} has a wildcard")
        packet_id = None
        if qos:
            packet_id, pos = _u16(body, pos, length, "packet identifier")
            if packet_id == 0:
                raise ProtocolError(PROTOCOL_ERROR, "PUBLISH with packet identifier 0")
        props = ()
        if self.level == 5:
            props, pos = _properties(body, pos, length)
        if not topic and not any(pid == TOPIC_ALIAS for pid, _ in props):
            # 3.1.1 [MQTT-4.7.3-1]: a topic name has at least one character; 5.0 (3.3.2.1):
            # an empty one is a Protocol Error unless a Topic Alias stands for it.
            raise ProtocolError(PROTOCOL_ERROR, "PUBLISH with an empty topic name")
        return Publish(topic, bytes(body[pos:length]), qos, packet_id, dup,
                       bool(flags & 0x01), props)

    def _subscribe(self, kind, body, length):
        packet_id, pos = _u16(body, 0, length, "packet identifier")
        if self.level == 5:
            _, pos = _properties(body, pos, length)
        filters = []
        while pos < length:
            topic, pos = _string(body, pos, length, "topic filter")
            if kind == SUBSCRIBE:
                if pos >= length:
                    raise ProtocolError(MALFORMED, "subscription options missing")
                pos += 1
            filters.append(topic)
        if not filters:
            raise ProtocolError(PROTOCOL_ERROR, "SUBSCRIBE or UNSUBSCRIBE with no topic filter")
        return Packet(kind, packet_id, SUCCESS, filters)


# -- what the server sends -------------------------------------------------------------------

def _packet_bytes(first, body):
    return bytes([first]) + _encode_varint(len(body)) + body


def encode_connack(level, session_present, reason, properties=()):
    if level == 5:
        return _packet_bytes(0x20, bytes([int(session_present), reason])
                             + encode_properties(properties))
    return _packet_bytes(0x20, bytes([int(session_present), V3_RETURN.get(reason, reason)
                                      if reason else 0]))


def encode_ack(kind, packet_id, level=4, reason=SUCCESS):
    """PUBACK, PUBREC, PUBREL or PUBCOMP; the MQTT 5 reason code only when not success."""
    first = (kind << 4) | (2 if kind == PUBREL else 0)
    if level == 5 and reason != SUCCESS:
        return bytes([first, 3, packet_id >> 8, packet_id & 0xFF, reason])
    return bytes([first, 2, packet_id >> 8, packet_id & 0xFF])


def encode_suback(packet_id, codes, level=4):
    body = struct.pack(">H", packet_id)
    if level == 5:
        body += b"\x00"
    return _packet_bytes(0x90, body + bytes(codes))


def encode_unsuback(packet_id, count, level=4, reason=0x11):
    body = struct.pack(">H", packet_id)
    if level == 5:
        body += b"\x00" + bytes([reason]) * count
    return _packet_bytes(0xB0, body)


PINGRESP_BYTES = b"\xd0\x00"


def encode_disconnect(reason, text=None):
    """MQTT 5 only (3.1.1 has no server DISCONNECT: the server just closes)."""
    props = [(REASON_STRING, text[:200])] if text else []
    return _packet_bytes(0xE0, bytes([reason]) + encode_properties(props))
