"""Our client's batched acks (danube.client.acks): a reader that acks a whole delivery batch
without ever awaiting anything else must still get each full batch's AckRanges call out
while it goes on, or the broker, its window full, waits for the end of the batch."""

import itertools
import types

import pytest

from danube.client import Message, MsgId
from danube.client.acks import AckBatcher
from danube.client.consumer import Consumer


def _consumer(started):
    async def ack_ranges(request, timeout=None, metadata=None):
        started.append(list(request.ranges))

    topic_consumer = types.SimpleNamespace(
        _stub=types.SimpleNamespace(ack_ranges=ack_ranges), _ids=itertools.count(),
        topic="/default/t", _metadata=(), client=types.SimpleNamespace(rpc_timeout=5))
    consumer = Consumer.__new__(Consumer)
    consumer._only_acks = AckBatcher(topic_consumer, "s", batch=250, delay=60)
    return consumer


@pytest.mark.asyncio
async def test_a_full_batch_is_on_its_way_before_ack_returns():
    started = []
    consumer = _consumer(started)
    for offset in range(600):
        await consumer.ack(Message(msg_id=MsgId(topic_offset=offset)))
        # Nothing else awaited: only ack() itself may have let the calls run.
        assert len(started) == (offset + 1) // 250
    assert started == [[0, 249], [250, 499]]
    consumer._only_acks.cancel()
