"""Batched acknowledgements of one partition's consumer (``Consumer(batch_acks=True)``):
``ack(msg)`` queues the offset and returns; queued offsets go to the broker as ranges in one
danube_ext.BatchConsumer/AckRanges call once ``batch`` of them are queued or ``delay``
seconds after the first. Against a broker without the extension (UNIMPLEMENTED) the queued
messages are acknowledged with upstream's Ack, one call each, from then on.

A failed call loses nothing that matters: the broker redelivers what it did not hear acked
(at least once); the error is kept and raised by the next ``flush()``. ``flush()`` also
waits until the broker has stored the progress (AckRanges with ``durable``): what was
acknowledged before it is never delivered again, even after a broker crash."""

import asyncio
import logging

from danube.client._delivery import ack_ranges
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.rpc import RpcError, StatusCode

log = logging.getLogger("danube.client.acks")


class AckBatcher:
    def __init__(self, consumer, subscription, batch, delay):
        self.consumer = consumer            # the TopicConsumer (its stub and metadata)
        self.subscription = subscription
        self.batch = batch
        self.delay = delay
        self.ranges_supported = True
        self._pending = []                  # messages queued for the next call
        self._timer = None
        self._calls = set()
        self.error = None
        self._acked_since_durable = False

    def add(self, msg):
        """Queue ``msg``; True when this filled a batch and its call was started."""
        self._acked_since_durable = True
        self._pending.append(msg)
        if len(self._pending) >= self.batch:
            self._send()
            return True
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self._send)
        return False

    def _send(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        msgs, self._pending = self._pending, []
        if msgs:
            task = asyncio.ensure_future(self._call(msgs))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, msgs, durable=False):
        c = self.consumer
        try:
            if self.ranges_supported:
                try:
                    await c._stub.ack_ranges(ext.AckRangesRequest(
                        request_id=next(c._ids), topic_name=c.topic,
                        subscription_name=self.subscription,
                        ranges=ack_ranges(msgs),
                        durable=durable),
                        timeout=c.client.rpc_timeout, metadata=c._metadata)
                    return
                except RpcError as exc:
                    if exc.code != StatusCode.UNIMPLEMENTED:
                        raise
                    self.ranges_supported = False
            await asyncio.gather(*(c._stub.ack(pb.AckRequest(
                request_id=m.request_id, msg_id=m.msg_id.to_proto(),
                subscription_name=self.subscription),
                timeout=c.client.rpc_timeout, metadata=c._metadata) for m in msgs))
        except RpcError as exc:
            log.debug("acknowledging %d messages of %s failed: %s", len(msgs), c.topic, exc)
            self.error = exc

    async def flush(self):
        """Send what is queued and wait for every call, then for the broker to store the
        subscription's progress (a durable AckRanges); raises the first error since the
        last flush (RpcError)."""
        self._send()
        while self._calls:
            await asyncio.gather(*list(self._calls), return_exceptions=True)
        if self.ranges_supported and self._acked_since_durable:
            await self._call([], durable=True)
        self._acked_since_durable = False
        error, self.error = self.error, None
        if error is not None:
            raise error

    def cancel(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
