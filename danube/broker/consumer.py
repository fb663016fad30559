"""A consumer: its identity, its outbox of messages, and the delivery stream (a DeliverySink,
see danube.broker.delivery) that drains it.

Slow consumers: messages for a consumer go into its outbox (framed, bounded by
`outbox_limit` bytes, 4 MiB by default) and from there into its HTTP/2 stream whenever the
stream's flow-control window and the socket accept them. A non-reliable message that finds the
outbox full is dropped for that consumer (on a Shared subscription it is first offered to the
other consumers) and counted in `danube_consumer_dropped_total`. Upstream drops as soon as a
4-message channel is full; we drop only once a consumer is megabytes behind, and never let a
slow consumer hold memory beyond its limit or slow down the publisher or other consumers.
"""

import asyncio
import logging
import time

from danube.broker._fanout import Outbox
from danube.broker.errors import ConsumerTakenOver

log = logging.getLogger("danube.broker.consumer")


class Consumer:
    __slots__ = ("consumer_id", "name", "subscription", "outbox", "stream", "active",
                 "_loop", "_flush_scheduled", "_waiting_on", "key_filters",
                 "inactive_since", "_stream_timer", "_subscriber", "owner", "_stream_client",
                 "_released", "__weakref__")

    def __init__(self, consumer_id, name, subscription, key_filters=(), outbox_limit=4 << 20,
                 loop=None):
        self.consumer_id = consumer_id
        self.name = name
        self.subscription = subscription
        self.key_filters = tuple(key_filters)
        self._loop = loop or asyncio.get_event_loop()
        self.outbox = Outbox(outbox_limit, self._schedule_flush)
        self.stream = None            # the DeliverySink of the current stream
        # Active from Subscribe until its ReceiveMessages stream ends (or it is removed);
        # messages published in between wait in the outbox.
        self.active = True
        self.inactive_since = None
        self._flush_scheduled = False
        self._waiting_on = None       # the sink whose when_writable callback is pending
        self._stream_timer = None
        self._subscriber = None       # the connection whose end cuts _stream_timer short
        # The client (connection) that took this consumer over by subscribing again under
        # its name, and the client of the current stream; see take_over and must_wait.
        self.owner = None
        self._stream_client = None
        self._released = asyncio.Event()

    # -- the ReceiveMessages stream ------------------------------------------------------

    def expect_stream(self, grace, client=None):
        """Just subscribed: unless a ReceiveMessages stream attaches within ``grace``
        seconds, the consumer goes inactive as if its stream had ended. A client that dies
        between Subscribe and ReceiveMessages would otherwise hold an Exclusive
        subscription, and take reliable messages in flight to nobody, for ever. If the
        subscribing connection (``client``) ends first, that is now: it cannot open the
        stream any more (a client that comes back on a new connection reopens it, which
        makes the consumer active again)."""
        self._cancel_stream_timer()
        if self.stream is None:
            self._stream_timer = self._loop.call_later(grace, self._no_stream)
            if hasattr(client, "call_when_lost"):
                self._subscriber = client
                client.call_when_lost(self, self._subscriber_gone)

    def _subscriber_gone(self):
        self._subscriber = None
        if self._stream_timer is not None:
            self._stream_timer.cancel()
            self._no_stream("its connection closed before it opened a ReceiveMessages stream")

    def _no_stream(self, why="it opened no ReceiveMessages stream"):
        self._stream_timer = None
        self._forget_subscriber()
        self._release()
        if self.stream is None and self.active:
            log.info("consumer %r of subscription %r: %s; it is inactive until it subscribes "
                     "again", self.name, self.subscription.name, why)
            self.active = False
            self.inactive_since = time.monotonic()
            self.subscription.consumer_changed(self)

    def _cancel_stream_timer(self):
        if self._stream_timer is not None:
            self._stream_timer.cancel()
            self._stream_timer = None
        self._forget_subscriber()

    def _forget_subscriber(self):
        client, self._subscriber = self._subscriber, None
        if client is not None:
            client.forget_when_lost(self)

    def take_over(self, client, grace):
        """Subscribed again under this name (upstream's takeover at Subscribe): the current
        stream ends now, so nothing dispatched from here on goes to it; it waits in the
        outbox for the next stream. ``client`` (the subscribing connection) owns the
        consumer from now on: see must_wait."""
        self.owner = client
        if self.stream is not None:
            self.stream.end(ConsumerTakenOver(
                f"consumer {self.name!r} was taken over by a new Subscribe under its name"))
            self._stop_waiting_writable()
            self.stream = self._stream_client = None
            self._forget_sent()
        self.active = True
        self.inactive_since = None
        self.expect_stream(grace, client)

    def must_wait(self, client):
        """Whether a ReceiveMessages stream from ``client`` has to wait for its turn: it does
        while the client that took the consumer over is about to open its stream (within
        the stream grace) or has it open. The official clients open ReceiveMessages again
        with the same consumer id whenever their stream ends, without subscribing again, so
        without this the client that was taken over would take the stream straight back,
        and the two would steal it from each other for as long as both run."""
        owner = self.owner
        return owner is not None and client is not owner and (
            self._stream_timer is not None or
            (self.stream is not None and self._stream_client is owner))

    async def turn(self):
        """Returns once the stream or the owner's claim on it changed (see must_wait)."""
        await self._released.wait()

    def _release(self):
        released, self._released = self._released, asyncio.Event()
        released.set()

    def _forget_sent(self):
        """The old stream is gone with whatever it had not delivered yet. A reliable
        consumer's in-flight messages are redelivered (the dispatcher's consumer_left), so
        its outbox is dropped to avoid duplicates; a non-reliable outbox is kept for the
        next stream, as upstream keeps the consumer's channel."""
        dispatcher = self.subscription.dispatcher
        if dispatcher is not None:
            dispatcher.consumer_left(self)      # it empties the outbox too

    def attach(self, stream, client=None):
        """Make `stream` (a DeliverySink) this consumer's delivery stream; an earlier one is
        ended (takeover). The stream learns how it ends through its `end`."""
        self._cancel_stream_timer()
        old = self.stream
        taken_over = old is not None and old is not stream
        if taken_over:
            old.end(ConsumerTakenOver(
                f"consumer {self.name!r} was taken over by a newer ReceiveMessages stream"))
            self._stop_waiting_writable()
            self._forget_sent()
        self.stream = stream
        self._stream_client = client
        was_active, self.active = self.active, True
        self.inactive_since = None
        stream.start_response()
        if not was_active:
            # Back after its stream grace ran out: receives again.
            self.subscription.consumer_changed(self)
        if self.outbox.count:
            self._schedule_flush()

    def stream_ended(self, stream):
        """The client went away (or the handler ended): the consumer is inactive until it
        subscribes again."""
        if self.stream is stream:
            self.stream = self._stream_client = None
            self.active = False
            self.inactive_since = time.monotonic()
            self._stop_waiting_writable()
            self._release()
            dispatcher = self.subscription.dispatcher
            if dispatcher is not None:
                # Before consumer_changed, which would hand the messages back uncounted:
                # what this stream took and did not ack is a failed delivery.
                dispatcher.consumer_left(self, stream_ended=True)
            self.subscription.consumer_changed(self)

    def close(self, reason=None):
        """Removed from its subscription (topic deleted, unsubscribe, replaced): end the
        stream; `reason` (a BrokerError, or None for a clean end) becomes its status."""
        self.active = False
        self.outbox.enabled = False
        self._cancel_stream_timer()
        stream, self.stream = self.stream, None
        self._stream_client = None
        self._stop_waiting_writable()
        self._release()
        if stream is not None:
            stream.end(reason)

    def _stop_waiting_writable(self):
        sink, self._waiting_on = self._waiting_on, None
        if sink is not None:
            sink.cancel_writable()

    # -- delivery ------------------------------------------------------------------------

    def _schedule_flush(self):
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self):
        self._flush_scheduled = False
        stream = self.stream
        if stream is None or stream.finished or self._waiting_on is not None:
            return
        if stream.blocked:
            self._wait_writable(stream)
            return
        data = self.outbox.take()
        if data and not stream.send_framed(data):
            self._wait_writable(stream)

    def _wait_writable(self, stream):
        self._waiting_on = stream
        stream.when_writable(self._writable)

    def _writable(self, drained):
        self._waiting_on = None
        if drained and self.outbox.count:
            self._flush()
