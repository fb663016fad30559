# cython: language_level=3
# The per-message bookkeeping of a reliable subscription's window (danube.broker.reliable)
# where it runs once per message: recording a run of deliveries (to one consumer, round
# robin, or by routing key), and range acknowledgements (danube_ext.BatchConsumer/AckRanges), as C loops over the dispatcher's
# dicts instead of a Python call per offset.

cimport cython

from danube.broker._fanout cimport Outbox
from danube.broker._canon cimport DeliveryStamp
from danube.broker._canon import routing_key

# deliver_keyed's outcomes.
KEYED_DONE = 0          # every message of the batch handled
KEYED_REFUSED = 1       # the message's consumer refused it: stop
KEYED_SLOW = 2          # the message needs the per-message path


# A window's Deliveries are made and freed at the drain's rate. Taken from a free list, one
# costs no malloc and does not count towards the collector's next generation-0 pass (a pass
# every 700 new tracked objects was ~7 % of a broker draining at 300k msgs/s).
@cython.freelist(4096)
cdef class Delivery:
    """One message in flight: to whom, until when, and what (for a redelivery)."""
    cdef public object offset
    cdef public object consumer
    cdef public double deadline
    cdef public bytes payload
    cdef public object key

    def __init__(self, offset, consumer, double deadline, bytes payload, key):
        self.offset = offset
        self.consumer = consumer
        self.deadline = deadline
        self.payload = payload
        self.key = key


cdef inline void _record(dict inflight, tuple entry, consumer, double deadline,
                         key=None) except *:
    """``entry`` (offset, payload) taken by ``consumer``: in flight until ``deadline``."""
    cdef Delivery d = Delivery.__new__(Delivery)
    d.offset = entry[0]
    d.consumer = consumer
    d.deadline = deadline
    d.payload = <bytes>entry[1]
    d.key = key
    inflight[entry[0]] = d


def deliver_run(dict inflight, list batch, consumer, double deadline, DeliveryStamp stamp):
    """Offer ``batch`` (``(offset, payload)`` pairs in offset order, no routing key) to
    ``consumer``'s outbox and record each message taken as in flight; returns how many
    were taken (it stops at the first refused)."""
    cdef Outbox box = consumer.outbox
    cdef Py_ssize_t i, n = len(batch)
    cdef tuple entry
    for i in range(n):
        entry = <tuple>batch[i]
        if not box.offer(<bytes>entry[1], stamp):
            return i
        _record(inflight, entry, consumer, deadline)
    return n


def deliver_round_robin(dict inflight, list batch, list consumers, Py_ssize_t rr,
                        double deadline, DeliveryStamp stamp):
    """Shared: offer ``batch`` (as for ``deliver_run``) to ``consumers`` in turn, starting
    with ``consumers[rr % len(consumers)]``, and record each message taken as in flight.
    Stops at the first refusal, as the per-message path does (that consumer's turn is
    spent). Returns ``(taken, rr)``: how many were taken and the next turn."""
    cdef Py_ssize_t i, n = len(batch), k = len(consumers)
    cdef tuple entry
    cdef object consumer
    for i in range(n):
        entry = <tuple>batch[i]
        consumer = consumers[rr % k]
        rr += 1
        if not (<Outbox>consumer.outbox).offer(<bytes>entry[1], stamp):
            return i, rr
        _record(inflight, entry, consumer, deadline)
    return n, rr


