# cython: language_level=3
# Delivered messages decoded straight from the wire. A consumer draining a reliable topic
# spends most of its time per message, and protobuf's Python objects cost more there than
# everything else in the client (a wrapper per message and per msg_id, built again on each
# access). Here a DeliveryBatch (or one StreamMessage) becomes a list of Message objects
# in one C loop; the strings every message repeats (topic, broker, producer, subscription)
# are decoded once per batch.
#
# The decode follows protobuf's rules for these two messages: fields in any order, the last
# value of a repeated scalar wins, a repeated msg_id is merged, unknown fields (and known
# ones with another wire type) are skipped, strings must be UTF-8.

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp

from danube.codec.protowire cimport _read_field, _WT_VARINT, _WT_LEN
from danube.codec.streammsg cimport *

_OPTIONAL = ("schema_id", "schema_version", "routing_key")
_FIELDS = ("request_id", "msg_id", "payload", "publish_time", "producer_name",
           "subscription_name", "attributes", "schema_id", "schema_version", "routing_key")
_ID_FIELDS = ("producer_id", "topic_name", "broker_addr", "topic_offset")


cdef class MsgId:
    """A delivered message's id, with danube.MsgID's fields."""
    cdef public unsigned long long producer_id
    cdef public str topic_name
    cdef public str broker_addr
    cdef public unsigned long long topic_offset

    def __init__(self, producer_id=0, topic_name="", broker_addr="", topic_offset=0):
        self.producer_id = producer_id
        self.topic_name = topic_name
        self.broker_addr = broker_addr
        self.topic_offset = topic_offset

    def to_proto(self):
        """This id as a danube.MsgID protobuf message."""
        from danube.proto import DanubeApi_pb2 as pb
        return pb.MsgID(producer_id=self.producer_id, topic_name=self.topic_name,
                        broker_addr=self.broker_addr, topic_offset=self.topic_offset)

    def _key(self):
        return (self.producer_id, self.topic_name, self.broker_addr, self.topic_offset)

    def __eq__(self, other):
        if isinstance(other, MsgId):
            return self._key() == (<MsgId>other)._key()
        if hasattr(other, "topic_offset") and hasattr(other, "producer_id"):
            return self._key() == (other.producer_id, other.topic_name, other.broker_addr,
                                   other.topic_offset)
        return NotImplemented

    def __hash__(self):
        return hash(self._key())

    def __reduce__(self):
        return (MsgId, self._key())

    def __repr__(self):
        return (f"MsgId(producer_id={self.producer_id}, topic_name={self.topic_name!r}, "
                f"broker_addr={self.broker_addr!r}, topic_offset={self.topic_offset})")


