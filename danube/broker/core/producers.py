"""The core's producers: the table of those connected here (by id), creating one (and its
topic, when auto-creation is on, through the topic table), finding one by id, and letting a
closed topic's producers go."""

from danube.broker import names
from danube.broker.core.ids import random_id
from danube.broker.errors import (DispatchMismatch, InvalidArgument, ProducerLimit,
                                  ProducerNotFound, TopicNotFound)
from danube.broker.topic import DELIVERY_NAMES, Producer
from danube.metadata import keys


class ProducerTable:
    def __init__(self, cfg, store, registry, *, placement, topic_table, schemas, unloaded):
        self.cfg = cfg
        self.store = store
        self.registry = registry            # ClientRegistry: the transport's view of ids
        self.placement = placement
        self.topic_table = topic_table      # TopicTable
        self.schemas = schemas              # TopicSchemas
        self.unloaded = unloaded            # UnloadedIds
        self.producers = {}                 # producer_id -> Producer

    async def create_producer(self, topic_name, producer_name, delivery, access_mode=0,
                              schema_subject=None, client=None):
        """``client``: the connection creating it (anything with ``closed``), None
        in-process; once it closes the producer no longer keeps its topic loaded."""
        names.validate_topic(topic_name)
        names.validate_client_name(producer_name, "producer_name")
        if delivery not in DELIVERY_NAMES:
            raise InvalidArgument(f"dispatch_strategy: unknown value {delivery}")
        if schema_subject:
            # Before the topic is auto-created: a refused producer creates nothing.
            await self.schemas.check_producer_subject(schema_subject)
        topic = self.topic_table.served(topic_name)
        created = None
        if topic is None:
            self.placement.check_elsewhere(topic_name)
            if not self.cfg.auto_create_topics:
                raise TopicNotFound(f"Unable to find the requested topic: {topic_name}")
            topic, made = await self.topic_table.get_or_create(topic_name, delivery)
            created = topic if made else None
        try:
            if schema_subject:
                await self.schemas.bind_producer_subject(topic, schema_subject)
            producer_id = await self._add_producer(topic, producer_name, delivery, access_mode,
                                                   client)
        except BaseException:
            if created is not None:
                await self.topic_table.discard_unused(created)
            raise
        if topic.closed:
            # Unloaded (idle) or moved while this call waited: the client looks it up and
            # creates the producer again, which loads the topic anew.
            raise topic.closed_error()
        return producer_id

    async def _add_producer(self, topic, producer_name, delivery, access_mode, client):
        topic_name = topic.name
        if topic.delivery != delivery:
            raise DispatchMismatch("Producer requested dispatch strategy does not match "
                                   f"topic strategy ({DELIVERY_NAMES[delivery]} requested, "
                                   f"topic {topic_name} is {topic.delivery_name})")
        existing = topic.producers_by_name.get(producer_name)
        if existing is not None:
            existing.active = True
            existing.client = client
            return existing.producer_id
        policies = topic.policies
        if policies.max_producers_per_topic and \
                len(topic.producers) >= policies.max_producers_per_topic:
            raise ProducerLimit(f"topic {topic_name} already has {len(topic.producers)} "
                                f"producers (max_producers_per_topic)")
        producer_id = random_id(self.producers)
        producer = Producer(producer_id, producer_name, topic, access_mode, client=client)
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
            self.unloaded.check("producer", producer_id)
            raise ProducerNotFound(f"The producer with id {producer_id} does not exist")
        return producer

    # -- told by the topic table ---------------------------------------------------------

    async def topic_loaded(self, topic):
        """A topic served again from metadata: the producers recorded for it are gone (their
        clients create them again)."""
        await self.store.delete_prefix(keys.topic_producers_prefix(topic.name))

    def topic_closed(self, topic):
        """A topic closes: its producers stop and their ids are forgotten."""
        for producer in topic.producers.values():
            producer.active = False
            self.producers.pop(producer.producer_id, None)
            self.registry.remove_producer(producer.producer_id)
