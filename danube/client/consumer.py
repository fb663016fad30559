"""Consumers. A TopicConsumer is one broker-side consumer on one topic (or partition); a
Consumer subscribes to every partition and merges their delivery streams into one bounded
buffer, which is where backpressure comes from: a full buffer stops the stream readers,
HTTP/2 flow control then holds the broker back.

Against our broker the streams are danube_ext.BatchConsumer/ReceiveBatches (many messages
per stream message) and, with ``batch_acks``, acks go as offset ranges (danube.client.acks);
against an upstream broker (UNIMPLEMENTED) ReceiveMessages and Ack, as upstream's clients."""

import asyncio
import collections
import itertools
import logging

from danube.client import errors
from danube.client.acks import AckBatcher
from danube.client.connection import BrokerAddress
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError, StatusCode

log = logging.getLogger("danube.client.consumer")

SUB_TYPES = {
    "exclusive": pb.ConsumerRequest.Exclusive,
    "shared": pb.ConsumerRequest.Shared,
    "failover": pb.ConsumerRequest.Failover,
    "fail-over": pb.ConsumerRequest.Failover,
    "key_shared": pb.ConsumerRequest.KeyShared,
    "key-shared": pb.ConsumerRequest.KeyShared,
    "keyshared": pb.ConsumerRequest.KeyShared,
}


def sub_type_value(sub_type):
    if isinstance(sub_type, int):
        if sub_type in SUB_TYPES.values():
            return sub_type
    elif isinstance(sub_type, str) and sub_type.lower() in SUB_TYPES:
        return SUB_TYPES[sub_type.lower()]
    raise errors.InvalidArgument(f"unknown subscription type {sub_type!r}; use one of "
                                 "exclusive, shared, failover, key_shared")


class _Failure:
    """Queued in place of a message: a partition's stream failed for good."""
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


_CLOSED = object()

# The window a consumer asks for by default (ReceiveBatches' max_unacked_messages). Chosen by
# measurement (bench.consume, docs/consume.md): the drain rate rises steeply up to a few
# hundred in flight and levels off near a thousand; a larger window only lengthens how long
# a delivered message may wait in a slow reader's buffer, against the ack timeout.
DEFAULT_WINDOW = 1000


async def _let_the_call_out():
    # A batch of acks just became an AckRanges call. A reader that acks a whole delivery
    # batch in one go never gives the event loop a turn, so without this the call would
    # wait for the end of the batch, and the broker, its window full, would wait for the
    # call: delivery and processing would take turns instead of overlapping (a drain at
    # window 1,000 ran at 246,000 msgs/s instead of ~440,000). Two turns: one for the
    # call's task to write its frames, one for the connection to flush them.
    await asyncio.sleep(0)
    await asyncio.sleep(0)


