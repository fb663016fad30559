"""At-least-once dispatch of one reliable subscription from its topic's log.

State, owned here and nowhere else:
  cursor      the last offset acked with every offset before it acked (persisted, so a
              consumer that reconnects, or a restarted broker, resumes at cursor + 1)
  next_read   the next offset never delivered yet
  inflight    delivered, not yet acked: offset -> Delivery (consumer, ack deadline, attempts)
  acked       acks above the cursor that arrived out of order
  retry       messages waiting to be delivered again: a heap of (due time, offset)

At most `window` (max_unacked_messages) messages are in flight. A nack, an ack timeout or a
consumer's stream ending sends a message back for redelivery. Nacks, timeouts and a stream
the client ended before acking count as failed attempts, with the policy's fixed or
exponential backoff (or the nack's delay_ms if larger); a consumer removed or taken over
does not, nor does a message that never left the broker (see consumer_left). After
max_redelivery_count failures the poison policy decides: Block stalls the subscription (on
KeyShared only that message's key), Drop treats it as acked, DeadLetter republishes it to
the dead-letter topic and then treats it as acked.
Messages are handed to consumers in offset order per subscription (per key on KeyShared).
That holds through a consumer leaving too: what it had in flight goes to the next consumer
before anything newer (as upstream's failover does), in offset order (all of it once the
longest of its backoffs ends, see _resend_together), so while such messages wait to be sent
again an Exclusive or Failover subscription delivers nothing new, and a KeyShared one nothing
new of their keys; a consumer joining sends them again at once, without the backoff. A nack
or an ack timeout does not hold newer messages back (upstream's, and Pulsar's, semantics).

KeyShared: a message whose key no consumer's key filters accept, while the subscription does
have connected consumers, is skipped as if acked (upstream moves its cursor past it too), so
it holds neither the window nor retention. With no consumer connected it waits; so does a
key that only a disconnected, not yet removed, consumer accepts: it may come back for it.

The dispatcher owns its background work (the dispatch loop, cursor writes, dead-letter
republishes): close() cancels or finishes every one of them before it returns.
"""

import asyncio
import heapq
import logging

from danube import failure_policy as fp
from danube.broker import _window
from danube.broker._canon import routing_key
from danube.broker._window import Delivery
from danube.broker.cursor import CursorPersistence
from danube.broker.rate import RateLimiter
from danube.broker.subscription import EXCLUSIVE, FAILOVER, KEY_SHARED, SHARED
from danube.storage.errors import CorruptSegmentError, OffsetTruncatedError
from danube.tasks import TaskSet

log = logging.getLogger("danube.broker.reliable")

HEARTBEAT = 0.5          # upstream's dispatcher heartbeat
#: Seconds between passes after one failed unexpectedly.
DISPATCH_RETRY = 1.0
ORDERED = (EXCLUSIVE, FAILOVER)      # one consumer at a time: the topic's order is promised
READ_BATCH = 256
#: Passes of every reliable dispatcher of the process, by what woke them: upstream's
#: danube_dispatcher_notifier_polls_total (new messages, acks, consumers) and
#: danube_dispatcher_heartbeat_polls_total (the timer).
POLLS = {"notifier": 0, "heartbeat": 0}
# Skipped KeyShared messages settle without taking the window, so behind one unacked message
# the set of offsets settled out of order could otherwise grow with the whole backlog.
MAX_SETTLED_AHEAD = 65536


