"""The producer and consumer ids of topics unloaded a moment ago (by an admin's unload or a
move to another broker): for a while such an id is answered UNAVAILABLE ("look it up
again"), which clients retry with a new lookup, instead of NOT_FOUND, which the official
clients give up on. One instance, made by BrokerCore and handed to the components: the topic
table remembers (a release, a reload), the producer and subscription tables check."""

import time

from danube.broker.errors import TopicUnloaded

UNLOADED_ID_MEMORY = 60.0           # seconds; clients retry within their health-check period


class UnloadedIds:
    def __init__(self, memory=UNLOADED_ID_MEMORY):
        self.memory = memory
        self._ids = {}              # (kind, id) -> (topic name, until)

    def remember(self, topic):
        """Every producer and consumer of ``topic`` (being unloaded). Expired entries go at
        the same time, so the table holds no more than the last minute's clients."""
        now = time.monotonic()
        self._ids = {k: v for k, v in self._ids.items() if v[1] > now}
        until = now + self.memory
        for producer_id in topic.producers:
            self._ids[("producer", producer_id)] = (topic.name, until)
        for sub in topic.subscriptions.values():
            for consumer_id in sub.consumers:
                self._ids[("consumer", consumer_id)] = (topic.name, until)

    def check(self, kind, client_id):
        """Raise TopicUnloaded if ``client_id`` (a ``kind``: producer or consumer) belonged
        to a topic unloaded within the memory."""
        entry = self._ids.get((kind, client_id)) if self._ids else None
        if entry is not None and entry[1] > time.monotonic():
            raise TopicUnloaded(f"topic {entry[0]} was unloaded; look it up and create the "
                                f"{kind} again")
