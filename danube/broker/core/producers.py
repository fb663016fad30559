"""The core's producers: creating one (and the topic, when auto-creation is on), finding one
by id. A mixin of BrokerCore (see broker.py)."""

from danube.broker import names
from danube.broker.core.ids import random_id
from danube.broker.errors import (DispatchMismatch, InvalidArgument, ProducerLimit,
                                  ProducerNotFound, TopicNotFound)
from danube.broker.topic import DELIVERY_NAMES, Producer
from danube.metadata import keys


class Producers:
    async def create_producer(self, topic_name, producer_name, delivery, access_mode=0,
                              schema_subject=None):
        names.validate_topic(topic_name)
        names.validate_client_name(producer_name, "producer_name")
        if delivery not in DELIVERY_NAMES:
            raise InvalidArgument(f"dispatch_strategy: unknown value {delivery}")
        if schema_subject:
            # Before the topic is auto-created: a refused producer creates nothing.
            await self.check_producer_subject(schema_subject)
        topic = self.topics.get(topic_name)
        created = None
        if topic is None:
            self.placement.check_elsewhere(topic_name)
        if topic is None:
            if not self.cfg.auto_create_topics:
                raise TopicNotFound(f"Unable to find the requested topic: {topic_name}")
            async with self._lock:
                topic = self.topics.get(topic_name)
                if topic is None:
                    await self._check_partition_conflict(topic_name)
                    topic = created = await self._create_topic(topic_name, delivery)
        try:
            if schema_subject:
                await self.bind_producer_subject(topic, schema_subject)
            return await self._add_producer(topic, producer_name, delivery, access_mode)
        except BaseException:
            if created is not None and not created.producers and not created.subscriptions:
                async with self._lock:
                    await self._discard_topic(created)
            raise

    async def _add_producer(self, topic, producer_name, delivery, access_mode):
        topic_name = topic.name
        if topic.delivery != delivery:
            raise DispatchMismatch("Producer requested dispatch strategy does not match "
                                   f"topic strategy ({DELIVERY_NAMES[delivery]} requested, "
                                   f"topic {topic_name} is {topic.delivery_name})")
        existing = topic.producers_by_name.get(producer_name)
        if existing is not None:
            existing.active = True
            return existing.producer_id
        policies = topic.policies
        if policies.max_producers_per_topic and \
                len(topic.producers) >= policies.max_producers_per_topic:
            raise ProducerLimit(f"topic {topic_name} already has {len(topic.producers)} "
                                f"producers (max_producers_per_topic)")
        producer_id = random_id(self.producers)
        producer = Producer(producer_id, producer_name, topic, access_mode)
        topic.producers[producer_id] = producer
        topic.producers_by_name[producer_name] = producer
        self.producers[producer_id] = producer
        self.registry.add_producer(producer_id, producer)
        try:
            await self.store.put(keys.topic_producer(topic_name, producer_id), {
                "producer_id": producer_id, "producer_name": producer_name,
                "topic_name": topic_name, "access_mode": access_mode, "status": True})
        except BaseException:
            # The client is told the producer does not exist, so it must not exist.
            del topic.producers[producer_id]
            del topic.producers_by_name[producer_name]
            del self.producers[producer_id]
            self.registry.remove_producer(producer_id)
            raise
        return producer_id

    def producer(self, producer_id):
        producer = self.producers.get(producer_id)
        if producer is None:
            self.check_unloaded("producer", producer_id)
            raise ProducerNotFound(f"The producer with id {producer_id} does not exist")
        return producer
