# cython: language_level=3
# Non-reliable dispatch fan-out: one published message to every subscription of a topic, each
# subscription choosing its consumer(s) by type. Runs once per message per subscription, so
# the selection and the gRPC framing into each consumer's outbox are C loops; Python only sees
# an outbox when it goes from empty to non-empty (once per event-loop turn per consumer).

from bisect import bisect_left
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

from danube.broker._canon cimport _Decoded, _Id, _decode, _canon_size, _canon_write
from danube.codec.grpcframe cimport _put_prefix
from danube.codec.protowire cimport _put_varint, _varint_size, _read_field
from danube.codec.streammsg cimport SM_PAYLOAD


cdef inline Py_ssize_t _payload_size(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    # The payload's length in a canonical StreamMessage (fields in number order: at most
    # request_id and msg_id come before it); 0 when it is absent.
    cdef Py_ssize_t pos = 0, vstart = 0
    cdef uint64_t field, value
    cdef int wt
    while pos < n:
        if not _read_field(p, n, &pos, &field, &wt, &value, &vstart) or field > SM_PAYLOAD:
            return 0
        if field == SM_PAYLOAD:
            return <Py_ssize_t>value
    return 0


cdef inline Py_ssize_t _decoded_payload_size(const uint8_t *p, _Decoded *d) noexcept nogil:
    # The payload's length in a message _decode indexed (its last occurrence, as protobuf
    # reads it); 0 when it is absent.
    cdef Py_ssize_t pos = d.start[SM_PAYLOAD], vstart = 0
    cdef uint64_t field, value
    cdef int wt
    if pos < 0 or not _read_field(p, d.end[SM_PAYLOAD], &pos, &field, &wt, &value, &vstart):
        return 0
    return <Py_ssize_t>value


cdef inline uint32_t _fnv1a32(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t h = 2166136261u
    cdef Py_ssize_t i
    for i in range(n):
        h ^= p[i]
        h *= 16777619u
    return h


cdef inline uint32_t _fmix32(uint32_t h) noexcept nogil:
    # murmur3's finaliser: FNV-1a alone barely moves the high bits when only the last byte
    # differs ("key-1", "key-2"), which would put such keys next to each other on the ring.
    h ^= h >> 16
    h *= 0x85ebca6bu
    h ^= h >> 13
    h *= 0xc2b2ae35u
    h ^= h >> 16
    return h


def ring_hash(data):
    """Position of a routing key or virtual node on the KeyShared ring: 32-bit FNV-1a (as
    upstream) with an avalanche finaliser so that similar keys spread over the ring."""
    cdef const uint8_t[::1] v = data.encode() if isinstance(data, str) else data
    return _fmix32(_fnv1a32(&v[0] if v.shape[0] else NULL, v.shape[0]))


def fnv1a32(data):
    """32-bit FNV-1a, the hash of KeyShared routing keys (as upstream)."""
    cdef const uint8_t[::1] v = data.encode() if isinstance(data, str) else data
    return _fnv1a32(&v[0] if v.shape[0] else NULL, v.shape[0])


# A batched outbox (danube_ext.BatchConsumer/ReceiveBatches) frames its messages as
# DeliveryBatch messages: each StreamMessage is a `messages` entry (tag, length, bytes), and a
# batch is closed, its gRPC length prefix written, at BATCH_BYTES or when the outbox is taken.
cdef enum:
    BATCH_BYTES = 256 * 1024
    MESSAGES_TAG = 0x0A             # DeliveryBatch.messages: field 1, length-delimited


cdef class Outbox:
    """Framed messages waiting for one consumer's stream, bounded by `limit` bytes.

    `on_ready` (a callable) is called when the outbox goes from empty to non-empty, which is
    the owner's cue to schedule one flush. `offer` refuses a message that would take the
    outbox past its limit: for a non-reliable subscription that message is dropped (or, on
    Shared, offered to the next consumer).

    Plain, each message is one gRPC message (a StreamMessage of ReceiveMessages); batched,
    messages are packed into DeliveryBatch messages (see set_batched)."""

    def __cinit__(self, Py_ssize_t limit=4 * 1024 * 1024, on_ready=None):
        self._buf = bytearray()
        self.limit = limit
        self.count = 0
        self.on_ready = on_ready
        self.enabled = True
        self.delivered = self.delivered_bytes = self.dropped = 0
        self.batched = False
        self._open = -1

    @property
    def buffered(self):
        return len(self._buf)

    def set_batched(self, bint batched):
        """Frame from now on for ReceiveBatches (True) or ReceiveMessages (False). Messages
        already waiting (a non-reliable consumer's, kept for its next stream) are framed
        again the new way."""
        if batched == self.batched:
            return
        messages = self.messages()
        self._buf = bytearray()
        self._open = -1
        self.batched = batched
        count, self.count = self.count, 0
        for message in messages:
            self._append(message)
        self.count = count

    def messages(self):
        """The waiting messages (serialized StreamMessages), in order."""
        cdef bytes data = bytes(self._buf)
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(data)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(data), pos = 0, end, n
        cdef uint64_t v
        cdef int shift
        out = []
        while pos + 5 <= size:
            n = (<Py_ssize_t>p[pos + 1] << 24) | (p[pos + 2] << 16) | (p[pos + 3] << 8) | \
                p[pos + 4]
            if self._open == pos:
                n = size - pos - 5          # the open batch's prefix is not written yet
            pos += 5
            end = pos + n
            if not self.batched:
                out.append(data[pos:end])
                pos = end
                continue
            while pos < end:
                pos += 1                    # the tag
                v = 0
                shift = 0
                while p[pos] & 0x80:
                    v |= <uint64_t>(p[pos] & 0x7F) << shift
                    shift += 7
                    pos += 1
                v |= <uint64_t>p[pos] << shift
                pos += 1
                out.append(data[pos:pos + <Py_ssize_t>v])
                pos += <Py_ssize_t>v
        return out

    def _append(self, bytes message):
        cdef Py_ssize_t n = PyBytes_GET_SIZE(message)
        cdef Py_ssize_t at = self._reserve(n)
        memcpy(<uint8_t *>PyByteArray_AS_STRING(self._buf) + at,
               PyBytes_AS_STRING(message), n)

    cdef Py_ssize_t _reserve(self, Py_ssize_t n) except -1:
        """Grow the buffer by one message of `n` bytes with its framing; returns where the
        message's bytes go."""
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self._buf)
        cdef Py_ssize_t head
        cdef uint8_t *o
        if not self.batched:
            PyByteArray_Resize(self._buf, size + 5 + n)
            _put_prefix(<uint8_t *>PyByteArray_AS_STRING(self._buf) + size, False,
                        <uint32_t>n)
            return size + 5
        head = 1 + _varint_size(<uint64_t>n)
        if self._open >= 0 and size - self._open - 5 + head + n > BATCH_BYTES:
            self._close_batch()
        if self._open < 0:
            self._open = size
            size += 5
        PyByteArray_Resize(self._buf, size + head + n)
        o = <uint8_t *>PyByteArray_AS_STRING(self._buf) + size
        o[0] = MESSAGES_TAG
        _put_varint(o + 1, <uint64_t>n)
        return size + head

    cdef void _close_batch(self) noexcept:
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self._buf)
        if self._open >= 0:
            _put_prefix(<uint8_t *>PyByteArray_AS_STRING(self._buf) + self._open, False,
                        <uint32_t>(size - self._open - 5))
            self._open = -1

    cpdef bint offer(self, bytes message, DeliveryStamp stamp=None) except -1:
        """Frame ``message`` as one gRPC message: as it is (non-reliable topics canonicalise
        once at publish, for every subscription), or with ``stamp`` rewritten into canonical
        form (a reliable topic's stored frames, which leave out what the stamp gives).
        ``delivered_bytes`` counts the payloads' bytes (as upstream's consumer does), not
        the encoded messages'."""
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self._buf)
        cdef Py_ssize_t n, at, payload
        cdef uint8_t *o
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(message)
        cdef _Decoded d
        cdef _Id mid
        if stamp is None:
            n = PyBytes_GET_SIZE(message)
        else:
            if not _decode(p, PyBytes_GET_SIZE(message), &d):
                raise ValueError("malformed StreamMessage")
            n = _canon_size(&d, &stamp._s, &mid)
        if not self.enabled or (size and size + n + 5 > self.limit):
            return False
        payload = _payload_size(p, n) if stamp is None else _decoded_payload_size(p, &d)
        # Grown in place and written into: the rewritten message needs no bytes of its own.
        at = self._reserve(n)
        o = <uint8_t *>PyByteArray_AS_STRING(self._buf) + at
        if stamp is None:
            memcpy(o, p, n)
        else:
            _canon_write(p, PyBytes_GET_SIZE(message), &d, &stamp._s, &mid, o)
        self.count += 1
        self.delivered += 1
        self.delivered_bytes += payload
        if size == 0 and self.on_ready is not None:
            self.on_ready()
        return True

    def take(self):
        """Everything buffered (length-prefixed messages, as a bytearray the caller now
        owns); empties the outbox."""
        self._close_batch()
        out = self._buf
        self._buf = bytearray()
        self.count = 0
        return out