cdef class Message:
    """A delivered message, with danube.StreamMessage's fields: request_id, msg_id,
    payload, publish_time, producer_name, subscription_name, attributes (a dict),
    schema_id, schema_version, routing_key (None when absent; ``HasField`` as protobuf's).
    ``to_proto()`` gives the protobuf message."""
    cdef public unsigned long long request_id
    cdef MsgId _msg_id
    cdef public bytes payload
    cdef public unsigned long long publish_time
    cdef public str producer_name
    cdef public str subscription_name
    cdef dict _attributes
    cdef bint _has_id               # protobuf's presence of msg_id
    cdef public object schema_id
    cdef public object schema_version
    cdef public object routing_key

    def __init__(self, request_id=0, msg_id=None, payload=b"", publish_time=0,
                 producer_name="", subscription_name="", attributes=None, schema_id=None,
                 schema_version=None, routing_key=None):
        self.request_id = request_id
        self._has_id = msg_id is not None
        self._msg_id = msg_id if msg_id is not None else MsgId()
        self.payload = bytes(payload)
        self.publish_time = publish_time
        self.producer_name = producer_name
        self.subscription_name = subscription_name
        self._attributes = dict(attributes) if attributes else None
        self.schema_id = schema_id
        self.schema_version = schema_version
        self.routing_key = routing_key

    @property
    def msg_id(self):
        return self._msg_id

    @msg_id.setter
    def msg_id(self, MsgId value not None):
        self._msg_id = value
        self._has_id = True

    @property
    def attributes(self):
        # Most messages have none: the dict is made on first use, not per delivery.
        if self._attributes is None:
            self._attributes = {}
        return self._attributes

    @attributes.setter
    def attributes(self, value):
        self._attributes = dict(value)

    def HasField(self, name):
        """As protobuf's: for msg_id and the optional fields."""
        if name in _OPTIONAL:
            return getattr(self, name) is not None
        if name == "msg_id":
            return self._has_id
        if name in _FIELDS:
            raise ValueError(f'Field danube.StreamMessage.{name} does not have presence.')
        raise ValueError(f'Protocol message StreamMessage has no "{name}" field.')

    def to_proto(self):
        """This message as a danube.StreamMessage protobuf message."""
        from danube.proto import DanubeApi_pb2 as pb
        m = pb.StreamMessage(request_id=self.request_id, payload=self.payload,
                             publish_time=self.publish_time,
                             producer_name=self.producer_name,
                             subscription_name=self.subscription_name,
                             attributes=self._attributes or {})
        if self._has_id:
            m.msg_id.CopyFrom(self._msg_id.to_proto())
        if self.schema_id is not None:
            m.schema_id = self.schema_id
        if self.schema_version is not None:
            m.schema_version = self.schema_version
        if self.routing_key is not None:
            m.routing_key = self.routing_key
        return m

    def SerializeToString(self):
        return self.to_proto().SerializeToString()

    def _key(self):
        return (self.request_id, self._msg_id if self._has_id else None, self.payload,
                self.publish_time,
                self.producer_name, self.subscription_name, self._attributes or {},
                self.schema_id, self.schema_version, self.routing_key)

    def __eq__(self, other):
        if isinstance(other, Message):
            return self._key() == (<Message>other)._key()
        if hasattr(other, "SerializeToString") and hasattr(other, "payload"):
            return self.to_proto() == other
        return NotImplemented

    __hash__ = None

    def __reduce__(self):
        return (decode_stream_message, (self.SerializeToString(),))

    def __repr__(self):
        extra = "".join(f", {name}={getattr(self, name)!r}" for name in _OPTIONAL
                        if getattr(self, name) is not None)
        return (f"Message(msg_id={self.msg_id!r}, payload={self.payload!r}, "
                f"request_id={self.request_id}, publish_time={self.publish_time}, "
                f"producer_name={self.producer_name!r}, "
                f"subscription_name={self.subscription_name!r}, "
                f"attributes={self._attributes or {}!r}{extra})")


cdef class _Strings:
    # The last raw bytes and decoded str of each repeated string field, so a batch of one
    # producer's messages decodes its names once.
    cdef list raw
    cdef list text

    def __cinit__(self):
        self.raw = [None, None, None, None]
        self.text = [None, None, None, None]

    cdef str get(self, int slot, const uint8_t *p, Py_ssize_t start, Py_ssize_t n,
                 str what):
        cdef bytes raw = <bytes>self.raw[slot]
        if raw is not None and len(raw) == n and memcmp(<const char *>raw, p + start, n) == 0:
            return <str>self.text[slot]
        text = _utf8(p, start, n, what)
        self.raw[slot] = PyBytes_FromStringAndSize(<const char *>p + start, n)
        self.text[slot] = text
        return text


cdef str _utf8(const uint8_t *p, Py_ssize_t start, Py_ssize_t n, str what):
    try:
        return PyUnicode_DecodeUTF8(<const char *>p + start, n, NULL)
    except UnicodeDecodeError:
        raise ValueError(f"invalid UTF-8 in {what}") from None


cdef inline _malformed(str what, Py_ssize_t at):
    raise ValueError(f"malformed {what} at byte {at}")


cdef void _decode_id(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end, MsgId mid,
                     _Strings strings) except *:
    cdef uint64_t field, value
    cdef int wt
    cdef Py_ssize_t vstart = 0, at
    while pos < end:
        at = pos
        if not _read_field(p, end, &pos, &field, &wt, &value, &vstart):
            _malformed("MsgID", at)
        if wt == _WT_VARINT:
            if field == MID_PRODUCER_ID:
                mid.producer_id = value
            elif field == MID_TOPIC_OFFSET:
                mid.topic_offset = value
        elif wt == _WT_LEN:
            if field == MID_TOPIC_NAME:
                mid.topic_name = strings.get(0, p, vstart, <Py_ssize_t>value,
                                             "MsgID.topic_name")
            elif field == MID_BROKER_ADDR:
                mid.broker_addr = strings.get(1, p, vstart, <Py_ssize_t>value,
                                              "MsgID.broker_addr")


cdef void _decode_attribute(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                            dict attributes) except *:
    cdef uint64_t field, value
    cdef int wt
    cdef Py_ssize_t vstart = 0, at
    key, val = "", ""
    while pos < end:
        at = pos
        if not _read_field(p, end, &pos, &field, &wt, &value, &vstart):
            _malformed("attributes entry", at)
        if wt == _WT_LEN:
            if field == ENTRY_KEY:
                key = _utf8(p, vstart, <Py_ssize_t>value, "StreamMessage.attributes key")
            elif field == ENTRY_VALUE:
                val = _utf8(p, vstart, <Py_ssize_t>value, "StreamMessage.attributes value")
    attributes[key] = val


