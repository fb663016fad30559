"""Helpers for tests that publish a backlog with our client and drain it in batches."""

import asyncio


async def publish(producer, n):
    """``n`` messages ``m0``..``m{n-1}``, 1,000 per batched send."""
    for first in range(0, n, 1000):
        await producer.send_many([b"m%d" % i for i in range(first, min(n, first + 1000))])


async def nothing_more(consumer, wait=0.7):
    """The offsets of whatever else arrives within ``wait`` seconds (expected: none)."""
    try:
        extra = await consumer.receive_many(100, timeout=wait)
    except (asyncio.TimeoutError, TimeoutError):
        return []
    return [m.msg_id.topic_offset for m in extra]
