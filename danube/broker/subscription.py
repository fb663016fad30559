"""A named subscription of a topic: its type, its consumers, and how messages are spread
over them (the Cython fan-out objects in danube.broker._fanout)."""

import fnmatch
import re
import time

from danube.broker._fanout import ActiveFanout, KeySharedFanout, RoundRobinFanout
from danube.broker.errors import ConsumerLimit, SubscribeDenied

EXCLUSIVE, SHARED, FAILOVER, KEY_SHARED = 0, 1, 2, 3
TYPE_NAMES = {EXCLUSIVE: "Exclusive", SHARED: "Shared", FAILOVER: "Failover",
              KEY_SHARED: "KeyShared"}
TYPES_BY_NAME = {name: value for value, name in TYPE_NAMES.items()}


def key_matcher(patterns):
    """A predicate for KeyShared glob filters (`*` and `?`), or None when there are none."""
    if not patterns:
        return None
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return lambda key: regex.match(key) is not None


class Subscription:
    def __init__(self, topic, name, sub_type):
        if sub_type not in TYPE_NAMES:
            raise SubscribeDenied(f"unknown subscription type {sub_type}")
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.consumers = {}          # consumer_id -> Consumer, in join order
        self.by_name = {}
        self._matchers = {}          # consumer_id -> KeyShared filter predicate or None
        if sub_type == SHARED:
            self.fanout = RoundRobinFanout()
        elif sub_type == KEY_SHARED:
            self.fanout = KeySharedFanout()
        else:
            self.fanout = ActiveFanout()
        self.idle_since = time.monotonic()
        self.dispatcher = None       # ReliableDispatcher on a reliable topic
        self.rate_window = None      # its recent counters, for rates (danube.broker.stats)

    @property
    def type_name(self):
        return TYPE_NAMES[self.sub_type]

    def active_consumers(self):
        return [c for c in self.consumers.values() if c.active]

    def check_new_consumer(self, name, max_per_subscription):
        """Raise unless a consumer called `name` (not yet in the subscription) may join."""
        if self.sub_type == EXCLUSIVE and self.active_consumers():
            holder = self.active_consumers()[0].name
            raise SubscribeDenied(
                f"subscription {self.name!r} is Exclusive and already has consumer {holder!r}")
        if max_per_subscription and len(self.active_consumers()) >= max_per_subscription:
            raise ConsumerLimit(f"subscription {self.name!r} already has "
                                f"{max_per_subscription} consumers "
                                f"(max_consumers_per_subscription)")

    def add(self, consumer):
        if self.sub_type == EXCLUSIVE:
            # An inactive consumer left behind by a dead client gives way to the new one.
            for stale in list(self.consumers.values()):
                self.remove(stale)
        self.consumers[consumer.consumer_id] = consumer
        self.by_name[consumer.name] = consumer
        self._matchers[consumer.consumer_id] = key_matcher(consumer.key_filters)
        self.consumer_changed(consumer)
        if self.dispatcher is not None:
            self.dispatcher.consumer_joined()

    def remove(self, consumer, reason=None):
        if self.consumers.pop(consumer.consumer_id, None) is None:
            return
        self._matchers.pop(consumer.consumer_id, None)
        if self.by_name.get(consumer.name) is consumer:
            del self.by_name[consumer.name]
        self.topic.broker.consumer_removed(consumer)
        consumer.close(reason)
        self.consumer_changed(consumer)

    def consumer_changed(self, consumer=None):
        """Recompute who receives: called whenever a consumer joins, leaves, or its stream
        comes or goes."""
        active = self.active_consumers()
        if active:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()
        if self.dispatcher is not None and consumer is not None and not consumer.active:
            self.dispatcher.consumer_left(consumer)
            self.dispatcher.flush_cursor_soon()
        if self.sub_type == KEY_SHARED:
            self.fanout.set_consumers([c.outbox for c in active], [c.name for c in active],
                                      [self._matchers.get(c.consumer_id) for c in active])
        else:
            # Exclusive and Failover deliver to the first active consumer in join order, so
            # when it leaves the next one is promoted.
            self.fanout.set_outboxes([c.outbox for c in active])
        if self.dispatcher is not None:
            self.dispatcher.notify()

    def takes_key(self, key):
        """KeyShared: whether some consumer of the subscription, connected or not yet
        removed after its stream ended, accepts `key` by its filters."""
        return any(m is None or m(key) for m in self._matchers.values())

    def close(self, reason=None):
        for consumer in list(self.consumers.values()):
            self.remove(consumer, reason)
