"""BrokerCore: the broker core, composed of one object per job, and its lifecycle.
Namespaces, topics, producers, subscriptions and consumers persist through the MetadataStore
with upstream's key layout. The components raise typed errors (danube.broker.errors); the
services map them to status codes.

Each component owns its state and is reached by the others only through public methods,
given to it at construction (the topic table, which the others build on, is told of the
producer and subscription tables and the schema bindings by ``attach``):

- ``namespaces`` (namespaces.py): namespaces and the policies topics start with;
- ``topic_table`` (topics.py): the topics served here, their lock, creating, deleting,
  loading, unloading and reloading them, lookup, what a placement drives;
- ``producer_table`` (producers.py): producers by id;
- ``subscription_table`` (subscriptions.py): subscriptions, consumers by id, cursors,
  dead-lettering, delivery windows, the idle reaper;
- ``topic_schemas`` (schemas.py): topics' schema bindings;
- ``admin`` (admin.py): what the admin API asks beyond those (brokers, describing,
  unloading, live subscription settings, statistics, the rate sampler).

Where a topic lives is its placement's answer (danube.broker.placement: this broker alone,
or another implementation), received at construction; the reliable topics' logs are the LogManager's
(danube.storage.logs); the ids of unloaded topics are UnloadedIds' (unloaded.py); this
broker's id is BrokerIdentity's (identity.py).

BrokerCore itself only wires and runs them. Its other members are a facade, each a
delegation or a read: the PlacementHost members a placement drives, what a Topic asks of its
broker (``cfg``, ``consumer_removed``), the tables the exporter and permission checks read
(``topics``, ``producers``, ``consumers``), the logs' owner's state the exporter reads, and
the client-level calls (and the reaper's grace) the tests drive the core with. The services
go to the components."""

import asyncio
import logging

from danube.broker.core.admin import Admin
from danube.broker.core.identity import BrokerIdentity
from danube.broker.core.namespaces import Namespaces
from danube.broker.core.producers import ProducerTable
from danube.broker.core.schemas import TopicSchemas
from danube.broker.core.subscriptions import SubscriptionTable
from danube.broker.core.topics import TopicTable
from danube.broker.core.unloaded import UnloadedIds
from danube.broker.errors import BrokerShuttingDown
from danube.broker.placement import Standalone
from danube.broker.schemas.registry import SchemaRegistry
from danube.broker.topic import NON_RELIABLE, Topic
from danube.failure_policy import FailurePolicy
from danube.storage.logs import LogManager
from danube.tasks import TaskSet

log = logging.getLogger("danube.broker")

# A graceful shutdown waits this long for the last segments to reach the durable tier.
SHUTDOWN_UPLOAD_TIMEOUT = 30.0


