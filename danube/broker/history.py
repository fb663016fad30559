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
from danube.broker.errors import (InvalidArgument, NotReliable, OffsetOutOfRange,
                                  StorageFailed, TopicNotFound)
from danube.broker.topic import RELIABLE
from danube.storage.errors import OffsetTruncatedError, WALClosedError, WALError

DEFAULT_BATCH = 1000
# A batch also stops before this many bytes of messages (it always holds one): gRPC clients
# refuse responses over 4 MiB by default (grpcio, grpc-java), and a batch of 1000 large
# messages would be far more.
BATCH_BYTES = 3 << 20


def _reliable(topic):
    if topic.delivery != RELIABLE:
        raise NotReliable(f"topic {topic.name} is non-reliable: it keeps no messages, so it "
                          f"has no offsets to read; use a reliable topic")
    return topic


async def topic_offsets(core, name):
    """(partitioned, [(partition's topic name, N, earliest, latest)]) of ``name``: itself,
    or every partition of a partitioned topic. ``latest`` is one past the newest message."""
    names.validate_topic(name, "topic")
    partitioned = name not in core.topics
    out = []
    for part_name in await core.partitions(name):
        topic = _reliable(core.get_topic(part_name))
        split = names.split_partition(names.validate_topic(part_name)[1])
        index = split[1] if split is not None else 0
        log = topic.log
        out.append((part_name, index, log.earliest, topic.dispatchable_end))
    if not out:
        raise TopicNotFound(f"Unable to find the requested topic: {name}")
    return partitioned, out


async def open_range(core, name, start, end, max_messages=0, max_bytes=BATCH_BYTES):
    """A ``RangeReader`` of [start, min(end, latest)) of one reliable topic or partition.
    Raises before anything is read: NotReliable, TopicNotFound, InvalidArgument (end before
    start, or a partitioned topic's base name), OffsetOutOfRange (start below the earliest
    offset kept)."""
    if end < start:
        raise InvalidArgument(f"end_offset {end} is below start_offset {start}")
    topic = core.topics.get(name)
    if topic is None:
        parts = await core.partitions(name)
        if parts:
            raise InvalidArgument(f"topic: {name} is a partitioned topic; read its partitions "
                                  f"({parts[0]} .. {parts[-1]}) one at a time")
        topic = core.get_topic(name)          # TopicNotFound
    _reliable(topic)
    # Readers get what deliveries may carry: in mode `always`, only what a sync covers.
    end = min(end, topic.dispatchable_end)
    earliest = topic.log.earliest
    if start < end and start < earliest:
        raise _out_of_range(topic.name, start, min(end, earliest), earliest)
    return RangeReader(topic, start, max(start, end), max_messages or DEFAULT_BATCH,
                       max_bytes)


def _out_of_range(name, start, resume, earliest):
    return OffsetOutOfRange(f"offsets {start}..{resume - 1} of {name} are gone (deleted by "
                            f"retention, and no durable tier holds them); the earliest offset "
                            f"kept is {earliest}")


class RangeReader:
    """Batches of canonical StreamMessage bytes, in offset order, until the range is read.
    ``close`` (always: at the end, on error or cancellation) stops any durable-tier fetch."""

    def __init__(self, topic, start, end, max_messages, max_bytes):
        self.topic = topic
        self.next = start
        self.end = end
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._ready = asyncio.Event()
        self._reader = topic.log.reader(self._ready.set)
        self._pending = []        # (offset, stored bytes) read but not yet batched

    async def next_batch(self):
        """The next batch (a list of bytes), or None when the range is read."""
        out = []
        size = 0
        stamp = self.topic.delivery_stamp
        while len(out) < self.max_messages:
            if not self._pending:
                if self.next >= self.end:
                    break
                self._pending = await self._read(self.max_messages - len(out))
                if not self._pending:
                    break
                self._pending.reverse()       # popped from the end, in offset order
            offset, stored = self._pending[-1]
            if out and size + len(stored) > self.max_bytes:
                break
            self._pending.pop()
            out.append(canonical_stream_message(stored, stamp))
            size += len(stored)
        return out or None

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
