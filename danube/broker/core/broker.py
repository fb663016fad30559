"""BrokerCore: the broker core, and its lifecycle. Namespaces, topics, producers,
subscriptions and consumers persist through the MetadataStore with upstream's key layout. It
raises typed errors (danube.broker.errors); the services map them to status codes.

Where a topic lives is its placement's answer (danube.broker.placement: one broker, or a
cluster's), received at construction; the reliable topics' logs are the LogManager's
(danube.storage.logs); the ids of unloaded topics are UnloadedIds' (unloaded.py). The rest is
one object whose methods are grouped by job, one module per group (a mixin each, sharing the
core's tables and lock): topics.py (namespaces, topics, partitioned topics, lookup, what a
placement drives), producers.py, subscriptions.py (subscriptions, consumers, cursors,
dead-letter, the idle reaper), schemas.py (topics' schema bindings) and admin.py (brokers,
describing, unloading, unsubscribing, live policy changes, statistics)."""

import asyncio
import logging
import os
import secrets

from danube.broker.core.admin import Admin
from danube.broker.core.producers import Producers
from danube.broker.core.schemas import TopicSchemas
from danube.broker.core.subscriptions import IDLE_SUBSCRIPTION_GRACE, Subscriptions
from danube.broker.core.topics import Topics
from danube.broker.core.unloaded import UnloadedIds
from danube.broker.errors import BrokerShuttingDown
from danube.broker.placement import SYSTEM_TOPIC, Standalone
from danube.broker.schemas.registry import SchemaRegistry
from danube.broker.topic import NON_RELIABLE
from danube.dirsync import fsync_dir
from danube.failure_policy import FailurePolicy
from danube.storage.logs import LogManager
from danube.tasks import TaskSet

log = logging.getLogger("danube.broker")

# A graceful shutdown waits this long for the last segments to reach the durable tier.
SHUTDOWN_UPLOAD_TIMEOUT = 30.0


class BrokerCore(Topics, Producers, Subscriptions, TopicSchemas, Admin):
    def __init__(self, cfg, store, registry, loop=None, *, placement=None):
        self.cfg = cfg
        # Where topics live (danube.broker.placement): every question whose answer depends
        # on other brokers goes there. A single broker serves every topic.
        self.placement = placement if placement is not None else Standalone(store)
        self.placement.bind(self)
        self.store = store
        self.registry = registry
        self.schemas = SchemaRegistry(store)
        self.loop = loop or asyncio.get_event_loop()
        self.topics = {}                  # name -> Topic
        self.producers = {}               # producer_id -> Producer
        self.consumers = {}               # consumer_id -> Consumer
        self.unloaded = UnloadedIds()     # ids of topics unloaded a moment ago
        self.broker_id = None
        self._tasks = TaskSet("broker core", self.loop)   # the reaper and the rate sampler
        self._lock = asyncio.Lock()       # serialises topic creation and deletion
        self.idle_subscription_grace = IDLE_SUBSCRIPTION_GRACE
        # The reliable topics' logs: opened, deleted, kept (retention) by their owner.
        self.logs = LogManager(cfg, store)
        self.default_failure_policy = cfg.failure_policy or FailurePolicy()

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

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self):
        self.broker_id = self._load_broker_id()
        await self.logs.start()
        for ns in dict.fromkeys(["default", "system", *self.cfg.bootstrap_namespaces]):
            await self._ensure_namespace(ns)
        await self.placement.on_start()
        if SYSTEM_TOPIC not in self.topics:
            await self._create_topic(SYSTEM_TOPIC, NON_RELIABLE)
        self._tasks.spawn(self._reap_idle_subscriptions(), name="idle-subscription reaper")
        self._tasks.spawn(self._sample_rates(), name="rate sampler")
        self.logs.start_retention(self._retained_logs)

    async def register(self):
        """Announce this broker (its placement's ``join``); called once the servers are
        bound, so the ports are real even when the configuration asked for port 0."""
        await self.placement.join()

    def registration_record(self):
        return {
            "broker_url": self.cfg.advertised_broker_url,
            "connect_url": self.cfg.advertised_connect_url,
            "admin_addr": f"{self.cfg.admin_scheme}://{self.cfg.admin_host}:{self.cfg.admin_port}",
            **({"prom_exporter": f"{self.cfg.prom_host}:{self.cfg.prom_port}"}
               if self.cfg.prom_port is not None else {}),
        }

    async def stop(self):
        await self.placement.leave()
        await self._tasks.close()
        await self.logs.stop_retention()
        # Producers stop first so the segments sealed now are the last ones uploaded.
        for topic in self.topics.values():
            topic.closed = True
        if await self.logs.flush(SHUTDOWN_UPLOAD_TIMEOUT):
            log.info("shutdown: every reliable topic is in the durable tier")
        for topic in list(self.topics.values()):
            await self._unload(topic, BrokerShuttingDown("the broker is shutting down"))
        await self.logs.close()

    def _load_broker_id(self):
        path = os.path.join(self.cfg.data_dir, "broker_id")
        try:
            with open(path, encoding="ascii") as f:
                return int(f.read().strip())
        except (FileNotFoundError, ValueError):
            value = secrets.randbits(63) or 1
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="ascii") as f:
                f.write(str(value))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(self.cfg.data_dir)     # the rename, or a power cut undoes it
            return value
