"""The client's side of MQTT 3.1.1 and 5.0, sans I/O: ``encode_*`` build what a client
sends (CONNECT, SUBSCRIBE, the acks, PINGREQ, DISCONNECT) and ``ClientDecoder.feed(bytes)``
returns what the bytes complete of what a server sends (CONNACK, SUBACK, PUBLISH, PUBREL,
PINGRESP, DISCONNECT).

PUBLISH is what a subscriber reads by the thousand: it comes out as a plain tuple
``(topic, payload, qos, packet_id, dup, retain)``, read in one pass over the received bytes
with no object per packet besides the tuple, its topic (interned per topic name) and its
payload. Anything else is a ``Packet``. A packet that breaks the protocol raises
``ProtocolError`` with the MQTT 5 reason code the client disconnects with."""

import struct

from danube.mqtt.codec import (CONNACK, DISCONNECT, MALFORMED, PACKET_TOO_LARGE, PINGRESP,
                               PROTOCOL_ERROR, PUBLISH, PUBREL, SUBACK, TOPIC_ALIAS,
                               TOPIC_ALIAS_INVALID, TOPIC_NAME_INVALID, ProtocolError,
                               _encode_string, _encode_varint, _packet_bytes, _properties,
                               _u16, encode_ack, encode_properties, remaining_length)

__all__ = ["ClientDecoder", "Connack", "Packet", "encode_connect", "encode_subscribe", "encode_ack",
           "encode_disconnect", "PINGREQ_BYTES", "filter_matches"]

PINGREQ_BYTES = b"\xc0\x00"

# Topic names decoded and checked, by their bytes: a subscriber sees few distinct topics
# many times. Cleared when it holds this many (a fleet of devices may publish on many).
TOPIC_CACHE = 10000


class Packet:
    """A packet from the server other than CONNACK and a PUBLISH: ``kind`` (its type
    number), ``packet_id``, ``reason`` and ``data``: SUBACK's return codes (bytes),
    DISCONNECT's properties, or for a PUBLISH over the limit passed over, (topic, size) with
    its QoS as ``reason``."""
    __slots__ = ("kind", "packet_id", "reason", "data")

    def __init__(self, kind, packet_id=None, reason=0, data=()):
        self.kind = kind
        self.packet_id = packet_id
        self.reason = reason
        self.data = data


class Connack:
    __slots__ = ("session_present", "reason", "properties")

    def __init__(self, session_present, reason, properties):
        self.session_present = session_present
        self.reason = reason
        self.properties = properties


# -- what the client sends ------------------------------------------------------------------

def encode_connect(level, client_id, *, clean, keep_alive, username=None, password=None,
                   properties=()):
    """CONNECT at ``level`` 4 (3.1.1) or 5; ``password`` is bytes or str. A 3.1.1 password
    needs a user name (spec 3.1.2.9): ValueError otherwise."""
    if level not in (4, 5):
        raise ValueError(f"MQTT protocol level {level} (4: 3.1.1, 5: 5.0)")
    if not 0 <= keep_alive <= 0xFFFF:
        raise ValueError(f"keep alive {keep_alive} s is not in 0..65535")
    if password is not None and username is None and level == 4:
        raise ValueError("MQTT 3.1.1 sends a password only with a user name")
    flags = (0x02 if clean else 0) | (0x80 if username is not None else 0) | \
        (0x40 if password is not None else 0)
    body = bytearray(_encode_string("MQTT"))
    body += bytes([level, flags]) + struct.pack(">H", keep_alive)
    if level == 5:
        body += encode_properties(properties)
    body += _encode_string(client_id)
    if username is not None:
        body += _encode_string(username)
    if password is not None:
        raw = password.encode("utf-8") if isinstance(password, str) else bytes(password)
        if len(raw) > 0xFFFF:
            raise ValueError("password longer than 65535 bytes")
        body += struct.pack(">H", len(raw)) + raw
    return _packet_bytes(0x10, bytes(body))


def encode_subscribe(packet_id, filters, level):
    """SUBSCRIBE ``filters`` [(topic filter, maximum QoS)]."""
    if not filters:
        raise ValueError("SUBSCRIBE needs at least one topic filter")
    body = bytearray(struct.pack(">H", packet_id))
    if level == 5:
        body += b"\x00"
    for topic_filter, qos in filters:
        if qos not in (0, 1, 2):
            raise ValueError(f"QoS {qos} for {topic_filter!r}")
        body += _encode_string(topic_filter) + bytes([qos])
    return _packet_bytes(0x82, bytes(body))