def deliver_keyed(dict inflight, list batch, Py_ssize_t start, list consumers, ring,
                  double deadline, DeliveryStamp stamp, set acked, dict blocked, dict held,
                  orphan_keys):
    """KeyShared: from ``batch[start]`` on, skip what ``acked`` holds and offer each message
    to the consumer that owns its routing key (``ring.owner_of``, an index into
    ``consumers``), recording it in flight with its key. Returns ``(i, outcome)``:
    KEYED_DONE with ``i == len(batch)``; KEYED_REFUSED when ``batch[i]``'s consumer refused
    it; KEYED_SLOW when ``batch[i]`` needs the per-message path: its key has no owner here,
    is blocked or held back (``blocked``, ``held``), or is a left consumer's
    (``orphan_keys``)."""
    cdef Py_ssize_t i, n = len(batch), k = len(consumers), owner
    cdef tuple entry
    cdef object consumer
    for i in range(start, n):
        entry = <tuple>batch[i]
        if entry[0] in acked:
            continue
        try:
            key = routing_key(<bytes>entry[1])
        except ValueError:
            return i, KEYED_SLOW        # stored before publish checked its strings
        owner = ring.owner_of(key)
        if owner < 0 or owner >= k or key in orphan_keys or key in blocked or key in held:
            return i, KEYED_SLOW
        consumer = consumers[owner]
        if not (<Outbox>consumer.outbox).offer(<bytes>entry[1], stamp):
            return i, KEYED_REFUSED
        _record(inflight, entry, consumer, deadline, key)
    return n, KEYED_DONE


def to_ranges(list offsets):
    """Sorted distinct offsets as inclusive ``[first, last]`` runs."""
    cdef list out = []
    cdef long long first = 0, last = 0, o
    cdef bint started = False
    for value in offsets:
        o = value
        if started and o == last + 1:
            last = o
            continue
        if started:
            out.append([first, last])
        first = last = o
        started = True
    if started:
        out.append([first, last])
    return out


def expand_ranges(ranges, long long cursor, Py_ssize_t limit):
    """The offsets of persisted ``[first, last]`` runs above ``cursor`` (at most ``limit``
    of them: past that the rest are delivered again, as if never acknowledged)."""
    cdef set out = set()
    cdef long long first, last, o
    for r in ranges:
        try:
            first, last = r[0], r[1]
        except (TypeError, IndexError, ValueError):
            continue            # a damaged record costs redeliveries, never a crash
        o = max(first, cursor + 1)
        while o <= last and len(out) < limit:
            out.add(o)
            o += 1
    return out


def check_ranges(ranges):
    """``ranges`` (first0, last0, first1, last1, ...) as a list of (first, last) pairs;
    ValueError, naming the problem, when they are not pairs or a range runs backwards."""
    cdef Py_ssize_t n = len(ranges), i
    if n % 2:
        raise ValueError(f"ranges holds {n} offsets; it must be pairs (first, last)")
    values = list(ranges)
    pairs = []
    for i in range(0, n, 2):
        if values[i + 1] >= 1 << 63:
            raise ValueError(f"range {i // 2} ends at {values[i + 1]}, past any offset")
        if values[i] > values[i + 1]:
            raise ValueError(f"range {i // 2} runs backwards: first {values[i]} > last "
                             f"{values[i + 1]}")
        pairs.append((values[i], values[i + 1]))
    return pairs


def ack_ranges(dispatcher, list pairs):
    """Acknowledge every offset of ``pairs`` (inclusive (first, last)) that is delivered and
    not yet acknowledged, as ``dispatcher.ack`` does one by one: in flight or waiting for
    redelivery (a late ack of an earlier delivery), or above the cursor and neither (a
    message held back or being dead-lettered). Advances the cursor over what is now
    contiguous. Returns how many messages were acknowledged."""
    cdef dict inflight = dispatcher.inflight
    cdef dict retry_payloads = dispatcher.retry_payloads
    cdef dict attempts = dispatcher.attempts
    cdef set acked = dispatcher.acked
    cdef long long cursor = dispatcher.cursor
    cdef long long end = dispatcher.next_read - 1
    cdef long long first, last, o
    cdef Py_ssize_t count = 0
    cdef bint track_attempts = len(attempts) > 0
    for pair in pairs:
        first = max(<long long>pair[0], cursor + 1)
        last = min(<long long>pair[1], end)
        o = first
        while o <= last:
            if inflight.pop(o, None) is None:
                if o <= cursor or o in acked:
                    o += 1
                    continue
                retry_payloads.pop(o, None)
            if track_attempts:
                attempts.pop(o, None)
            count += 1
            if o == cursor + 1:
                cursor = o
                while acked and (cursor + 1) in acked:
                    cursor += 1
                    acked.discard(cursor)
                if cursor > o:
                    o = cursor          # offsets up to the cursor are acked already
            else:
                acked.add(o)
            o += 1
    return cursor, count