cdef class Fanout:
    """Base: a subscription's choice of consumer. Subclasses implement `dispatch`."""

    def __cinit__(self, *args, **kwargs):
        self.outboxes = []
        self.dropped = 0

    def set_outboxes(self, list outboxes):
        self.outboxes = list(outboxes)

    cpdef bint dispatch(self, bytes message, object key):
        raise NotImplementedError


cdef class ActiveFanout(Fanout):
    """Exclusive and Failover: every message to the first (active) consumer."""

    cpdef bint dispatch(self, bytes message, object key):
        cdef Outbox box
        if not self.outboxes:
            self.dropped += 1
            return False
        box = <Outbox>self.outboxes[0]
        if box.offer(message):
            return True
        box.dropped += 1
        self.dropped += 1
        return False


cdef class RoundRobinFanout(Fanout):
    """Shared: each message to one consumer, round-robin, skipping consumers that are full."""

    cpdef bint dispatch(self, bytes message, object key):
        cdef Py_ssize_t n = len(self.outboxes)
        cdef Py_ssize_t i, idx
        cdef Outbox box
        for i in range(n):
            idx = (self._next + i) % n
            box = <Outbox>self.outboxes[idx]
            if box.offer(message):
                self._next = (idx + 1) % n
                return True
        if n:
            (<Outbox>self.outboxes[self._next % n]).dropped += 1
        self.dropped += 1
        return False