class ReliableDispatcher(CursorPersistence):
    def __init__(self, subscription, topic, cursor, policy, window, *, loop, on_cursor,
                 dead_letter, on_acked=None, acked=(), dispatch_rate=0):
        self.sub = subscription
        self.topic = topic
        self.cursor = cursor
        self.next_read = cursor + 1
        self.policy = policy
        self.window = window
        self.window_owner = None           # the stream that asked for `window`, if one did
        self.loop = loop
        self._on_cursor = on_cursor        # async (cursor) -> None: persist it
        self._dead_letter = dead_letter    # async (delivery, attempts, reason) -> None
        self.inflight = {}
        # No in-flight deadline is earlier than this (a lower bound: acks leave it stale).
        self._earliest_deadline = float("inf")
        # Persisted out-of-order acks (on_acked) from before a restart: skipped, not resent.
        self.acked = _window.expand_ranges(acked, cursor, MAX_SETTLED_AHEAD)
        self._on_acked = on_acked          # async ([[first, last], ...]) -> None, or None
        self._saved_acked = sorted(self.acked)
        self._flush_lock = asyncio.Lock()
        self.retry = []                    # heap of (due, offset)
        self.retry_payloads = {}           # offset -> (payload, key)
        self.orphans = {}                  # offset -> key: a left consumer's, not yet resent
        self.attempts = {}                 # offset -> failed deliveries so far
        self.blocked_offset = None         # Block on non-KeyShared: the stalled message
        self.blocked_keys = {}             # Block on KeyShared: key -> offset
        self.held = {}                     # KeyShared: key -> [(offset, payload)] behind a block
        self._rr = 0
        self._wake = asyncio.Event()
        self._saved_cursor = cursor
        self._save_timer = None            # the debounced cursor save (_schedule_save)
        # Background work this dispatcher owns, finished or cancelled by close().
        self._flushes = TaskSet("cursor writes", loop)
        self._dead_letter_tasks = TaskSet("dead-letter republishes", loop)
        self._tasks = TaskSet("reliable dispatch", loop)   # the dispatch loop
        self._dead_lettering = set()
        self._reader = None                # TopicLogReader, from the first read on
        self._closing = False
        # policies.max_subscription_dispatch_rate (messages/s, 0: none): deliveries and
        # redeliveries together (upstream paces reads from the log only; a redelivery storm
        # must not go above the rate either).
        self.limiter = RateLimiter(dispatch_rate, loop.time()) if dispatch_rate else None
        self._paced = False                # the last pass stopped for the rate limit
        self.stats = {"redelivered": 0, "nacked": 0, "ack_timeouts": 0, "stream_ended": 0,
                      "exhausted": 0, "dead_lettered": 0, "dropped": 0, "unroutable": 0}
        self._tasks.spawn(self._run(), name=f"dispatch {topic.name}")

    # -- the outside world ---------------------------------------------------------------

    def notify(self):
        """New messages in the log, a consumer came or went, or an ack freed the window."""
        self._wake.set()

    @property
    def lag(self):
        return max(0, self.topic.dispatchable_end - 1 - self.cursor)

    async def close(self):
        self._closing = True
        if self._reader is not None:
            self._reader.close()
        if self._save_timer is not None:
            self._save_timer.cancel()
            self._save_timer = None
        # Dead-letter republishes are cancelled, not awaited to the end: one may wait for
        # the broker's topic lock, which the caller (a topic deletion) can hold. The message
        # stays unacked, for later.
        await self._dead_letter_tasks.close()
        await self._tasks.close()
        # Cursor writes in flight finish first: one landing after the last would put an
        # older cursor back.
        await self._flushes.wait()
        await self.flush_cursor()

    def ack(self, offset):
        delivery = self.inflight.pop(offset, None)
        if delivery is None:
            if offset in self.retry_payloads:
                # Acked while waiting for redelivery (a late ack of an earlier delivery):
                # the consumer did process it.
                del self.retry_payloads[offset]
            elif offset <= self.cursor or offset >= self.next_read or offset in self.acked:
                return
        self._settle(offset)

    def ack_ranges(self, pairs):
        """Acknowledge by inclusive (first, last) offset ranges, each offset as ack() would
        (danube.broker._window.ack_ranges); returns how many messages were acknowledged."""
        cursor, count = _window.ack_ranges(self, pairs)
        self.cursor = cursor
        if count:
            self._schedule_save()
            self.notify()
        return count

    def nack(self, offset, delay_ms=None, reason=None):
        delivery = self.inflight.pop(offset, None)
        if delivery is None:
            return
        self.stats["nacked"] += 1
        self._failed(delivery, delay_ms, reason)

    def consumer_left(self, consumer, stream_ended=False):
        """The consumer stopped receiving with messages in flight: they go back for
        redelivery, and its outbox is emptied so its next stream does not get them twice.

        Removed, taken over, or gone inactive (stream_ended False): at once, not a failed
        attempt. Its stream ended by the client before an ack (stream_ended True: reset,
        cancelled, connection lost): the messages already handed to the stream count as a
        failed attempt and back off as a nack does. A client that cannot take a message (one
        above its receive limit, say) resets the stream and opens it again at once, and an
        immediate redelivery made that a loop of thousands of deliveries a second that never
        reached the poison policy. Messages still queued in the outbox never left the
        broker, so they are not counted."""
        mine = [d for d in self.inflight.values() if d.consumer is consumer]
        # The outbox holds the consumer's latest deliveries, in delivery order, which is
        # also their order in `inflight` (a redelivery is inserted again at the end).
        unsent = len(mine) if not stream_ended else min(consumer.outbox.count, len(mine))
        consumer.outbox.take()
        now = self.loop.time()
        for i, delivery in enumerate(mine):
            del self.inflight[delivery.offset]
            self.orphans[delivery.offset] = delivery.key
            if i >= len(mine) - unsent:
                self._schedule(delivery, now)
            else:
                self.stats["stream_ended"] += 1
                self._failed(delivery, None, "the consumer's stream ended before an ack")
        if unsent < len(mine) and self.sub.sub_type != SHARED:
            self._resend_together({d.offset for d in mine})
        self.notify()

    def _resend_together(self, offsets):
        """A left consumer's messages go out again in offset order (the topic's on Exclusive
        and Failover, each key's on KeyShared): all of them when the last of their backoffs
        ends. Left to their own due times, the ones that never left the broker (due at once)
        and the ones with fewer failed attempts (a shorter backoff) overtook older ones."""
        latest = max((due for due, offset in self.retry if offset in offsets), default=None)
        if latest is None:
            return
        self.retry = [(latest if offset in offsets else due, offset)
                      for due, offset in self.retry]
        heapq.heapify(self.retry)

    def consumer_joined(self):
        """A consumer joined: what a left one had in flight is sent again now rather than
        after its backoff (upstream's RetryNow on AddConsumer), so the subscription does not
        sit on newer messages meanwhile."""
        if not self.orphans:
            return
        now = self.loop.time()
        self.retry = [(min(due, now) if offset in self.orphans else due, offset)
                      for due, offset in self.retry]
        heapq.heapify(self.retry)
        self.notify()

    # -- bookkeeping ---------------------------------------------------------------------

    def _settle(self, offset):
        """The message is done with (acked, dropped or dead-lettered)."""
        self.attempts.pop(offset, None)
        self.orphans.pop(offset, None)
        if offset == self.cursor + 1:
            self.cursor = offset
            while self.cursor + 1 in self.acked:
                self.cursor += 1
                self.acked.discard(self.cursor)
            self._schedule_save()
        elif offset > self.cursor:
            self.acked.add(offset)
            self._schedule_save()
        self.notify()

    def _schedule(self, delivery, due):
        heapq.heappush(self.retry, (due, delivery.offset))
        self.retry_payloads[delivery.offset] = (delivery.payload, delivery.key)

    def _failed(self, delivery, delay_ms, reason):
        attempts = self.attempts.get(delivery.offset, 0) + 1
        self.attempts[delivery.offset] = attempts
        if attempts > self.policy.max_redelivery_count:
            self.stats["exhausted"] += 1
            self._poison(delivery, attempts, reason)
            return
        delay = max(self.policy.redelivery_delay_ms(attempts), delay_ms or 0)
        self._schedule(delivery, self.loop.time() + delay / 1000.0)
        self.notify()

    def _poison(self, delivery, attempts, reason):
        policy = self.policy.poison_policy
        log.warning("%s/%s: offset %d failed %d times (%s): %s", self.topic.name, self.sub.name,
                    delivery.offset, attempts, reason or "nacked or timed out", policy)
        if policy == fp.DROP:
            self.stats["dropped"] += 1
            self._settle(delivery.offset)
        elif policy == fp.DEAD_LETTER:
            if self._closing:
                return              # unacked: delivered again when the subscription is back
            self._dead_lettering.add(delivery.offset)
            self._dead_letter_tasks.spawn(self._send_to_dead_letter(delivery, attempts, reason))
        elif self.sub.sub_type == KEY_SHARED:
            self.blocked_keys[delivery.key] = delivery.offset
        else:
            self.blocked_offset = delivery.offset

    async def _send_to_dead_letter(self, delivery, attempts, reason):
        try:
            await self._dead_letter(delivery, attempts, reason)
        except Exception:  # noqa: BLE001 - keep the message; retry on the next failure
            log.exception("dead-lettering offset %d of %s failed", delivery.offset,
                          self.topic.name)
            self._dead_lettering.discard(delivery.offset)
            self.attempts[delivery.offset] -= 1
            self._schedule(delivery, self.loop.time() + 1.0)
            return
        self._dead_lettering.discard(delivery.offset)
        self.stats["dead_lettered"] += 1
        self._settle(delivery.offset)

    @property
    def stalled(self):
        return self.blocked_offset is not None

    # -- the dispatch loop ---------------------------------------------------------------

    async def _run(self):
        failed = None
        while not self._closing:
            try:
                timeout = self._dispatch()
                failed = None
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the subscription
                # Logged once per kind of failure; the pass is tried again every second,
                # so what it could not do is done once the cause is gone.
                if repr(exc) != failed:
                    if isinstance(exc, CorruptSegmentError):
                        # Damaged acknowledged history: the message says which file and
                        # offset; the subscription waits there rather than skip it.
                        log.error("%s/%s: dispatch stopped at damaged data: %s",
                                  self.topic.name, self.sub.name, exc)
                    else:
                        log.exception("%s/%s: dispatch failed; retrying every second",
                                      self.topic.name, self.sub.name)
                    failed = repr(exc)
                self._wake.clear()
                await asyncio.sleep(DISPATCH_RETRY)
                continue
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that arrives as the event is set, and close() would then wait forever.
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
                POLLS["notifier"] += 1
            except TimeoutError:
                POLLS["heartbeat"] += 1
            self._wake.clear()

    def _dispatch(self):
        """One pass: expire acks, redeliver what is due, deliver new messages. Returns how
        long to sleep at most before the next pass."""
        now = self.loop.time()
        next_deadline = now + HEARTBEAT
        ack_timeout = self.policy.ack_timeout_ms / 1000.0
        if self._earliest_deadline <= now:
            self._expire(now)
        next_deadline = min(next_deadline, self._earliest_deadline)
        consumers = self._consumers()
        limiter = self.limiter
        self._paced = False
        if consumers:
            # Redeliveries first, in offset order among those due.
            while self.retry and self.retry[0][0] <= now and len(self.inflight) < self.window:
                if limiter is not None and not limiter.available(now):
                    self._paced = True
                    break
                due, offset = heapq.heappop(self.retry)
                entry = self.retry_payloads.pop(offset, None)
                if entry is None:
                    continue            # acked meanwhile
                payload, key = entry
                if self._unroutable(key):
                    self._skip_unroutable(offset, key)
                    continue
                if not self._deliver(consumers, offset, payload, key, now + ack_timeout):
                    heapq.heappush(self.retry, (due, offset))
                    self.retry_payloads[offset] = entry
                    break
                self.orphans.pop(offset, None)
                self.stats["redelivered"] += 1
                if limiter is not None:
                    limiter.take(1, now)
            if not self.stalled and not (self.orphans and self.sub.sub_type in ORDERED) \
                    and not self._paced:
                if limiter is None:
                    self._deliver_new(consumers, now + ack_timeout)
                else:
                    start = self.next_read
                    self._deliver_new(consumers, now + ack_timeout, limiter.available(now))
                    # Every offset passed counts (a skipped one too): never more than the
                    # budget was delivered, and a jump over truncated history only empties
                    # the bucket.
                    limiter.take(min(self.next_read - start, limiter.available(now)), now)
        if self._paced:
            next_deadline = min(next_deadline, now + limiter.wait(now))
        # A redelivery still due after the pass could not go out: no consumer, the window
        # or the consumer's outbox full, or the rate paced it. A consumer's arrival or an
        # ack wakes the loop, a freed outbox the heartbeat; a deadline of "now" for it
        # spun the loop until then (a core kept busy while a sink connector was down).
        if self.retry and self.retry[0][0] > now:
            next_deadline = min(next_deadline, self.retry[0][0])
        return max(0.0, next_deadline - now)

    def _expire(self, now):
        """Ack timeouts. A pass only scans the in-flight messages once the earliest deadline
        is due (every ack wakes the loop, and a scan per pass cost O(window) per ack)."""
        earliest = float("inf")
        for offset, delivery in list(self.inflight.items()):
            if delivery.deadline <= now:
                del self.inflight[offset]
                self.stats["ack_timeouts"] += 1
                self._failed(delivery, None, None)
            elif delivery.deadline < earliest:
                earliest = delivery.deadline
        self._earliest_deadline = earliest

    def _deliver_new(self, consumers, deadline, budget=None):
        """New messages from next_read on; with a ``budget`` (the rate limit's tokens), no
        more offsets than that are passed."""
        # KeyShared: newer messages of a key a left consumer had in flight wait for those
        # to be sent again; the first such message holds back the ones behind it.
        orphan_keys = set(self.orphans.values()) if self.orphans else ()
        end = self.topic.dispatchable_end
        start = self.next_read
        while self.next_read < end and len(self.inflight) < self.window and \
                len(self.acked) < MAX_SETTLED_AHEAD:
            want = min(READ_BATCH, self.window - len(self.inflight), end - self.next_read)
            if budget is not None:
                left = budget - (self.next_read - start)
                if left <= 0:
                    self._paced = True
                    return
                want = min(want, left)
            if self._reader is None:
                self._reader = self.topic.log.reader(self.notify)
            try:
                # The log picks the tier (hot cache, WAL files, durable tier).
                batch = self._reader.read(self.next_read, want)
            except OffsetTruncatedError as gone:
                self._skip_truncated(gone.first_offset)
                continue
            if batch is None:
                return          # being fetched from the durable tier; notify() follows
            if not batch:
                return
            kind = self.sub.sub_type
            if kind != KEY_SHARED:
                # No message has a key: the whole run in C, to the one consumer (Exclusive,
                # Failover) or round robin (Shared).
                if orphan_keys:
                    return          # Shared: a left consumer's messages go first
                end_of_batch = batch[-1][0] + 1
                if self.acked:
                    batch = [e for e in batch if e[0] not in self.acked]
                if kind == SHARED:
                    taken, self._rr = _window.deliver_round_robin(
                        self.inflight, batch, consumers, self._rr, deadline,
                        self.topic.delivery_stamp)
                else:
                    taken = _window.deliver_run(self.inflight, batch, consumers[0], deadline,
                                                self.topic.delivery_stamp)
                if taken:
                    self._earliest_deadline = min(self._earliest_deadline, deadline)
                if taken < len(batch):
                    if taken:
                        self.next_read = batch[taken - 1][0] + 1
                    return
                self.next_read = end_of_batch
                continue
            # KeyShared: runs of messages whose keys' owners take them, in C; a message
            # whose key is unowned, blocked, held back or a left consumer's goes through
            # _deliver_keyed_one.
            i = 0
            while i < len(batch):
                start = i
                i, outcome = _window.deliver_keyed(
                    self.inflight, batch, i, consumers, self.sub.fanout, deadline,
                    self.topic.delivery_stamp, self.acked, self.blocked_keys, self.held,
                    orphan_keys)
                if i > start:
                    self.next_read = batch[i - 1][0] + 1
                    self._earliest_deadline = min(self._earliest_deadline, deadline)
                if outcome == _window.KEYED_REFUSED:
                    return
                if outcome == _window.KEYED_SLOW:
                    offset, payload = batch[i]
                    if not self._deliver_keyed_one(consumers, offset, payload, deadline,
                                                   orphan_keys):
                        return
                    self.next_read = offset + 1
                    i += 1

    def _deliver_keyed_one(self, consumers, offset, payload, deadline, orphan_keys):
        """One KeyShared message the C run left (see _window.deliver_keyed); False: stop
        delivering for now."""
        key = self._key(payload)
        if self._unroutable(key):
            self._skip_unroutable(offset, key)
            return True
        if key in orphan_keys:
            return False
        if key in self.blocked_keys or key in self.held:
            # Behind a blocked message of the same key: keep key order.
            self.held.setdefault(key, []).append(offset)
            return True
        return self._deliver(consumers, offset, payload, key, deadline)

    def _skip_truncated(self, first_offset):
        """Retention was told to delete unconsumed data (storage.local_retention.
        delete_unconsumed): what is gone is gone for this subscription too."""
        lost = first_offset - self.next_read
        log.warning("%s/%s: %d unconsumed messages (offsets %d..%d) were deleted by "
                    "retention; resuming at %d", self.topic.name, self.sub.name, lost,
                    self.next_read, first_offset - 1, first_offset)
        self.stats["dropped"] += lost
        self.next_read = first_offset
        if self.cursor < first_offset - 1:
            self.cursor = first_offset - 1
            self.acked = {o for o in self.acked if o > self.cursor}
            self._schedule_save()

    def _key(self, payload):
        if self.sub.sub_type != KEY_SHARED:
            return None
        try:
            return routing_key(payload)
        except ValueError as exc:
            # Only a message stored before the batch publish checked its strings can get
            # here; it is delivered (to the empty key's owner) rather than stop the
            # subscription.
            log.warning("%s/%s: a message's routing key cannot be read (%s); routing it by "
                        "the empty key", self.topic.name, self.sub.name, exc)
            return ""

    def _unroutable(self, key):
        """KeyShared only (key is None otherwise); called with consumers connected. The
        fan-out ring holds the connected consumers, so a key it places needs no more work."""
        if key is None or self.sub.fanout.owner_of(key) >= 0:
            return False
        return not self.sub.takes_key(key)

    def _skip_unroutable(self, offset, key):
        self.stats["unroutable"] += 1
        log.debug("%s/%s: offset %d skipped: no consumer's key filters accept key %r",
                  self.topic.name, self.sub.name, offset, key)
        self._settle(offset)

    def _consumers(self):
        # Same order as the subscription's fan-out ring (KeyShared owner indexes into it).
        return self.sub.active_consumers()

    def _deliver(self, consumers, offset, payload, key, deadline):
        consumer = self._pick(consumers, key)
        if consumer is None or not consumer.outbox.offer(payload, self.topic.delivery_stamp):
            return False
        self.inflight[offset] = Delivery(offset, consumer, deadline, payload, key)
        if deadline < self._earliest_deadline:
            self._earliest_deadline = deadline
        return True

    def _pick(self, consumers, key):
        kind = self.sub.sub_type
        if kind in (EXCLUSIVE, FAILOVER):
            return consumers[0]
        if kind == KEY_SHARED:
            index = self.sub.fanout.owner_of(key)
            return consumers[index] if 0 <= index < len(consumers) else None
        # Shared: round-robin.
        n = len(consumers)
        start = self._rr % n
        self._rr += 1
        return consumers[start]