def encode_disconnect(level, reason=0):
    """DISCONNECT; MQTT 5 with ``reason`` (0: normal, the session is kept as agreed)."""
    if level == 5:
        return bytes([0xE0, 2, reason, 0])
    return b"\xe0\x00"


# -- what the server sends ------------------------------------------------------------------

class ClientDecoder:
    """Cuts the server's byte stream into packets. A packet larger than ``max_packet_size``
    raises ProtocolError(PACKET_TOO_LARGE) as soon as its fixed header is read, so the
    decoder never holds more than one packet's worth of bytes; the bytes of a packet that
    spans many reads are kept as a list and joined once, when they are all there."""

    def __init__(self, max_packet_size, level):
        self.max_packet_size = max_packet_size
        self.level = level
        self._rest = b""                # the start of an incomplete packet
        self._chunks = None             # a large packet's pieces while they come
        self._have = 0
        self._need = 0                  # bytes the incomplete packet needs in all
        self._topics = {}
        #: Of the packets the last feed returned: how many are not PUBLISH, and how many
        #: are PUBLISH at QoS 1 or 2 (so a caller of a stream of PUBLISH needs no pass of
        #: its own over them).
        self.controls = 0
        self.acked_publishes = 0
        #: A PUBLISH over max_packet_size comes out as ``Packet(PUBLISH, packet id, qos,
        #: (topic, size))`` and its bytes are passed over, instead of ProtocolError: MQTT
        #: 3.1.1 has no way to tell the server the limit, which would send it again on every
        #: connection.
        self.skip_oversized = False
        self._skip = 0

    def feed(self, data):
        """The packets ``data`` completes, in order."""
        self.controls = self.acked_publishes = 0
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return []
            data = data[self._skip:]
            self._skip = 0
        if self._chunks is not None:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            data = b"".join(self._chunks)
            self._chunks = None
        elif self._rest:
            data = self._rest + data
        self._rest = b""
        out = []
        append = out.append
        n = len(data)
        pos = 0
        limit = self.max_packet_size
        v5 = self.level == 5
        topics = self._topics
        while n - pos >= 2:
            first = data[pos]
            # Remaining Length: one byte inline (most packets), longer ones shared.
            length = data[pos + 1]
            i = pos + 2
            if length & 0x80:
                length, i = remaining_length(data, pos, n)
                if length < 0:
                    break
            end = i + length
            if end - pos > limit:
                if self.skip_oversized and first >> 4 == PUBLISH:
                    skipped = self._oversized(first, data, i, n, end - pos)
                    if skipped is None:
                        break                   # its variable header is not all here yet
                    append(skipped)
                    self.controls += 1
                    if end > n:
                        self._skip = end - n
                        return out
                    pos = end
                    continue
                raise ProtocolError(PACKET_TOO_LARGE,
                                    f"packet of {end - pos} bytes exceeds the maximum packet "
                                    f"size ({limit} bytes)")
            if end > n:
                if end - pos > 65536:
                    # A large packet: keep its pieces, join them once it is complete.
                    self._chunks = [data[pos:]]
                    self._have = n - pos
                    self._need = end - pos
                    return out
                break
            if first >> 4 == PUBLISH:
                # The hot path, inline: topic, packet id, properties, payload.
                qos = (first >> 1) & 0x03
                if length < 2:
                    raise ProtocolError(MALFORMED, "PUBLISH shorter than its topic length")
                t = i + 2 + ((data[i] << 8) | data[i + 1])
                if t > end:
                    raise ProtocolError(MALFORMED, "topic name runs past the packet")
                raw = data[i + 2:t]
                topic = topics.get(raw)
                if topic is None:
                    topic = self._topic(raw)
                if qos:
                    if qos == 3:
                        raise ProtocolError(MALFORMED, "PUBLISH with QoS 3")
                    if t + 2 > end:
                        raise ProtocolError(MALFORMED, "packet identifier runs past the packet")
                    packet_id = (data[t] << 8) | data[t + 1]
                    if not packet_id:
                        raise ProtocolError(PROTOCOL_ERROR, "PUBLISH with packet identifier 0")
                    t += 2
                    self.acked_publishes += 1
                else:
                    if first & 0x08:
                        raise ProtocolError(MALFORMED, "PUBLISH with DUP set at QoS 0")
                    packet_id = None
                if v5:
                    if t >= end:
                        raise ProtocolError(MALFORMED, "properties run past the packet")
                    if data[t]:
                        props, t = _properties(data, t, end)
                        for pid, _ in props:
                            if pid == TOPIC_ALIAS:
                                # We announce no Topic Alias Maximum: none may be used.
                                raise ProtocolError(TOPIC_ALIAS_INVALID,
                                                    "PUBLISH with a topic alias, which "
                                                    "this client did not allow")
                    else:
                        t += 1
                append((topic, data[t:end], qos, packet_id, bool(first & 0x08),
                        bool(first & 0x01)))
            else:
                append(self._packet(first, data, i, end, length))
                self.controls += 1
            pos = end
        if pos < n:
            self._rest = data[pos:]
        return out

    def _oversized(self, first, data, i, n, size):
        qos = (first >> 1) & 0x03
        if qos == 3:
            raise ProtocolError(MALFORMED, "PUBLISH with QoS 3")
        if n - i < 2:
            return None
        t = i + 2 + ((data[i] << 8) | data[i + 1])
        if t + (2 if qos else 0) > n:
            return None
        topic = self._topic(data[i + 2:t])
        packet_id = ((data[t] << 8) | data[t + 1]) if qos else None
        if qos and not packet_id:
            raise ProtocolError(PROTOCOL_ERROR, "PUBLISH with packet identifier 0")
        return Packet(PUBLISH, packet_id, qos, (topic, size))

    def _topic(self, raw):
        try:
            topic = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(MALFORMED, "topic name is not UTF-8") from None
        if not topic:
            raise ProtocolError(TOPIC_NAME_INVALID, "PUBLISH with an empty topic name")
        if "+" in topic or "#" in topic or "\x00" in topic:
            raise ProtocolError(TOPIC_NAME_INVALID,
                                f"topic name {topic[:64]!r} has a wildcard or U+0000")
        if len(self._topics) >= TOPIC_CACHE:
            self._topics.clear()
        self._topics[raw] = topic
        return topic

    def _packet(self, first, data, i, end, length):
        kind = first >> 4
        flags = first & 0x0F
        if flags != (2 if kind == PUBREL else 0):
            raise ProtocolError(MALFORMED, f"wrong fixed-header flags on packet type {kind}")
        v5 = self.level == 5
        if kind == CONNACK:
            if length < 2:
                raise ProtocolError(MALFORMED, "CONNACK shorter than 2 bytes")
            if data[i] & 0xFE:
                raise ProtocolError(MALFORMED, "CONNACK reserved flags are set")
            props = ()
            if v5:
                props, stop = _properties(data, i + 2, end)
            elif length != 2:
                raise ProtocolError(MALFORMED, "CONNACK longer than 2 bytes")
            return Connack(bool(data[i] & 1), data[i + 1], props)
        if kind == PUBREL:
            packet_id, pos = _u16(data, i, end, "packet identifier")
            return Packet(kind, packet_id, data[pos] if pos < end else 0)
        if kind == SUBACK:
            packet_id, pos = _u16(data, i, end, "packet identifier")
            if v5:
                _, pos = _properties(data, pos, end)
            if pos >= end:
                raise ProtocolError(PROTOCOL_ERROR, "SUBACK without a return code")
            return Packet(kind, packet_id, 0, bytes(data[pos:end]))
        if kind == PINGRESP:
            if length:
                raise ProtocolError(MALFORMED, "PINGRESP with a body")
            return Packet(kind)
        if kind == DISCONNECT:
            if not v5:
                raise ProtocolError(PROTOCOL_ERROR, "DISCONNECT from an MQTT 3.1.1 server")
            reason = data[i] if length else 0
            props = ()
            if length > 1:
                props, _ = _properties(data, i + 1, end)
            return Packet(kind, None, reason, props)
        # PUBACK, PUBREC, PUBCOMP answer a client's PUBLISH (this one publishes nothing);
        # CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ are a client's; UNSUBACK answers an
        # UNSUBSCRIBE it never sends; AUTH needs an authentication method it never sets.
        raise ProtocolError(PROTOCOL_ERROR,
                            f"packet type {kind} is not one the server may send this client")


def filter_matches(topic_filter, topic):
    """Whether MQTT ``topic`` matches ``topic_filter`` (spec 4.7): ``+`` one level, ``#``
    the rest (the parent level included); a topic starting with ``$`` is not matched by a
    filter starting with a wildcard."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f = topic_filter.split("/")
    t = topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)
