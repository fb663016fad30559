"""BrokerCore: the broker core for a single (standalone) broker, and its lifecycle. Namespaces,
topics, producers, subscriptions and consumers persist through the MetadataStore with
upstream's key layout. It raises typed errors (danube.broker.errors); the services map them
to status codes.

The core is one object whose methods are grouped by job, one module per group (a mixin each,
sharing the core's tables and lock): topics.py (namespaces, topics, partitioned topics,
lookup, the retention sweep), producers.py, subscriptions.py (subscriptions, consumers,
cursors, dead-letter, the idle reaper), schemas.py (topics' schema bindings) and admin.py
(brokers, describing, unloading, unsubscribing, live policy changes, statistics)."""

import asyncio
import concurrent.futures
import logging
import os
import secrets

from danube.broker.core.admin import Admin
from danube.broker.core.producers import Producers
from danube.broker.core.schemas import TopicSchemas
from danube.broker.core.subscriptions import IDLE_SUBSCRIPTION_GRACE, Subscriptions
from danube.broker.core.topics import Topics
from danube.broker.errors import BrokerShuttingDown
from danube.broker.placement import SYSTEM_TOPIC, Standalone
from danube.broker.schemas.registry import SchemaRegistry
from danube.broker.topic import NON_RELIABLE
from danube.dirsync import fsync_dir
from danube.failure_policy import FailurePolicy

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
        self.unloaded_ids = {}            # (kind, id) -> (topic, until): see Admin.unload_topic
        self.broker_id = None
        self._reaper = None
        self._retention = None
        self._sampler = None
        self._lock = asyncio.Lock()       # serialises topic creation and deletion
        self.idle_subscription_grace = IDLE_SUBSCRIPTION_GRACE
        # Blocking WAL work (recovery, syncs) of every reliable topic shares these threads.
        self.wal_executor = None
        self.wal_root = cfg.wal_root or os.path.join(cfg.data_dir, "wal")
        self.default_failure_policy = cfg.failure_policy or FailurePolicy()
        self.tiered = None                # TieredStorage when storage.mode is not local
        self.write_buffer = None          # WriteBuffer when storage.write_buffer is set

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self):
        self.wal_executor = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="danube-wal")
        self.broker_id = self._load_broker_id()
        if self.cfg.durable is not None:
            await self._start_tiered()
        if self.cfg.write_buffer is not None:
            await self._start_write_buffer()
        for ns in dict.fromkeys(["default", "system", *self.cfg.bootstrap_namespaces]):
            await self._ensure_namespace(ns)
        await self.placement.on_start()
        if SYSTEM_TOPIC not in self.topics:
            await self._create_topic(SYSTEM_TOPIC, NON_RELIABLE)
        self._reaper = self.loop.create_task(self._reap_idle_subscriptions())
        self._retention = self.loop.create_task(self._enforce_retention())
        self._sampler = self.loop.create_task(self._sample_rates())

    async def _start_tiered(self):
        # Imported here: a broker without tiered storage never loads the cloud SDKs.
        from danube.storage.durable.config import open_object_store
        from danube.storage.errors import TieredStartupError
        from danube.storage.tiered.manager import TieredStorage

        try:
            objstore = await self.loop.run_in_executor(None, open_object_store,
                                                       self.cfg.durable)
        except Exception as exc:  # noqa: BLE001 - SDK constructors raise many kinds
            raise TieredStartupError(f"storage.durable: {exc}") from exc
        tiered = TieredStorage(self.cfg.durable, objstore, self.store,
                               metadata_prefix=self.cfg.metadata_prefix)
        try:
            await tiered.check()
        except BaseException:
            await tiered.close()
            raise
        self.tiered = tiered
        tiered.start()
        log.info("tiered storage (%s): sealed WAL segments go to %s every %gs",
                 self.cfg.storage_mode, objstore.describe(), tiered.interval)

    async def _start_write_buffer(self):
        # Imported here: a broker without a write buffer never loads the Redis client.
        from danube.storage.writebuffer import WriteBuffer

        buffer = WriteBuffer(self.cfg.write_buffer)
        await buffer.start()
        self.write_buffer = buffer

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
        for task in (self._reaper, self._retention, self._sampler):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self.tiered is not None:
            # Producers stop first so the segments sealed now are the last ones.
            for topic in self.topics.values():
                topic.closed = True
            if await self.tiered.flush(SHUTDOWN_UPLOAD_TIMEOUT):
                log.info("shutdown: every reliable topic is in the durable tier")
        for topic in list(self.topics.values()):
            await self._unload(topic, BrokerShuttingDown("the broker is shutting down"))
        if self.tiered is not None:
            await self.tiered.close()
        if self.write_buffer is not None:
            await self.write_buffer.close()
        if self.wal_executor is not None:
            self.wal_executor.shutdown(wait=True)

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
