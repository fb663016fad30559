"""Range acknowledgements (danube_ext.BatchConsumer/AckRanges: danube.broker._window) against
the reliable dispatcher: gaps, duplicates, out-of-order and overlapping ranges, ranges past
what was delivered; and the batched Outbox framing (DeliveryBatch per stream message)."""

import pytest

from danube.broker._fanout import Outbox
from danube.broker._window import check_ranges
from danube.client._delivery import Message, MsgId, ack_ranges
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext

from reliable_memory import drain, make
from waiting import async_wait_for


async def delivered(n, window=100):
    topic, d, (c,), saved, _ = await make(window=window)
    for i in range(n):
        topic.publish(b"m%d" % i)
    await async_wait_for(lambda: len(d.inflight) == min(n, window))
    return topic, d, c, saved


@pytest.mark.asyncio
async def test_ranges_with_gaps_leave_the_gaps_in_flight():
    topic, d, c, _ = await delivered(20)
    assert d.ack_ranges([(0, 4), (8, 9), (15, 19)]) == 12
    assert d.cursor == 4
    assert sorted(d.inflight) == [5, 6, 7, 10, 11, 12, 13, 14]
    assert d.acked == {8, 9, 15, 16, 17, 18, 19}
    # Filling the gaps moves the cursor over everything acked above them.
    assert d.ack_ranges([(10, 14), (5, 7)]) == 8
    assert d.cursor == 19 and not d.acked and not d.inflight
    await d.close()


@pytest.mark.asyncio
async def test_duplicates_and_overlaps_count_once():
    topic, d, c, _ = await delivered(10)
    assert d.ack_ranges([(2, 5), (3, 6), (2, 2)]) == 5
    assert d.ack_ranges([(0, 9)]) == 5          # 0, 1, 7, 8, 9: the rest were acked
    assert d.ack_ranges([(0, 9)]) == 0
    assert d.cursor == 9 and not d.inflight and not d.acked
    await d.close()


@pytest.mark.asyncio
async def test_out_of_order_ranges_equal_acks_one_by_one():
    order = [(7, 9), (0, 0), (4, 5), (1, 3), (6, 6)]
    topic, d, c, _ = await delivered(10)
    assert d.ack_ranges(order) == 10
    topic2, d2, c2, _ = await delivered(10)
    for first, last in order:
        for o in range(first, last + 1):
            d2.ack(o)
    assert (d.cursor, d.acked, d.inflight) == (d2.cursor, d2.acked, d2.inflight) == (9, set(), {})
    await d.close()
    await d2.close()


@pytest.mark.asyncio
async def test_offsets_not_delivered_are_ignored():
    topic, d, c, _ = await delivered(30, window=10)      # 10 delivered, 20 waiting
    assert d.ack_ranges([(5, 1000)]) == 5
    assert d.cursor == -1 and d.acked == {5, 6, 7, 8, 9}
    # Acking the rest frees the window: the next ten are delivered, not skipped.
    assert d.ack_ranges([(0, 4)]) == 5
    assert d.cursor == 9
    await async_wait_for(lambda: sorted(d.inflight) == list(range(10, 20)))
    got = [m.msg_id.topic_offset for m in drain(c)]
    assert got == list(range(20))
    await d.close()


@pytest.mark.asyncio
async def test_ack_of_a_nacked_message_waiting_for_redelivery_settles_it():
    topic, d, c, _ = await delivered(3)
    d.nack(1, delay_ms=60_000)
    assert 1 in d.retry_payloads
    assert d.ack_ranges([(0, 2)]) == 3
    assert d.cursor == 2 and not d.retry_payloads
    await d.close()


@pytest.mark.asyncio
async def test_cursor_is_saved_after_range_acks():
    topic, d, c, saved = await delivered(5)
    d.ack_ranges([(0, 4)])
    await d.flush_cursor()
    assert saved[-1] == 4
    await d.close()


@pytest.mark.asyncio
async def test_out_of_order_acks_survive_a_restart():
    stored = []

    async def on_acked(ranges):
        stored.append(ranges)
    topic, d, (c,), saved, _ = await make(window=100, on_acked=on_acked)
    for i in range(20):
        topic.publish(b"m%d" % i)
    await async_wait_for(lambda: len(d.inflight) == 20)
    d.ack_ranges([(0, 2), (5, 9), (12, 12), (15, 19)])
    await d.flush_cursor()
    assert saved[-1] == 2 and stored[-1] == [[5, 9], [12, 12], [15, 19]]
    await d.close()
    # The broker restarts: the same log, the stored cursor and acks.
    topic.subs.clear()
    _, d2, (c2,), _, _ = await make(window=100, topic=topic, cursor=saved[-1],
                                    on_acked=on_acked, acked=stored[-1])
    await async_wait_for(lambda: len(d2.inflight) == 6)
    assert [m.msg_id.topic_offset for m in drain(c2)] == [3, 4, 10, 11, 13, 14]
    d2.ack_ranges([(3, 4), (10, 11), (13, 14)])
    assert d2.cursor == 19 and not d2.acked
    await d2.flush_cursor()
    assert stored[-1] == []
    await d2.close()


def test_check_ranges_refuses_odd_and_backwards():
    assert check_ranges([1, 3, 5, 5]) == [(1, 3), (5, 5)]
    with pytest.raises(ValueError, match="pairs"):
        check_ranges([1, 2, 3])
    with pytest.raises(ValueError, match="backwards"):
        check_ranges([4, 3])
    with pytest.raises(ValueError, match="past any offset"):
        check_ranges([0, (1 << 64) - 1])


def at(*offsets):
    return [Message(msg_id=MsgId(topic_offset=o)) for o in offsets]


def test_client_ranges_merge_sorted_runs():
    assert ack_ranges(at(5, 3, 4, 9, 1, 1, 10)) == [1, 1, 3, 5, 9, 10]
    assert ack_ranges(at(1, 2, 3, 7, 8, 20)) == [1, 3, 7, 8, 20, 20]     # in order: no sort
    assert ack_ranges(at(4, 4)) == [4, 4]
    assert ack_ranges(at(2**64 - 2, 2**64 - 1)) == [2**64 - 2, 2**64 - 1]
    assert ack_ranges([]) == []


def test_client_ranges_refuse_what_is_not_a_delivered_message():
    with pytest.raises(TypeError):
        ack_ranges([object()])


def messages(n, size=100):
    return [pb.StreamMessage(request_id=i, payload=bytes(size)).SerializeToString()
            for i in range(n)]


def batches(data):
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos + 1:pos + 5], "big")
        out.append(ext.DeliveryBatch.FromString(data[pos + 5:pos + 5 + n]))
        pos += 5 + n
    return out


def test_batched_outbox_packs_delivery_batches_of_bounded_size():
    box = Outbox(16 << 20)
    box.set_batched(True)
    sent = messages(6000)
    for m in sent:
        assert box.offer(m)
    assert box.count == 6000
    got = batches(bytes(box.take()))
    assert len(got) > 1                       # ~256 KiB each, not one huge message
    assert [m.SerializeToString() for b in got for m in b.messages] == sent
    assert box.count == 0 and box.buffered == 0


def test_switching_framing_keeps_waiting_messages():
    box = Outbox()
    sent = messages(5)
    for m in sent[:3]:
        box.offer(m)
    box.set_batched(True)
    for m in sent[3:]:
        box.offer(m)
    assert box.messages() == sent and box.count == 5
    box.set_batched(False)
    assert box.messages() == sent
    data = bytes(box.take())
    assert data.count(b"\x00\x00\x00\x00") >= 5 and box.count == 0
