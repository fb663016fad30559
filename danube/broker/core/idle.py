"""Which loaded topics nobody uses, and which of them to unload now (the topic table does
the unloading). A topic is in use while it has a producer whose connection is open (or one
made in-process, without a connection), an active consumer (its stream open, or within the
stream grace), or a non-reliable subscription (kept until the idle reaper removes it); a
publish without a producer (a dead letter, an edge's replication) is use too. Reliable
subscriptions without active consumers do not keep a topic loaded: their cursors are in
metadata and come back with it, and a consumer id of the unloaded topic is answered "look
it up again" (UnloadedIds), which the clients follow by subscribing again.

An idle topic is unloaded once idle for ``timeout`` seconds (0: never by age) and, beyond
``max_idle`` idle topics loaded, the longest idle first (least recently used), so memory
and descriptors stay bounded however many topics exist."""

import heapq

from danube.broker.placement import SYSTEM_TOPIC

#: A topic idle for less than this is not unloaded even beyond the bound: a client that
#: just looked it up, loaded it, or is between Subscribe's steps gets to use it.
SETTLE_SECONDS = 2.0


def in_use(topic):
    for producer in topic.producers.values():
        client = producer.client
        if client is None or not client.closed:
            return True
    for sub in topic.subscriptions.values():
        if sub.dispatcher is None:
            return True
        for consumer in sub.consumers.values():
            if consumer.active:
                return True
    return False


class IdleTopics:
    def __init__(self, timeout, max_idle):
        self.timeout = timeout          # seconds; 0: never by age
        self.max_idle = max_idle

    @property
    def interval(self):
        """How often to look (seconds)."""
        return min(1.0, self.timeout / 4) if self.timeout > 0 else 1.0

    def due(self, topics, now):
        """The topics among ``topics`` (loaded ones) to unload at ``now``
        (time.monotonic()). Marks each topic's ``idle_since`` (None while in use)."""
        idle, unsettled = [], 0
        settle = min(SETTLE_SECONDS, self.timeout) if self.timeout > 0 else SETTLE_SECONDS
        for topic in topics:
            if topic.closed or topic.name == SYSTEM_TOPIC:
                continue
            if topic.messages_in != topic.idle_mark or in_use(topic):
                topic.idle_mark = topic.messages_in
                topic.idle_since = None
                continue
            if topic.idle_since is None:
                topic.idle_since = now
            if now - topic.idle_since >= settle:
                idle.append(topic)
            else:
                unsettled += 1
        if self.timeout > 0:
            chosen = [t for t in idle if now - t.idle_since >= self.timeout]
            rest = [t for t in idle if now - t.idle_since < self.timeout]
        else:
            chosen, rest = [], idle
        # Every idle topic loaded counts toward the bound, settled or not.
        excess = len(rest) + unsettled - self.max_idle
        if excess > 0 and rest:
            chosen.extend(heapq.nsmallest(excess, rest, key=lambda t: t.idle_since))
        return chosen