class TopicConsumer:
    def __init__(self, client, topic, name, subscription, sub_type, key_filters, window=0):
        self.client = client
        self.window = window            # max_unacked_messages asked of ReceiveBatches, or 0
        self.batched = True             # ReceiveBatches until the broker says UNIMPLEMENTED
        self.acks = None                # its AckBatcher, with batch_acks
        self.topic = topic
        self.name = name
        self.subscription = subscription
        self.sub_type = sub_type
        self.key_filters = list(key_filters)
        self.address = BrokerAddress(client.service_url, client.service_url)
        self.consumer_id = None
        self._ids = itertools.count(0)
        self._stub = None
        self._metadata = None
        self._health = None
        self._call = None
        self.closed_by_broker = False

    async def subscribe(self):
        client = self.client
        self.address = await client.lookup_or(self.topic, self.address)

        async def attempt():
            stub = client.pool.stub(self.address.connect_url)
            return await stub.subscribe(pb.ConsumerRequest(
                request_id=next(self._ids), topic_name=self.topic, consumer_name=self.name,
                subscription=self.subscription, subscription_type=self.sub_type,
                key_filters=self.key_filters), timeout=client.rpc_timeout,
                metadata=self.address.call_metadata())

        async def relookup():
            self.address = await client.lookup_or(self.topic, self.address)

        response = await client.retry.run(attempt, relookup)
        self.consumer_id = response.consumer_id
        self._stub = client.pool.stub(self.address.connect_url)
        self._metadata = self.address.call_metadata()
        self.closed_by_broker = False
        self.stop()
        self._health = client.watch_health(pb.HealthCheckRequest.Consumer, self.consumer_id,
                                           self.address, self._on_broker_close)

    def _on_broker_close(self):
        # Wake the receive loop, which subscribes again through a fresh lookup.
        self.closed_by_broker = True
        if self._call is not None:
            self._call.cancel()

    async def open_stream(self):
        if self.batched:
            self._call = await self._stub.receive_batches(
                ext.ReceiveBatchesRequest(request_id=next(self._ids),
                                          consumer_id=self.consumer_id,
                                          max_unacked_messages=self.window),
                metadata=self._metadata)
        else:
            self._call = await self._stub.receive_messages(
                pb.ReceiveRequest(request_id=next(self._ids), consumer_id=self.consumer_id),
                metadata=self._metadata)
        return self._call

    async def ack(self, msg, subscription):
        await self._stub.ack(pb.AckRequest(request_id=msg.request_id,
                                           msg_id=msg.msg_id.to_proto(),
                                           subscription_name=subscription),
                             timeout=self.client.rpc_timeout, metadata=self._metadata)

    async def nack(self, msg, subscription, delay_ms=None, reason=None):
        request = pb.NackRequest(request_id=msg.request_id, msg_id=msg.msg_id.to_proto(),
                                 subscription_name=subscription)
        if delay_ms is not None:
            request.delay_ms = delay_ms
        if reason is not None:
            request.reason = reason
        await self._stub.nack(request, timeout=self.client.rpc_timeout, metadata=self._metadata)

    def stop(self):
        if self.acks is not None:
            self.acks.cancel()
        if self._health is not None:
            self._health.cancel()
            self._health = None


