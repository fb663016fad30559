"""A topic served by this broker: its producers and subscriptions, and the publish path."""

import dataclasses

from danube._core import fanout
from danube.broker.errors import MessageTooLarge, PublishFailed
from danube.config import Policies

NON_RELIABLE, RELIABLE = 0, 1
DELIVERY_NAMES = {NON_RELIABLE: "NonReliable", RELIABLE: "Reliable"}


@dataclasses.dataclass
class Producer:
    producer_id: int
    name: str
    topic: "Topic"
    access_mode: int = 0
    active: bool = True
    sent: int = 0


class Topic:
    def __init__(self, broker, name, delivery=NON_RELIABLE):
        self.broker = broker
        self.name = name
        self.delivery = delivery
        self.producers = {}           # producer_id -> Producer
        self.producers_by_name = {}
        self.subscriptions = {}       # name -> Subscription
        self._fanouts = []
        self.closed = False
        self.policies = Policies()
        self.messages_in = 0
        self.bytes_in = 0

    @property
    def delivery_name(self):
        return DELIVERY_NAMES[self.delivery]

    def subscriptions_changed(self):
        self._fanouts = [s.fanout for s in self.subscriptions.values()]

    def publish(self, raw, payload_len, key):
        """Non-reliable publish: the producer's StreamMessage bytes go to every subscription
        as they are (upstream delivers them unchanged, topic_offset 0)."""
        if self.closed:
            raise PublishFailed(f"topic {self.name} is closed")
        limit = self.policies.max_message_size
        if limit and payload_len > limit:
            raise MessageTooLarge(f"message of {payload_len} bytes exceeds max_message_size "
                                  f"({limit} bytes) on {self.name}")
        self.messages_in += 1
        self.bytes_in += payload_len
        if self._fanouts:
            fanout(self._fanouts, raw, key)
