"""The sink runtime: read the connector's topics, hand batches (``processing.batch_size``
records, or what came within ``processing.batch_timeout_ms``) to ``process_batch``, and
acknowledge them only once it returned. Records at or below an exactly-once sink's
committed offsets were written before a crash: they are acknowledged, not written again.
Nor is a record this instance wrote itself and the broker sent again (its ack timeout ran
out while the write was retried): its copy is acknowledged and left out.

Refused records reach the dead-letter topic before the batch's offsets are committed: an
exactly-once sink hands them to its ``dead_letter`` before its commit (the runtime returns
once the broker acknowledged them), and any other sink's progress is the broker's ack, which
comes after the runtime sent what ``process_batch`` refused. A record is dead-lettered once
per batch however often the batch is retried."""

import asyncio
import collections
import logging
import time

from danube.connect.connector import ConsumerConfig, SinkConnector
from danube.connect.errors import (ConfigError, InvalidRecord, RetryableError, Unavailable)
from danube.connect.records import SinkRecord

log = logging.getLogger("danube.connect.sink")

# Batches read ahead of the one being written, per sink: the queue between the readers and
# the writer is bounded by it.
READ_AHEAD = 2


class SinkRuntime:
    def __init__(self, runtime, connector):
        self.rt = runtime
        self.connector = connector
        self.consumers = []             # (ConsumerConfig, Consumer)
        self.committed = {}
        # Only a sink that keeps its progress in the external system skips by offset: an
        # at-least-once sink may share its subscription with other instances, and a record
        # below its own newest write may be one another instance received and never wrote.
        self.exactly_once = (type(connector).committed_offsets
                             is not SinkConnector.committed_offsets)
        # Unacknowledged records per subscription: the batch being written, the one
        # prepared, and READ_AHEAD more being received.
        self.window = min(10000, max(1, runtime.core.processing.batch_size * (READ_AHEAD + 2)))
        # What this instance wrote lately: the broker sends again at most a window of
        # unacknowledged records.
        self._written = RecentlyWritten(2 * self.window)
        self._queue = asyncio.Queue(READ_AHEAD)
        self._readers = []
        # (partition, offset) of the batch's records in the dead-letter topic already: a
        # retry of the batch, or process_batch returning what it sent itself, sends no copy.
        self._dead = set()
        connector._send_dead_letters = self.dead_letter

    async def start(self):
        rt = self.rt
        window = self.window
        for cfg in self.connector.consumer_configs():
            if not isinstance(cfg, ConsumerConfig):
                raise ConfigError(f"consumer_configs returned {cfg!r}, not a ConsumerConfig")
            name = cfg.consumer_name or rt.core.connector_name
            consumer = await rt.broker_retry(
                lambda c=cfg, n=name: rt.client.subscribe(
                    c.topic, n, c.subscription, c.subscription_type,
                    queue_size=window, max_unacked_messages=window, batch_acks=True),
                f"subscription {cfg.subscription} on {cfg.topic}")
            self.consumers.append((cfg, consumer))
        self.committed = dict(await rt.external_retry(self.connector.committed_offsets,
                                                      "committed offsets"))
        if self.committed:
            log.info("resuming after the sink's committed offsets",
                     extra={"offsets": str(self.committed)})

    async def run(self, stop):
        """Two stages: the next batch is received, turned into SinkRecords and
        ``prepare``d (parsing: nothing outside is touched) while the one before is being
        written; batches are written and acknowledged one at a time, in order. On stop the
        batch being written is finished; a prepared one waiting is left unacknowledged (the
        broker delivers it again)."""
        self._readers = [asyncio.ensure_future(self._read(cfg, consumer))
                         for cfg, consumer in self.consumers]
        ready = asyncio.Queue(1)
        preparing = asyncio.ensure_future(self._prepare_batches(stop, ready))
        try:
            while True:
                if ready.empty():
                    # Wait for the next batch, or for the first stage to end (stopped
                    # while idle, or a reader's error: raised below).
                    getter = asyncio.ensure_future(ready.get())
                    try:
                        await asyncio.wait((getter, preparing),
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        got = getter.done()
                        if not got:
                            getter.cancel()
                    if not got:
                        break
                    item = getter.result()
                else:
                    item = ready.get_nowait()
                await self._deliver(*item)
                if stop.is_set():
                    break
        finally:
            preparing.cancel()
            await asyncio.gather(preparing, return_exceptions=True)
            for task in self._readers:
                task.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)
            for _cfg, consumer in self.consumers:
                try:
                    await consumer.flush_acks()
                except Exception as exc:        # noqa: BLE001 - redelivered, not lost
                    log.warning("final acknowledgements failed (redelivered): %s", exc)
        if preparing.done() and not preparing.cancelled() and preparing.exception():
            raise preparing.exception()

    async def _prepare_batches(self, stop, ready):
        """Stage one: batches as ``_deliver``'s arguments into ``ready``, until ``stop`` is
        set and nothing is waiting. An error (a reader that failed) ends the run."""
        while True:
            batch = await self._next_batch(stop)
            if not batch:
                if stop.is_set():
                    return
                continue
            await ready.put(self._prepare(batch))

    def _prepare(self, batch):
        """(records to write as (consumer, SinkRecord), already written (consumer, msg),
        what the connector's ``prepare`` made of the records)."""
        records, skipped = [], []
        committed = self.committed
        from_message = SinkRecord.from_message
        for cfg, consumer, msg in batch:
            if committed:
                mid = msg.msg_id
                done = committed.get(mid.topic_name)
                if done is not None and mid.topic_offset <= done:
                    skipped.append((consumer, msg))
                    continue
            records.append((consumer, from_message(cfg.topic, msg)))
        prepared = self.connector.prepare([r for _c, r in records]) if records else None
        return records, skipped, prepared

    async def _read(self, cfg, consumer):
        size = self.rt.core.processing.batch_size
        while True:
            msgs = await consumer.receive_many(size)
            await self._queue.put((cfg, consumer, msgs))

    async def _next_batch(self, stop):
        """(cfg, consumer, msg) triples: at least batch_size, or what came within
        batch_timeout_ms of the first; [] once ``stop`` is set and nothing is waiting."""
        core = self.rt.core.processing
        batch = []
        deadline = None
        while len(batch) < core.batch_size:
            if deadline is None:
                if stop.is_set():
                    return batch
                timeout = 0.05          # look at ``stop`` this often while idle
            else:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
            try:
                cfg, consumer, msgs = await asyncio.wait_for(self._queue.get(), timeout)
            except asyncio.TimeoutError:
                self._check_readers()
                continue
            if deadline is None:
                deadline = time.monotonic() + core.batch_timeout_ms / 1000.0
            batch.extend((cfg, consumer, m) for m in msgs)
        return batch

    def _check_readers(self):
        for task in self._readers:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()

    async def _deliver(self, records, skipped, prepared):
        rt = self.rt
        started = time.perf_counter()
        # The batch was prepared while the one before was written: what that one wrote is
        # known only now.
        fresh, again = [], []
        for pair in records:
            record = pair[1]
            (again if self._done(record.partition, record.offset) else fresh).append(pair)
        if again:
            skipped = [*skipped, *((c, r.message) for c, r in again)]
            records, prepared = fresh, None
        for consumer, msg in skipped:
            await consumer.ack(msg)
        if skipped:
            log.info("acknowledged %d records the sink had written before", len(skipped))
        if not records:
            return
        for topic, n in _per_topic(r for _c, r in records).items():
            rt.metrics.count(rt.metrics.received, topic, n)
        rt.metrics.inflight.labels(rt.name).set(len(records))
        rt.metrics.batch_size.labels(rt.name).observe(len(records))
        sink_records = [r for _c, r in records]
        self._dead.clear()
        await self._process(sink_records, prepared)
        committed = self.committed
        last = {}
        for consumer, record in records:
            await consumer.ack(record.message)
            last[record.partition] = record.offset
        self._written.add([(r.partition, r.offset) for r in sink_records])
        if self.exactly_once:
            for partition, offset in last.items():
                done = committed.get(partition)
                if done is None or offset > done:
                    committed[partition] = offset
        newest = max(r.publish_time for r in sink_records)
        rt.metrics.lag.labels(rt.name).set(max(0.0, time.time() - newest / 1000.0))
        rt.metrics.inflight.labels(rt.name).set(0)
        rt.metrics.batch_latency.labels(rt.name).observe(time.perf_counter() - started)

    async def _process(self, records, prepared=None):
        """process_batch with the runtime's retry rules (danube/connect/errors.py);
        ``prepared`` holds for ``records`` as they came (not once some are dead-lettered)."""
        rt = self.rt
        attempt = 0
        while records:
            try:
                if prepared is None:
                    rejected = await self.connector.process_batch(records) or []
                else:
                    rejected = await self.connector.process_batch(records, prepared) or []
            except Unavailable as exc:
                attempt = await rt.external_failed(exc, attempt, forever=True)
                continue
            except RetryableError as exc:
                if attempt >= rt.backoff.max_retries:
                    failed = exc.records or records
                    for record in failed:
                        await self._dead_letter(record, f"failed after {attempt + 1} "
                                                        f"attempts: {exc}")
                    gone = {id(r) for r in failed}
                    records = [r for r in records if id(r) not in gone]
                    prepared = None
                    attempt = 0
                    rt.health.set("external")
                    continue
                attempt = await rt.external_failed(exc, attempt, forever=False)
                continue
            except InvalidRecord as exc:
                if exc.record is None or not any(r is exc.record for r in records):
                    raise
                await self._dead_letter(exc.record, exc.reason)
                records = [r for r in records if r is not exc.record]
                prepared = None
                continue
            rt.health.set("external")
            bad = set()
            for item in rejected:
                await self._dead_letter(item.record, item.reason)
                bad.add(id(item.record))
            written = _per_topic(r for r in records if id(r) not in bad)
            for topic, n in written.items():
                rt.metrics.count(rt.metrics.processed, topic, n)
            return

    def _done(self, partition, offset):
        """Written already: by this instance lately, or (an exactly-once sink) at or below
        the committed offset."""
        if (partition, offset) in self._written:
            return True
        done = self.committed.get(partition)
        return done is not None and offset <= done

    async def dead_letter(self, rejected):
        """``SinkConnector.dead_letter``: each InvalidRecord's record to the dead-letter
        topic, acknowledged by the broker, in order."""
        for item in rejected:
            await self._dead_letter(item.record, item.reason)

    async def _dead_letter(self, record, reason):
        sent = (record.partition, record.offset)
        if sent in self._dead:
            return
        await self.rt.dead_letters.send(record.payload, record.attributes, record.key, reason,
                                        record.topic, offset=record.offset,
                                        partition=record.partition)
        self._dead.add(sent)


class RecentlyWritten:
    """The last ``limit`` (partition, offset) pairs added, the oldest forgotten first."""

    def __init__(self, limit):
        self.limit = limit
        self._pairs = collections.OrderedDict()

    def add(self, pairs):
        """Add (partition, offset) pairs (a batch's, in order)."""
        known = self._pairs
        known.update(dict.fromkeys(pairs))
        excess = len(known) - self.limit
        for _ in range(excess):
            known.popitem(last=False)

    def __contains__(self, pair):
        return pair in self._pairs

    def __len__(self):
        return len(self._pairs)


def _per_topic(records):
    """{topic: how many of ``records``}: counters move once per batch, not per record."""
    out = {}
    for record in records:
        out[record.topic] = out.get(record.topic, 0) + 1
    return out