class BrokerCore:
    def __init__(self, cfg, store, registry, loop=None, *, placement=None):
        self.cfg = cfg
        self.store = store
        self.registry = registry
        self.loop = loop or asyncio.get_event_loop()
        # Where topics live (danube.broker.placement): every question whose answer depends
        # on other brokers goes there. A single broker serves every topic.
        self.placement = placement if placement is not None else Standalone(store)
        self.placement.bind(self)
        self.schemas = SchemaRegistry(store)
        self.identity = BrokerIdentity(cfg.data_dir)
        self.unloaded = UnloadedIds()     # ids of topics unloaded a moment ago
        # The reliable topics' logs: opened, deleted, kept (retention) by their owner.
        self.logs = LogManager(cfg, store)
        # The idle-subscription reaper, the rate sampler and the idle-topic unloader.
        self._tasks = TaskSet("broker core", self.loop)

        self.namespaces = Namespaces(cfg, store)
        self.topic_table = TopicTable(
            cfg, store, namespaces=self.namespaces, placement=self.placement, logs=self.logs,
            unloaded=self.unloaded, identity=self.identity,
            new_topic=lambda name, delivery: Topic(self, name, delivery))
        self.topic_schemas = TopicSchemas(store, self.schemas, topic_table=self.topic_table)
        self.producer_table = ProducerTable(
            cfg, store, registry, placement=self.placement, topic_table=self.topic_table,
            schemas=self.topic_schemas, unloaded=self.unloaded)
        self.subscription_table = SubscriptionTable(
            cfg, store, registry, self.loop, topic_table=self.topic_table,
            unloaded=self.unloaded,
            default_failure_policy=cfg.failure_policy or FailurePolicy())
        self.topic_table.attach(self.topic_schemas, self.producer_table,
                                self.subscription_table)
        self.admin = Admin(store, self.schemas, placement=self.placement,
                           namespaces=self.namespaces, topic_table=self.topic_table,
                           identity=self.identity)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self):
        self.identity.load()
        await self.logs.start()
        for ns in dict.fromkeys(["default", "system", *self.cfg.bootstrap_namespaces]):
            await self.namespaces.ensure_namespace(ns)
        await self.placement.on_start()
        await self.topic_table.create_system_topic()
        self._tasks.spawn(self.subscription_table.reap_idle(), name="idle-subscription reaper")
        self._tasks.spawn(self.admin.sample_rates(), name="rate sampler")
        self._tasks.spawn(self.topic_table.unload_idle(), name="idle-topic unloader")
        self.logs.start_retention(self.topic_table.retained_logs)

    async def register(self):
        """Announce this broker (its placement's ``join``); called once the servers are
        bound, so the ports are real even when the configuration asked for port 0."""
        await self.placement.join()

    async def stop(self):
        await self.placement.leave()
        await self._tasks.close()
        await self.logs.stop_retention()
        # Producers stop first so the segments sealed now are the last ones uploaded.
        self.topic_table.stop_publishing()
        if await self.logs.flush(SHUTDOWN_UPLOAD_TIMEOUT):
            log.info("shutdown: every reliable topic is in the durable tier")
        await self.topic_table.close_all(BrokerShuttingDown("the broker is shutting down"))
        await self.logs.close()

    # -- the facade: what a placement drives (danube.broker.placement.PlacementHost) ------

    @property
    def broker_id(self):
        return self.identity.value

    def registration_record(self):
        return {
            "broker_url": self.cfg.advertised_broker_url,
            "connect_url": self.cfg.advertised_connect_url,
            "admin_addr": f"{self.cfg.admin_scheme}://{self.cfg.admin_host}:{self.cfg.admin_port}",
            **({"prom_exporter": f"{self.cfg.prom_host}:{self.cfg.prom_port}"}
               if self.cfg.prom_port is not None else {}),
        }

    async def load_recorded_topics(self):
        await self.topic_table.load_recorded_topics()

    def served_topics(self):
        return self.topic_table.served_topics()

    def serves(self, name):
        return self.topic_table.serves(name)

    def served(self, name):
        return self.topic_table.served(name)

    def topic_summaries(self):
        return self.topic_table.topic_summaries()

    async def serve_topic(self, name):
        await self.topic_table.serve_topic(name)

    async def release_topic(self, name, reason, upload_timeout=None, fenced=False):
        return await self.topic_table.release_topic(name, reason, upload_timeout, fenced)

    async def upload_released(self, name, upload_timeout):
        await self.topic_table.upload_released(name, upload_timeout)

    async def delete_topic_data(self, name):
        await self.topic_table.delete_topic_data(name)

    def local_logs(self):
        return self.logs.local_topics()

    async def set_aside_past_ownership(self, name):
        await self.logs.set_aside_past_ownership(name)

    # -- the facade: what a Topic's subscriptions tell their broker ----------------------

    def consumer_removed(self, consumer):
        self.subscription_table.consumer_removed(consumer)

    # -- the facade: the tables (read by the exporter, permission checks and tests) ------

    @property
    def topics(self):
        """name -> Topic served here."""
        return self.topic_table.topics

    @property
    def producers(self):
        """producer_id -> Producer."""
        return self.producer_table.producers

    @property
    def consumers(self):
        """consumer_id -> Consumer."""
        return self.subscription_table.consumers

    # What the exporter and the tests read of the logs' owner.
    @property
    def tiered(self):
        return self.logs.tiered

    @property
    def write_buffer(self):
        return self.logs.write_buffer

    @property
    def wal_root(self):
        return self.logs.root

    # -- the facade: client-level calls (the tests drive the core so) ---------------------

    async def create_topic(self, name, delivery=NON_RELIABLE):
        return await self.topic_table.create_topic(name, delivery)

    async def create_partitioned_topic(self, base, partitions, delivery=NON_RELIABLE):
        return await self.topic_table.create_partitioned_topic(base, partitions, delivery)

    async def delete_topic(self, name):
        await self.topic_table.delete_topic(name)

    async def partitions(self, name):
        return await self.topic_table.partitions(name)

    def get_topic(self, name):
        return self.topic_table.get_topic(name)

    async def namespace_topics(self, ns):
        return await self.namespaces.namespace_topics(ns)

    async def create_producer(self, topic_name, producer_name, delivery, access_mode=0,
                              schema_subject=None):
        return await self.producer_table.create_producer(
            topic_name, producer_name, delivery, access_mode, schema_subject)

    def producer(self, producer_id):
        return self.producer_table.producer(producer_id)

    async def subscribe(self, topic_name, consumer_name, sub_name, sub_type, key_filters=(),
                        client=None):
        return await self.subscription_table.subscribe(
            topic_name, consumer_name, sub_name, sub_type, key_filters, client)

    def consumer(self, consumer_id):
        return self.subscription_table.consumer(consumer_id)

    async def dead_letter(self, topic, sub, policy, delivery, attempts, reason):
        await self.subscription_table.dead_letter(topic, sub, policy, delivery, attempts,
                                                  reason)

    @property
    def idle_subscription_grace(self):
        """Seconds an idle consumer or non-reliable subscription is kept (the reaper's)."""
        return self.subscription_table.idle_subscription_grace

    @idle_subscription_grace.setter
    def idle_subscription_grace(self, seconds):
        self.subscription_table.idle_subscription_grace = seconds