cdef Message _decode_message(const uint8_t *p, Py_ssize_t pos, Py_ssize_t end,
                             _Strings strings):
    cdef Message m = Message.__new__(Message)
    cdef MsgId mid = MsgId.__new__(MsgId)
    cdef uint64_t field, value
    cdef int wt
    cdef Py_ssize_t vstart = 0, at
    mid.topic_name = mid.broker_addr = ""
    m._msg_id = mid
    m.payload = b""
    m.producer_name = m.subscription_name = ""
    while pos < end:
        at = pos
        if not _read_field(p, end, &pos, &field, &wt, &value, &vstart):
            _malformed("StreamMessage", at)
        if wt == _WT_VARINT:
            if field == SM_REQUEST_ID:
                m.request_id = value
            elif field == SM_PUBLISH_TIME:
                m.publish_time = value
            elif field == SM_SCHEMA_ID:
                m.schema_id = value
            elif field == SM_SCHEMA_VERSION:
                m.schema_version = <uint32_t>value
        elif wt == _WT_LEN:
            if field == SM_PAYLOAD:
                m.payload = PyBytes_FromStringAndSize(<const char *>p + vstart,
                                                      <Py_ssize_t>value)
            elif field == SM_MSG_ID:
                m._has_id = True
                _decode_id(p, vstart, vstart + <Py_ssize_t>value, mid, strings)
            elif field == SM_PRODUCER_NAME:
                m.producer_name = strings.get(2, p, vstart, <Py_ssize_t>value,
                                              "StreamMessage.producer_name")
            elif field == SM_SUBSCRIPTION_NAME:
                m.subscription_name = strings.get(3, p, vstart, <Py_ssize_t>value,
                                                  "StreamMessage.subscription_name")
            elif field == SM_ATTRIBUTES:
                if m._attributes is None:
                    m._attributes = {}
                _decode_attribute(p, vstart, vstart + <Py_ssize_t>value, m._attributes)
            elif field == SM_ROUTING_KEY:
                m.routing_key = _utf8(p, vstart, <Py_ssize_t>value,
                                      "StreamMessage.routing_key")
    return m


def decode_delivery_batch(const uint8_t[::1] data):
    """A serialized danube_ext.DeliveryBatch as a list of Message; ValueError if it is
    malformed."""
    cdef const uint8_t *p = &data[0] if data.shape[0] else NULL
    cdef Py_ssize_t pos = 0, end = data.shape[0], vstart = 0, at
    cdef uint64_t field, value
    cdef int wt
    cdef _Strings strings = _Strings()
    cdef list out = []
    while pos < end:
        at = pos
        if not _read_field(p, end, &pos, &field, &wt, &value, &vstart):
            _malformed("DeliveryBatch", at)
        if field == 1 and wt == _WT_LEN:
            out.append(_decode_message(p, vstart, vstart + <Py_ssize_t>value, strings))
    return out


def decode_stream_message(const uint8_t[::1] data):
    """A serialized danube.StreamMessage as a Message; ValueError if it is malformed."""
    cdef const uint8_t *p = &data[0] if data.shape[0] else NULL
    return _decode_message(p, 0, data.shape[0], _Strings())


def ack_ranges(list messages):
    """The offsets of ``messages`` (any order, repeats allowed) as AckRanges' flat
    (first, last) pairs."""
    cdef Py_ssize_t i, n = len(messages)
    cdef unsigned long long o, first, last
    cdef list offsets
    cdef list ranges = []
    if n == 0:
        return ranges
    # The usual case, offsets delivered in order, is one pass with no sort; the first
    # offset out of order sends the whole list to the sorted pass below.
    first = last = (<Message?>messages[0])._msg_id.topic_offset
    for i in range(1, n):
        o = (<Message?>messages[i])._msg_id.topic_offset
        if o <= last:
            break
        if o != last + 1:
            ranges += (first, last)
            first = o
        last = o
    else:
        ranges += (first, last)
        return ranges
    ranges = []
    offsets = sorted([(<Message?>m)._msg_id.topic_offset for m in messages])
    first = last = offsets[0]
    for i in range(1, n):
        o = offsets[i]
        if o <= last + 1:
            if o > last:
                last = o
            continue
        ranges += (first, last)
        first = last = o
    ranges += (first, last)
    return ranges
