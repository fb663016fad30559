"""Topic and subscription statistics for operators (served as danube_ext.TopicStatsService):
counters the publish and delivery paths already keep, read here, plus rates from a sampler
that BrokerCore runs every SAMPLE_INTERVAL seconds. Nothing here runs per message.

Values are plain dicts with the field names of protocol/DanubeExt.proto's TopicStats,
LogStats, SubscriptionStats and ConsumerStats, so the service builds its messages from them
without a second naming."""

import collections
import time

from danube.broker.topic import RELIABLE

SAMPLE_INTERVAL = 2.0
# Rates are over the last WINDOW_SAMPLES - 1 intervals (~8 s): long enough to be steady, short
# enough that a console refreshing every 2 s sees a burst within a few seconds.
WINDOW_SAMPLES = 5


class RateWindow:
    """The last few (time, counter...) samples of one object; rates are the slope between the
    oldest and the newest."""

    __slots__ = ("_samples",)

    def __init__(self):
        self._samples = collections.deque(maxlen=WINDOW_SAMPLES)

    def sample(self, now, *counters):
        self._samples.append((now, counters))

    def rates(self, width):
        samples = self._samples
        if len(samples) < 2:
            return (0.0,) * width
        (t0, first), (t1, last) = samples[0], samples[-1]
        span = t1 - t0
        if span <= 0:
            return (0.0,) * width
        return tuple(max(0.0, (b - a) / span) for a, b in zip(first, last))


def _meter(obj):
    meter = obj.rate_window
    if meter is None:
        meter = obj.rate_window = RateWindow()
    return meter


def sample_all(topics, now=None):
    """Take one sample of every topic's and subscription's counters (the sampler's tick)."""
    now = time.monotonic() if now is None else now
    for topic in topics:
        _meter(topic).sample(now, topic.messages_in, topic.bytes_in)
        for sub in topic.subscriptions.values():
            _meter(sub).sample(now, _messages_out(sub))


def _messages_out(sub):
    return sum(c.outbox.delivered for c in sub.consumers.values())


def subscription_stats(sub, detail=True):
    dispatcher = sub.dispatcher
    consumers = list(sub.consumers.values())
    if dispatcher is not None:
        backlog = dispatcher.lag
        unacked = len(dispatcher.inflight)
        redelivered = dispatcher.stats["redelivered"]
        cursor = dispatcher.cursor
    else:
        # Nothing is kept: what is behind is what waits in the consumers' outboxes.
        backlog = sum(c.outbox.count for c in consumers)
        unacked = redelivered = 0
        cursor = -1
    stats = {"name": sub.name, "type": sub.type_name,
             "consumers": sum(1 for c in consumers if c.active),
             "backlog": backlog, "unacked": unacked, "redelivered": redelivered,
             "cursor": cursor, "messages_out": _messages_out(sub),
             "msg_rate_out": _meter(sub).rates(1)[0]}
    if detail:
        stats["consumer_list"] = [
            {"consumer_id": c.consumer_id, "name": c.name, "connected": c.active,
             "messages_out": c.outbox.delivered, "bytes_out": c.outbox.delivered_bytes,
             "dropped": c.outbox.dropped} for c in consumers]
    return stats


def topic_stats(topic, broker_id, detail=True):
    """``detail``: with each subscription (GetTopicStats); without, only the totals
    (ListTopicStats, which may cover thousands of topics)."""
    subs = [subscription_stats(s, detail) for s in topic.subscriptions.values()]
    msg_rate, byte_rate = _meter(topic).rates(2)
    stats = {"name": topic.name, "delivery": topic.delivery_name, "broker_id": str(broker_id),
             "messages_in": topic.messages_in, "bytes_in": topic.bytes_in,
             "msg_rate_in": msg_rate, "byte_rate_in": byte_rate,
             "producers": sum(1 for p in topic.producers.values() if p.active),
             "consumers": sum(s["consumers"] for s in subs),
             "subscription_count": len(subs),
             "backlog": max((s["backlog"] for s in subs), default=0)}
    if topic.delivery == RELIABLE and topic.log is not None:
        stats["log"] = dict(topic.log.stats(), durability=topic.durability or "")
    if detail:
        stats["subscriptions"] = subs
    gate = topic.schema
    if gate is not None and getattr(gate, "subject", None):
        stats["schema_subject"] = gate.subject
    return stats