cdef class KeySharedFanout(Fanout):
    """KeyShared: a consistent-hash ring (100 virtual nodes per consumer, `ring_hash`) picks
    the consumer of each routing key; a consumer with key filters only takes keys matching
    one of its glob patterns. A key no consumer accepts is dropped (and counted in
    `unroutable` when there were consumers to reject it). Decisions are cached per key until
    the consumer set changes."""

    def __cinit__(self, *args, **kwargs):
        self._ring_hashes = []
        self._ring_owner = []
        self._matchers = []
        self._cache = {}
        self.vnodes = 100
        self.unroutable = 0

    def set_consumers(self, list outboxes, list names, list matchers):
        """`matchers[i]` is None (accept every key) or a callable key -> bool."""
        points = []
        for i, name in enumerate(names):
            for v in range(self.vnodes):
                points.append((ring_hash(f"{name}-{v}"), i))
        points.sort()
        self.outboxes = list(outboxes)
        self._ring_hashes = [p[0] for p in points]
        self._ring_owner = [p[1] for p in points]
        self._matchers = list(matchers)
        self._cache = {}

    def owner_of(self, key):
        """Index of the consumer that owns `key`, or -1."""
        cdef Py_ssize_t n = len(self._ring_hashes)
        cdef Py_ssize_t start, j, owner
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        result = -1
        if n:
            start = bisect_left(self._ring_hashes, ring_hash(key))
            for j in range(n):
                owner = self._ring_owner[(start + j) % n]
                matcher = self._matchers[owner]
                if matcher is None or matcher(key):
                    result = owner
                    break
        if len(self._cache) > 100000:
            self._cache.clear()
        self._cache[key] = result
        return result

    cpdef bint dispatch(self, bytes message, object key):
        cdef object owner = self._cache.get(key)
        cdef Outbox box
        if owner is None:
            owner = self.owner_of(key)
        if owner < 0:
            if self.outboxes:
                self.unroutable += 1
            self.dropped += 1
            return False
        box = <Outbox>self.outboxes[owner]
        if box.offer(message):
            return True
        box.dropped += 1
        self.dropped += 1
        return False


def fanout(list fanouts, bytes message, object key):
    """Dispatch one message to every subscription; returns how many took it."""
    cdef Py_ssize_t i, taken = 0
    for i in range(len(fanouts)):
        if (<Fanout>fanouts[i]).dispatch(message, key):
            taken += 1
    return taken
