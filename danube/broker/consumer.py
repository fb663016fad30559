"""A consumer: its identity, its outbox of messages, and the ReceiveMessages stream that
drains it.

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

from danube._core import Outbox
from danube.broker.errors import ConsumerTakenOver

log = logging.getLogger("danube.broker.consumer")


class Consumer:
    __slots__ = ("consumer_id", "name", "subscription", "outbox", "stream", "active",
                 "_loop", "_flush_scheduled", "_drainer", "_detached", "key_filters",
                 "inactive_since", "_stream_timer", "__weakref__")

    def __init__(self, consumer_id, name, subscription, key_filters=(), outbox_limit=4 << 20,
                 loop=None):
        self.consumer_id = consumer_id
        self.name = name
        self.subscription = subscription
        self.key_filters = tuple(key_filters)
        self._loop = loop or asyncio.get_event_loop()
        self.outbox = Outbox(outbox_limit, self._schedule_flush)
        self.stream = None
        # Active from Subscribe until its ReceiveMessages stream ends (or it is removed);
        # messages published in between wait in the outbox.
        self.active = True
        self.inactive_since = None
        self._flush_scheduled = False
        self._drainer = None
        self._detached = None
        self._stream_timer = None

    # -- the ReceiveMessages stream ------------------------------------------------------

    def expect_stream(self, grace):
        """Just subscribed: unless a ReceiveMessages stream attaches within ``grace``
        seconds, the consumer goes inactive as if its stream had ended. A client that dies
        between Subscribe and ReceiveMessages would otherwise hold an Exclusive
        subscription, and take reliable messages in flight to nobody, for ever."""
        self._cancel_stream_timer()
        if self.stream is None:
            self._stream_timer = self._loop.call_later(grace, self._no_stream)

    def _no_stream(self):
        self._stream_timer = None
        if self.stream is None and self.active:
            log.info("consumer %r of subscription %r opened no ReceiveMessages stream; it is "
                     "inactive until it subscribes again", self.name, self.subscription.name)
            self.active = False
            self.inactive_since = time.monotonic()
            self.subscription.consumer_changed(self)

    def _cancel_stream_timer(self):
        if self._stream_timer is not None:
            self._stream_timer.cancel()
            self._stream_timer = None

    def attach(self, stream):
        """Make `stream` this consumer's delivery stream; an earlier one is ended (takeover)."""
        self._cancel_stream_timer()
        old = self.stream
        taken_over = old is not None and old is not stream
        if taken_over:
            self._end_stream(ConsumerTakenOver(
                f"consumer {self.name!r} was taken over by a newer ReceiveMessages stream"))
            self._cancel_drainer()
            # What was queued for the old stream never reached anyone.
            self.outbox.take()
        self.stream = stream
        was_active, self.active = self.active, True
        self.inactive_since = None
        self._detached = self._loop.create_future()
        stream.start_response()
        if not was_active:
            # Back after its stream grace ran out: receives again.
            self.subscription.consumer_changed(self)
        dispatcher = self.subscription.dispatcher
        if taken_over and dispatcher is not None:
            # Messages in flight on the old stream may never have arrived: redeliver them
            # on the new one rather than after the ack timeout.
            dispatcher.consumer_left(self)
        if self.outbox.count:
            self._schedule_flush()
        return self._detached

    def stream_ended(self, stream):
        """The client went away (or the handler ended): the consumer is inactive until it
        subscribes again."""
        if self.stream is stream:
            self.stream = None
            self.active = False
            self.inactive_since = time.monotonic()
            self._cancel_drainer()
            self.subscription.consumer_changed(self)

    def close(self, reason=None):
        """Removed from its subscription (topic deleted, unsubscribe, replaced): end the
        stream; `reason` (a BrokerError, or None for a clean end) becomes its status."""
        self.active = False
        self.outbox.enabled = False
        self._cancel_stream_timer()
        stream, self.stream = self.stream, None
        self._cancel_drainer()
        if stream is not None:
            self._end_stream(reason)

    def _end_stream(self, reason=None):
        detached = self._detached
        if detached is not None and not detached.done():
            detached.set_result(reason)

    def _cancel_drainer(self):
        if self._drainer is not None:
            self._drainer.cancel()
            self._drainer = None

    # -- delivery ------------------------------------------------------------------------

    def _schedule_flush(self):
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self):
        self._flush_scheduled = False
        stream = self.stream
        if stream is None or stream.finished or self._drainer is not None:
            return
        if stream.blocked:
            self._drainer = self._loop.create_task(self._drain(stream))
            return
        data = self.outbox.take()
        if data and not stream.send_framed(data):
            self._drainer = self._loop.create_task(self._drain(stream))

    async def _drain(self, stream):
        try:
            await stream.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            if self._drainer is asyncio.current_task():
                self._drainer = None
        if self.outbox.count:
            self._flush()
