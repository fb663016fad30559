# cython: language_level=3
# Non-reliable dispatch fan-out: one published message to every subscription of a topic, each
# subscription choosing its consumer(s) by type. Runs once per message per subscription, so
# the selection and the gRPC framing into each consumer's outbox are C loops; Python only sees
# an outbox when it goes from empty to non-empty (once per event-loop turn per consumer).

from bisect import bisect_left
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcpy

from danube.broker._canon cimport _Decoded, _Id, _decode, _canon_size, _canon_write
from danube.codec.grpcframe cimport _put_prefix


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


cdef class Outbox:
    """Framed messages waiting for one consumer's stream, bounded by `limit` bytes.

    `on_ready` (a callable) is called when the outbox goes from empty to non-empty, which is
    the owner's cue to schedule one flush. `offer` refuses a message that would take the
    outbox past its limit: for a non-reliable subscription that message is dropped (or, on
    Shared, offered to the next consumer)."""

    def __cinit__(self, Py_ssize_t limit=4 * 1024 * 1024, on_ready=None):
        self._buf = bytearray()
        self.limit = limit
        self.count = 0
        self.on_ready = on_ready
        self.enabled = True
        self.delivered = self.delivered_bytes = self.dropped = 0

    @property
    def buffered(self):
        return len(self._buf)

    cpdef bint offer(self, bytes message, DeliveryStamp stamp=None) except -1:
        """Frame ``message`` as one gRPC message: as it is (non-reliable topics canonicalise
        once at publish, for every subscription), or with ``stamp`` rewritten into canonical
        form (a reliable topic's stored frames, which leave out what the stamp gives)."""
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self._buf)
        cdef Py_ssize_t n
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
        # Grown in place and written into: the rewritten message needs no bytes of its own.
        PyByteArray_Resize(self._buf, size + 5 + n)
        o = <uint8_t *>PyByteArray_AS_STRING(self._buf) + size
        _put_prefix(o, False, <uint32_t>n)
        if stamp is None:
            memcpy(o + 5, p, n)
        else:
            _canon_write(p, PyBytes_GET_SIZE(message), &d, &stamp._s, &mid, o + 5)
        self.count += 1
        self.delivered += 1
        self.delivered_bytes += n
        if size == 0 and self.on_ready is not None:
            self.on_ready()
        return True

    def take(self):
        """Everything buffered (length-prefixed messages, as a bytearray the caller now
        owns); empties the outbox."""
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