class Consumer:
    """`await client.subscribe(topic, consumer_name, subscription, sub_type="shared")`;
    then `async for msg in consumer.messages()` (or `await consumer.receive()`, or
    `await consumer.receive_many()`), and `await consumer.ack(msg)` for each. Messages are
    danube.client.Message: StreamMessage's fields, decoded without a protobuf object
    (`msg.to_proto()` gives one).

    The defaults are the fast path (docs/consume.md): a window of DEFAULT_WINDOW and
    batched acks. ``max_unacked_messages`` (1..10000): the reliable subscription's window
    while this consumer's stream is open (our broker; an operator's
    SetSubscriptionDispatchConfig wins); None leaves the broker's
    (dispatch.max_unacked_messages). ``batch_acks`` (default True): ``ack`` queues the
    message and returns at once; queued acks go as offset ranges in one call per
    ``ack_batch`` messages (default: a quarter of the window, at most 1024) or after
    ``ack_delay`` seconds; ``flush_acks()`` waits for them and raises a failed call's error;
    ``close()`` flushes. ``batch_acks=False``: ``ack`` is upstream's Ack, one call per
    message, returning once the broker has it."""

    def __init__(self, client, topic, name, subscription, sub_type="shared", key_filters=(),
                 queue_size=1000, *, max_unacked_messages=DEFAULT_WINDOW, batch_acks=True,
                 ack_batch=None, ack_delay=0.002):
        if not name or not subscription:
            raise errors.InvalidArgument("a consumer needs a name and a subscription")
        if max_unacked_messages is not None and (
                type(max_unacked_messages) is not int or
                not 1 <= max_unacked_messages <= 10000):
            raise errors.InvalidArgument(f"max_unacked_messages must be an integer between "
                                         f"1 and 10000, not {max_unacked_messages!r}")
        if ack_batch is not None and (type(ack_batch) is not int or ack_batch < 1):
            raise errors.InvalidArgument(f"ack_batch must be a positive integer, not "
                                         f"{ack_batch!r}")
        if not isinstance(ack_delay, (int, float)) or not 0 <= ack_delay <= 60:
            raise errors.InvalidArgument(f"ack_delay must be between 0 and 60 seconds, not "
                                         f"{ack_delay!r}")
        self.client = client
        self.topic = topic
        self.name = name
        self.subscription = subscription
        self.sub_type = sub_type_value(sub_type)
        self.key_filters = tuple(key_filters)
        self.window = max_unacked_messages or 0
        self.batch_acks = batch_acks
        self.ack_batch = ack_batch or max(1, min(1024, (self.window or 10) // 4))
        self.ack_delay = ack_delay
        self.queue_size = queue_size
        self._buffer = collections.deque()
        self._readable = asyncio.Event()     # the buffer holds something
        self._writable = asyncio.Event()     # the buffer has room
        self._writable.set()
        self._only_acks = None
        self._consumers = {}        # partition topic -> TopicConsumer
        self._loops = []
        self._closed = False

    async def _subscribe(self):
        partitions = await self.client.partitions(self.topic)
        if not partitions:
            raise errors.NoTopicsFound(f"No topics found for {self.topic}")
        consumers = [TopicConsumer(self.client, p, self.name, self.subscription,
                                   self.sub_type, self.key_filters, self.window)
                     for p in partitions]
        if self.batch_acks:
            for c in consumers:
                c.acks = AckBatcher(c, self.subscription, self.ack_batch, self.ack_delay)
        try:
            await asyncio.gather(*(c.subscribe() for c in consumers))
        except BaseException as exc:
            for c in consumers:
                c.stop()
            if isinstance(exc, RpcError):
                raise errors.from_rpc(exc, f"subscribe {self.subscription!r} to "
                                           f"{self.topic}") from None
            raise
        self._consumers = {c.topic: c for c in consumers}
        # One partition: ack() need not look the message's partition up.
        self._only_acks = consumers[0].acks if len(consumers) == 1 else None
        self._loops = [self.client.spawn(self._receive_loop(c), name=f"danube-recv-{c.topic}")
                       for c in consumers]

    @property
    def partitions(self):
        return list(self._consumers)

    async def receive(self, timeout=None):
        """The next message. Raises ClientClosed after close(), the partition's DanubeError
        if its stream failed for good, TimeoutError after `timeout` seconds."""
        buffer = self._buffer
        if not buffer:
            await self._wait_readable(timeout)
        item = buffer[0]
        if item is _CLOSED or type(item) is _Failure:
            return self._marker(item)
        buffer.popleft()
        if not buffer:
            self._readable.clear()
        if len(buffer) < self.queue_size:
            self._writable.set()
        return item

    async def receive_many(self, max_messages=1000, timeout=None):
        """Every message waiting, up to ``max_messages`` (at least one: waits for it as
        receive() does)."""
        buffer = self._buffer
        if not buffer:
            await self._wait_readable(timeout)
        out = []
        pop = buffer.popleft
        while buffer and len(out) < max_messages:
            if buffer[0] is _CLOSED or type(buffer[0]) is _Failure:
                if out:
                    break
                return self._marker(buffer[0])
            out.append(pop())
        if not buffer:
            self._readable.clear()
        if len(buffer) < self.queue_size:
            self._writable.set()
        return out

    async def _wait_readable(self, timeout):
        if self._closed and not self._buffer:
            raise errors.ClientClosed("the consumer is closed")
        if timeout is None:
            await self._readable.wait()
        else:
            await asyncio.wait_for(self._readable.wait(), timeout)

    def _marker(self, item):
        if item is _CLOSED:
            raise errors.ClientClosed("the consumer is closed")     # left for other readers
        self._buffer.popleft()
        if not self._buffer:
            self._readable.clear()
        self._writable.set()
        raise item.error

    async def messages(self):
        """Messages until the consumer is closed."""
        while True:
            try:
                yield await self.receive()
            except errors.ClientClosed:
                return

    async def ack(self, msg):
        if self._only_acks is not None:         # batch_acks on a single partition
            if self._only_acks.add(msg):
                await _let_the_call_out()
            return
        if self.batch_acks:
            consumer = self._consumers.get(msg.msg_id.topic_name)
            if consumer is not None:
                if consumer.acks.add(msg):
                    await _let_the_call_out()
                return
        await self._call_for(msg, "acknowledge", lambda c: c.ack(msg, self.subscription))

    async def flush_acks(self):
        """batch_acks: send the queued acks and wait for them; raises the error of a call
        that failed since the last flush (the broker redelivers what it did not get)."""
        for consumer in self._consumers.values():
            if consumer.acks is not None:
                try:
                    await consumer.acks.flush()
                except RpcError as exc:
                    raise errors.from_rpc(exc, f"acknowledge on {consumer.topic}") from None

    async def nack(self, msg, delay_ms=None, reason=None):
        await self._call_for(msg, "negatively acknowledge",
                             lambda c: c.nack(msg, self.subscription, delay_ms, reason))

    async def _call_for(self, msg, what, call):
        consumer = self._consumers.get(msg.msg_id.topic_name)
        if consumer is None:
            raise errors.InvalidArgument(
                f"cannot {what}: message from {msg.msg_id.topic_name!r}, which this "
                f"consumer does not read")
        try:
            await call(consumer)
        except RpcError as exc:
            raise errors.from_rpc(exc, f"{what} on {consumer.topic}") from None

    async def close(self):
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush_acks()
        except errors.DanubeError as exc:
            log.warning("acknowledgements lost at close (they will be redelivered): %s", exc)
        for consumer in self._consumers.values():
            consumer.stop()
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        # Unread messages are dropped (reliable ones are redelivered, being unacked); the
        # marker wakes a reader blocked in receive().
        self._buffer.clear()
        self._buffer.append(_CLOSED)
        self._readable.set()
        self._writable.set()
        self.client._forget(self)

    async def _put(self, item):
        await self._put_many((item,))

    async def _put_many(self, items):
        buffer = self._buffer
        buffer.extend(items)
        self._readable.set()
        if len(buffer) >= self.queue_size:
            self._writable.clear()
            await self._writable.wait()

    async def _receive_loop(self, consumer):
        """Read one partition's stream into the queue, recovering as upstream does: retry
        retryable errors with backoff, and subscribe again (fresh lookup) when the broker
        closed the consumer, forgot it, or ended the stream. A resubscribe that meets a
        retryable error is tried again without end (a moving topic comes back); one that
        meets any other error (the topic deleted, permission revoked) ends the partition
        with that error, raised by receive()."""
        policy = self.client.retry
        attempt = 0
        resubscribe = False
        unavailable = 0         # resubscribes in a row that found no broker serving the topic
        while True:
            if resubscribe:
                try:
                    await consumer.subscribe()
                except RpcError as exc:
                    if not policy.retryable(exc):
                        await self._put(_Failure(errors.from_rpc(
                            exc, f"resubscribe {self.subscription!r} to {consumer.topic}")))
                        return
                    # A topic between owners (a drain, a failover, a broker restarting and
                    # loading it) answers UNAVAILABLE for as long as that takes; giving up
                    # would silently stop this partition for good while the others go on.
                    unavailable += 1
                    if unavailable == 1 or unavailable % 20 == 0:
                        log.warning("resubscribing %r to %s: %s (attempt %d; retrying)",
                                    self.subscription, consumer.topic, exc, unavailable)
                    await asyncio.sleep(policy.backoff(min(unavailable, policy.max_retries)))
                    continue
                if unavailable:
                    log.info("resubscribed %r to %s after %d attempts", self.subscription,
                             consumer.topic, unavailable + 1)
                resubscribe, unavailable = False, 0
            try:
                call = await consumer.open_stream()
                while True:
                    batch = await call.read_batch()
                    if not batch:
                        break
                    attempt = 0
                    if consumer.batched:
                        for delivery in batch:
                            await self._put_many(delivery)
                    else:
                        await self._put_many(batch)
                resubscribe = True      # the broker ended the stream cleanly
            except RpcError as exc:
                if exc.code == StatusCode.UNIMPLEMENTED and consumer.batched:
                    consumer.batched = False        # an upstream broker: ReceiveMessages
                    continue
                if consumer.closed_by_broker or exc.code == StatusCode.NOT_FOUND:
                    resubscribe = True
                elif policy.retryable(exc):
                    attempt += 1
                    if attempt > policy.max_retries:
                        resubscribe, attempt = True, 0
                else:
                    # E.g. ABORTED: another client took this consumer name over; taking it
                    # back would make the two fight forever.
                    await self._put(_Failure(errors.from_rpc(
                        exc, f"receive from {consumer.topic}")))
                    return
                log.debug("stream of %s ended (%s); %s", consumer.topic, exc,
                          "resubscribing" if resubscribe else "retrying")
            await asyncio.sleep(policy.backoff(attempt))
