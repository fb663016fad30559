"""Offset-addressed reads of reliable topics (danube_ext.TopicHistory): the offsets each
partition holds, and the messages of an offset range, for readers that keep their own
position (the Spark connector).

A range is read through its own ``TopicLogReader`` (hot cache, WAL files, then the durable
tier), never through a subscription: no cursor moves, nothing is acked or delivered, and
retention does not wait for it. Messages go out as deliveries do: canonical form with the
topic's delivery stamp (msg_id.topic_name and broker_addr, which the stored form leaves out).
"""

import asyncio

from danube.broker import names
from danube.broker._canon import canonical_stream_message
from danube.broker._columns import columnar_batch, fitting
from danube.broker.errors import (InvalidArgument, NotReliable, OffsetOutOfRange,
                                  StorageFailed, TopicNotFound)
from danube.broker.topic import RELIABLE
from danube.storage.errors import OffsetTruncatedError, WALClosedError, WALError

DEFAULT_BATCH = 1000
# Columns cost a reader nothing per message, so their batches are larger by default.
DEFAULT_COLUMNAR_BATCH = 8192
# A batch also stops before this many bytes of messages (it always holds one): gRPC clients
# refuse responses over 4 MiB by default (grpcio, grpc-java), and a batch of 1000 large
# messages would be far more.
BATCH_BYTES = 3 << 20
# What a message adds to a columnar batch beside its stored bytes: its offsets and fixed-width
# values (the stored form's tags and lengths, which the columns drop, make up the rest).
COLUMN_OVERHEAD = 40


def _reliable(topic):
    if topic.delivery != RELIABLE:
        raise NotReliable(f"topic {topic.name} is non-reliable: it keeps no messages, so it "
                          f"has no offsets to read; use a reliable topic")
    return topic


async def topic_offsets(topic_table, name):
    """(partitioned, [(partition's topic name, N, earliest, latest)]) of ``name``: itself,
    or every partition of a partitioned topic. ``latest`` is one past the newest message."""
    names.validate_topic(name, "topic")
    partitioned = not topic_table.serves(name)
    out = []
    for part_name in await topic_table.partitions(name):
        topic = _reliable(await topic_table.use(part_name))
        split = names.split_partition(names.validate_topic(part_name)[1])
        index = split[1] if split is not None else 0
        log = topic.log
        out.append((part_name, index, log.earliest, topic.dispatchable_end))
    if not out:
        raise TopicNotFound(f"Unable to find the requested topic: {name}")
    return partitioned, out


async def open_range(topic_table, name, start, end, max_messages=0, max_bytes=BATCH_BYTES,
                     columnar=False):
    """A ``RangeReader`` of [start, min(end, latest)) of one reliable topic or partition,
    whose batches are lists of messages, or serialized ReadRangeBatches when ``columnar``.
    Raises before anything is read: NotReliable, TopicNotFound, InvalidArgument (end before
    start, or a partitioned topic's base name), OffsetOutOfRange (start below the earliest
    offset kept)."""
    if end < start:
        raise InvalidArgument(f"end_offset {end} is below start_offset {start}")
    if not topic_table.serves(name):
        parts = await topic_table.partitions(name)
        if parts:
            raise InvalidArgument(f"topic: {name} is a partitioned topic; read its partitions "
                                  f"({parts[0]} .. {parts[-1]}) one at a time")
    topic = await topic_table.use(name)             # loaded if it rests; TopicNotFound
    _reliable(topic)
    # Readers get what deliveries may carry: in mode `always`, only what a sync covers.
    end = min(end, topic.dispatchable_end)
    earliest = topic.log.earliest
    if start < end and start < earliest:
        raise _out_of_range(topic.name, start, min(end, earliest), earliest)
    default = DEFAULT_COLUMNAR_BATCH if columnar else DEFAULT_BATCH
    return RangeReader(topic, start, max(start, end), max_messages or default, max_bytes,
                       columnar)


def _out_of_range(name, start, resume, earliest):
    return OffsetOutOfRange(f"offsets {start}..{resume - 1} of {name} are gone (deleted by "
                            f"retention, and no durable tier holds them); the earliest offset "
                            f"kept is {earliest}")


class RangeReader:
    """Batches of canonical StreamMessage bytes (or, when ``columnar``, each a serialized
    ReadRangeBatch of columns), in offset order, until the range is read. ``close`` (always: at the end,
    on error or cancellation) stops any durable-tier fetch."""

    def __init__(self, topic, start, end, max_messages, max_bytes, columnar=False):
        self.topic = topic
        self.columnar = columnar
        self.next = start
        self.end = end
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._ready = asyncio.Event()
        self._reader = topic.log.reader(self._ready.set)
        self._pending = []        # (offset, stored bytes) read, batched up to _at
        self._at = 0

    async def next_batch(self):
        """The next batch, or None when the range is read."""
        pairs = await self._next_pairs()
        if not pairs:
            return None
        if self.columnar:
            try:
                return columnar_batch(pairs)
            except ValueError as exc:
                raise StorageFailed(f"could not read {self.topic.name}: {exc}") from None
        stamp = self.topic.delivery_stamp
        return [canonical_stream_message(stored, stamp) for _, stored in pairs]

    async def _next_pairs(self):
        """Up to max_messages (offset, stored) pairs, in offset order, within max_bytes
        (at least one); [] when the range is read."""
        out = []
        budget = self.max_bytes
        extra = COLUMN_OVERHEAD if self.columnar else 0
        while len(out) < self.max_messages:
            if self._at == len(self._pending):
                if self.next >= self.end:
                    break
                self._pending, self._at = await self._read(self.max_messages - len(out)), 0
                if not self._pending:
                    break
            take, used = fitting(self._pending, self._at, self.max_messages - len(out),
                                 budget, extra, not out)
            out += self._pending[self._at:self._at + take]
            self._at += take
            budget -= used
            if self._at < len(self._pending):     # the byte budget is spent
                break
        return out

    async def _read(self, want):
        want = min(want, self.end - self.next)
        while True:
            self._ready.clear()
            try:
                got = self._reader.read(self.next, want)
            except OffsetTruncatedError as exc:
                # A hole in the middle: the durable tier lacks a segment the WAL deleted.
                raise _out_of_range(self.topic.name, self.next, exc.first_offset,
                                    self.topic.log.earliest) from None
            except WALClosedError:
                raise TopicNotFound(f"topic {self.topic.name} was deleted or unloaded while "
                                    f"it was read") from None
            except WALError as exc:
                raise StorageFailed(f"could not read {self.topic.name} at offset {self.next}: "
                                    f"{exc}") from exc
            if got is None:                   # history on its way from the durable tier
                await self._ready.wait()
                continue
            if not got:
                # Fewer messages than latest promised: the log shrank under us (a topic
                # recreated): end here rather than wait for offsets that may never come.
                self.end = self.next
                return []
            got = got[:self.end - self.next]
            self.next = got[-1][0] + 1
            return got

    def close(self):
        self._reader.close()
