"""The broker core for a single (standalone) broker: namespaces, topics, producers,
subscriptions and consumers, persisted through the MetadataStore with upstream's key layout.
It raises typed errors (danube.broker.errors); the gRPC services map them to status codes."""

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import secrets
import shutil
import time

from danube.broker._canon import canonical_stream_message
from danube.broker import names
from danube.broker.consumer import Consumer
from danube.broker.failure_policy import FailurePolicy
from danube.broker.reliable import ReliableDispatcher
from danube.broker.errors import (BrokerShuttingDown, ConsumerLimit, ConsumerNotFound,
                                  DispatchMismatch, InvalidArgument, InvalidTopicName,
                                  NamespaceNotEmpty,
                                  NamespaceNotFound, ProducerLimit,
                                  ProducerNotFound, SubscribeDenied, SubscriptionLimit,
                                  SubscriptionNotFound, TopicAlreadyExists, TopicNotFound)
from danube.broker.subscription import TYPE_NAMES, TYPES_BY_NAME, Subscription
from danube.broker.topic import DELIVERY_NAMES, NON_RELIABLE, RELIABLE, Producer, Topic
from danube.config import Policies
from danube.metadata import keys
from danube.proto import DanubeApi_pb2 as pb
from danube.storage.wal import WAL, WALConfig

log = logging.getLogger("danube.broker")

SYSTEM_TOPIC = "/system/_events_topic"
# A non-reliable subscription with no consumer is removed after this grace (upstream: 60 s,
# checked every 30 s).
IDLE_SUBSCRIPTION_GRACE = 60.0
REAP_INTERVAL = 30.0
# A graceful shutdown waits this long for the last segments to reach the durable tier.
SHUTDOWN_UPLOAD_TIMEOUT = 30.0


def _random_id(taken):
    while True:
        value = secrets.randbits(64)
        if value and value not in taken:
            return value


class BrokerCore:
    def __init__(self, cfg, store, registry, loop=None):
        self.cfg = cfg
        self.store = store
        self.registry = registry
        self.loop = loop or asyncio.get_event_loop()
        self.topics = {}                  # name -> Topic
        self.producers = {}               # producer_id -> Producer
        self.consumers = {}               # consumer_id -> Consumer
        self.broker_id = None
        self._reaper = None
        self._retention = None
        self._lock = asyncio.Lock()       # serialises topic creation and deletion
        self.idle_subscription_grace = IDLE_SUBSCRIPTION_GRACE
        # Blocking WAL work (recovery, syncs) of every reliable topic shares these threads.
        self.wal_executor = None
        self.wal_root = cfg.wal_root or os.path.join(cfg.data_dir, "wal")
        self.default_failure_policy = cfg.failure_policy or FailurePolicy()
        self.tiered = None                # TieredStorage when storage.mode is not local

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self):
        self.wal_executor = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="danube-wal")
        self.broker_id = self._load_broker_id()
        if self.cfg.durable is not None:
            await self._start_tiered()
        for ns in dict.fromkeys(["default", "system", *self.cfg.bootstrap_namespaces]):
            await self._ensure_namespace(ns)
        await self._load_topics()
        if SYSTEM_TOPIC not in self.topics:
            await self._create_topic(SYSTEM_TOPIC, NON_RELIABLE)
        self._reaper = self.loop.create_task(self._reap_idle_subscriptions())
        self._retention = self.loop.create_task(self._enforce_retention())

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

    async def register(self):
        """Publish this broker's URLs; called once the servers are bound, so the ports are
        real even when the configuration asked for port 0."""
        await self.store.put(keys.cluster_register(self.broker_id), {
            "broker_url": self.cfg.advertised_broker_url,
            "connect_url": self.cfg.advertised_connect_url,
            "admin_addr": f"http://{self.cfg.admin_host}:{self.cfg.admin_port}",
        })

    async def stop(self):
        for task in (self._reaper, self._retention):
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
            return value

    async def _ensure_namespace(self, ns):
        key = keys.namespace_policy(ns)
        if await self.store.get_entry(key) is None:
            await self.store.put(key, dataclasses.asdict(self.cfg.policies))

    async def _load_topics(self):
        """Topics recorded in metadata are served again after a restart. Producers and
        non-reliable subscriptions are not: their clients learn through HealthCheck CLOSE and
        create them again."""
        for key in await self.store.keys(keys.NAMESPACES):
            parts = key.split("/")
            # /namespaces/{ns}/topics/{ns}/{topic}
            if len(parts) != 6 or parts[3] != "topics":
                continue
            name = f"/{parts[4]}/{parts[5]}"
            delivery = await self.store.get(keys.topic_delivery(name))
            topic = Topic(self, name, RELIABLE if delivery == "Reliable" else NON_RELIABLE)
            topic.policies = await self.policies_for(name)
            await self.store.delete_prefix(keys.topic_producers_prefix(name))
            if topic.delivery == RELIABLE:
                await self._open_log(topic)
                await self._restore_subscriptions(topic)
            else:
                await self.store.delete_prefix(keys.topic_subscriptions_prefix(name))
            self.topics[name] = topic
            await self.store.put(keys.cluster_broker_topic(self.broker_id, name), None)
        if self.topics:
            log.info("serving %d topics from metadata", len(self.topics))

    async def _open_log(self, topic):
        # Not validate_topic: a topic recorded before a name rule tightened is still served.
        ns, name = keys.split_topic(topic.name)
        cfg = self.cfg
        topic.durability = cfg.durability_for(topic.name)
        hours = cfg.wal_segment_max_hours
        directory = os.path.join(self.wal_root, ns, name)
        wal_cfg = WALConfig(durability=topic.durability,
                            sync_interval_ms=cfg.wal_sync_interval_ms,
                            segment_max_bytes=cfg.wal_segment_max_bytes,
                            max_age_seconds=hours * 3600 if hours else None,
                            cache_capacity=cfg.wal_cache_capacity)
        if self.tiered is None:
            topic.log = await WAL.open(directory, wal_cfg, executor=self.wal_executor)
            return
        from danube.storage.tiered.manager import wal_is_missing
        tier = await self.tiered.load_topic(topic.name, wal_missing=wal_is_missing(directory))
        # A lost local WAL (or a topic that moved here) continues after the durable history.
        start = tier.uploaded_end + 1
        wal = await WAL.open(directory, wal_cfg, start_offset=start,
                             executor=self.wal_executor)
        if wal.next_offset < start:
            # Older than what was uploaded (a restored backup, a stale disk): reusing its
            # offsets would give two messages one offset. Keep it aside for inspection.
            await wal.close()
            aside = f"{directory}.stale-{int(time.time())}"
            await self.loop.run_in_executor(self.wal_executor, os.replace, directory, aside)
            log.warning("%s: local WAL ends at offset %d but the durable tier holds up to %d; "
                        "moved the local WAL to %s and continuing at %d", topic.name,
                        wal.next_offset - 1, start - 1, aside, start)
            wal = await WAL.open(directory, wal_cfg, start_offset=start,
                                 executor=self.wal_executor)
        if tier.uploaded_end >= 0 or wal.next_offset:
            log.info("%s: durable tier holds offsets up to %d, local WAL %d..%d", topic.name,
                     tier.uploaded_end, wal.first_offset, wal.next_offset - 1)
        tier.wal = wal
        topic.log = wal
        topic.tier = tier

    async def _restore_subscriptions(self, topic):
        """A reliable subscription outlives its consumers and broker restarts: it resumes
        at its persisted cursor + 1."""
        for key, record in await self.store.scan(keys.topic_subscriptions_prefix(topic.name)):
            if not isinstance(record, dict):
                continue
            sub_name = record.get("subscription_name")
            # The subtree also holds each subscription's cursor and policy keys.
            if not sub_name or key != keys.topic_subscription(topic.name, sub_name):
                continue
            sub_type = TYPES_BY_NAME.get(record.get("subscription_type"))
            if not sub_name or sub_type is None:
                continue
            cursor = await self.store.get(keys.subscription_cursor(topic.name, sub_name))
            policy = await self._load_failure_policy(topic.name, sub_name)
            window = await self._load_window(topic.name, sub_name)
            self._attach_subscription(topic, Subscription(topic, sub_name, sub_type),
                                      cursor if isinstance(cursor, int) else
                                      topic.log.next_offset - 1, policy, window)

    # -- namespaces ----------------------------------------------------------------------

    async def namespace_exists(self, ns):
        return await self.store.get_entry(keys.namespace_policy(ns)) is not None

    async def list_namespaces(self):
        out = []
        for key in await self.store.keys(keys.NAMESPACES):
            parts = key.split("/")
            if len(parts) == 4 and parts[3] == "policy":
                out.append(parts[2])
        return out

    async def create_namespace(self, ns):
        names.validate_namespace(ns)
        if await self.namespace_exists(ns):
            raise TopicAlreadyExists(f"namespace {ns} already exists")
        await self.store.put(keys.namespace_policy(ns), dataclasses.asdict(self.cfg.policies))

    async def delete_namespace(self, ns):
        if not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"namespace {ns} does not exist")
        if await self.store.keys(keys.namespace_topics_prefix(ns)):
            raise NamespaceNotEmpty(f"namespace {ns} still has topics")
        await self.store.delete_prefix(keys.namespace_prefix(ns))

    async def namespace_topics(self, ns):
        if not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"namespace {ns} does not exist")
        prefix = keys.namespace_topics_prefix(ns) + "/"
        return [f"/{ns}/{k[len(prefix):].split('/', 1)[1]}"
                for k in await self.store.keys(keys.namespace_topics_prefix(ns))
                if k.startswith(prefix) and "/" in k[len(prefix):]]

    async def policies_for(self, topic):
        ns, _ = keys.split_topic(topic)
        value = await self.store.get(keys.topic_policy(topic))
        if value is None:
            value = await self.store.get(keys.namespace_policy(ns))
        policies = Policies()
        for field in dataclasses.fields(Policies):
            if isinstance(value, dict) and isinstance(value.get(field.name), int):
                setattr(policies, field.name, value[field.name])
        return policies

    # -- topics --------------------------------------------------------------------------

    def get_topic(self, name):
        topic = self.topics.get(name)
        if topic is None:
            names.validate_topic(name)
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        return topic

    async def create_topic(self, name, delivery=NON_RELIABLE):
        """Admin creation: ALREADY_EXISTS if present; partition/plain name conflicts refused."""
        names.validate_topic(name)
        async with self._lock:
            if name in self.topics:
                raise TopicAlreadyExists(f"topic {name} already exists")
            await self._check_partition_conflict(name)
            return await self._create_topic(name, delivery)

    async def create_partitioned_topic(self, base, partitions, delivery=NON_RELIABLE):
        names.validate_topic(base, "base_name")
        names.validate_partitions(base, partitions)
        async with self._lock:
            if base in self.topics:
                raise TopicAlreadyExists(f"topic {base} already exists as a non-partitioned topic")
            existing = await self.partitions(base)
            if existing:
                raise TopicAlreadyExists(f"partitioned topic {base} already exists")
            created = []
            try:
                for i in range(partitions):
                    created.append(await self._create_topic(names.partition_name(base, i),
                                                            delivery))
            except BaseException:
                # All or nothing: a half-created partitioned topic would answer
                # TopicPartitions with fewer partitions than asked for.
                for topic in created:
                    await self._discard_topic(topic)
                raise
            return created

    async def _check_partition_conflict(self, name):
        ns, topic = names.validate_topic(name)
        split = names.split_partition(topic)
        if split is not None and f"/{ns}/{split[0]}" in self.topics:
            raise TopicAlreadyExists(
                f"cannot create partition {name}: a non-partitioned topic /{ns}/{split[0]} exists")
        if split is None and await self.partitions(name):
            raise TopicAlreadyExists(
                f"cannot create {name}: a partitioned topic with that name exists")

    async def _create_topic(self, name, delivery):
        ns, _ = names.validate_topic(name)
        if not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"Unable to find the namespace {ns}")
        delivery_name = DELIVERY_NAMES[delivery]     # a KeyError here, before any write
        topic = Topic(self, name, delivery)
        topic.policies = await self.policies_for(name)
        try:
            if delivery == RELIABLE:
                await self._open_log(topic)
            await self.store.put(keys.namespace_topic(name), None)
            await self.store.put(keys.topic_delivery(name), delivery_name)
            await self.store.put(keys.cluster_broker_topic(self.broker_id, name), None)
        except BaseException:
            # A topic recorded in metadata but not served would be listed by the admin API
            # and unknown to lookup; take back whatever got written.
            await self._discard_topic(topic)
            raise
        self.topics[name] = topic
        log.info("topic %s created (%s)", name, delivery_name)
        return topic

    async def _discard_topic(self, topic):
        """Undo _create_topic for a topic no client has used yet (its creation, or the
        request that created it, failed part-way)."""
        name = topic.name
        if self.topics.get(name) is topic:
            del self.topics[name]
        try:
            await self._unload(topic, TopicNotFound(f"topic {name} was not created"))
            if topic.log is not None:
                await self.loop.run_in_executor(
                    self.wal_executor, shutil.rmtree, topic.log.directory, True)
            await self.store.delete(keys.namespace_topic(name))
            await self.store.delete_prefix(keys.topic_root(name))
            await self.store.delete(keys.cluster_broker_topic(self.broker_id, name))
        except Exception:  # noqa: BLE001 - the original failure is the one to report
            log.exception("cleaning up after the failed creation of %s", name)
        else:
            log.info("topic %s removed again: the request that created it failed", name)

    async def delete_topic(self, name):
        """Delete a topic (or every partition of a partitioned one): its producers and
        consumers are disconnected, and HealthCheck answers CLOSE for them."""
        ns, topic_part = names.validate_topic(name)
        if names.split_partition(topic_part) is not None and name in self.topics:
            raise InvalidTopicName(f"delete the partitioned topic, not its partition {name}")
        async with self._lock:
            targets = [name] if name in self.topics else await self.partitions(name)
            if not targets:
                raise TopicNotFound(f"Unable to find the requested topic: {name}")
            for target in targets:
                topic = self.topics.pop(target, None)
                if topic is not None:
                    await self._unload(topic, TopicNotFound(f"topic {target} was deleted"))
                    if topic.log is not None:
                        await self.loop.run_in_executor(
                            self.wal_executor, shutil.rmtree, topic.log.directory, True)
                    if self.tiered is not None:
                        await self.tiered.delete_topic(target)
                await self.store.delete(keys.namespace_topic(target))
                await self.store.delete_prefix(keys.topic_root(target))
                await self.store.delete(keys.cluster_broker_topic(self.broker_id, target))
                log.info("topic %s deleted", target)

    async def _unload(self, topic, reason):
        topic.closed = True
        if topic.tier is not None and self.tiered is not None:
            self.tiered.forget(topic.name)
        for producer in topic.producers.values():
            producer.active = False
            self.producers.pop(producer.producer_id, None)
            self.registry.remove_producer(producer.producer_id)
        for sub in topic.subscriptions.values():
            sub.close(reason)
            if sub.dispatcher is not None:
                await sub.dispatcher.close()
        topic.subscriptions.clear()
        topic.subscriptions_changed()
        if topic.log is not None:
            await topic.log.close()

    async def partitions(self, name):
        """The topic itself if it exists, else its partitions `{name}-part-N` in order.
        Partitions are numbered from 0 without gaps, so probing costs O(partitions), not a
        scan of the namespace."""
        names.validate_topic(name)
        if name in self.topics:
            return [name]
        found = []
        while True:
            candidate = names.partition_name(name, len(found))
            if candidate not in self.topics and \
                    await self.store.get_entry(keys.namespace_topic(candidate)) is None:
                return found
            found.append(candidate)

    def lookup(self, name):
        names.validate_topic(name)
        if name not in self.topics:
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        return self.cfg.advertised_broker_url, self.cfg.advertised_connect_url

    # -- producers -----------------------------------------------------------------------

    async def create_producer(self, topic_name, producer_name, delivery, access_mode=0,
                              schema_subject=None):
        names.validate_topic(topic_name)
        names.validate_client_name(producer_name, "producer_name")
        if delivery not in DELIVERY_NAMES:
            raise InvalidArgument(f"dispatch_strategy: unknown value {delivery}")
        if schema_subject:
            # Before the topic is auto-created: a refused producer creates nothing.
            raise DispatchMismatch(f"schema subject {names.quote(schema_subject)} is not "
                                   f"registered")
        topic = self.topics.get(topic_name)
        created = None
        if topic is None:
            if not self.cfg.auto_create_topics:
                raise TopicNotFound(f"Unable to find the requested topic: {topic_name}")
            async with self._lock:
                topic = self.topics.get(topic_name)
                if topic is None:
                    await self._check_partition_conflict(topic_name)
                    topic = created = await self._create_topic(topic_name, delivery)
        try:
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
        producer_id = _random_id(self.producers)
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
            raise ProducerNotFound(f"The producer with id {producer_id} does not exist")
        return producer

    # -- subscriptions and consumers -----------------------------------------------------

    async def subscribe(self, topic_name, consumer_name, sub_name, sub_type, key_filters=(),
                        client=None):
        """``client`` identifies the subscribing connection (any object compared by
        identity); a takeover by name gives the consumer to it (Consumer.must_wait)."""
        names.validate_topic(topic_name)
        names.validate_client_name(consumer_name, "consumer_name")
        names.validate_client_name(sub_name, "subscription")
        if sub_type not in TYPE_NAMES:
            raise InvalidArgument(f"subscription_type: unknown value {sub_type}")
        topic = self.get_topic(topic_name)
        sub = topic.subscriptions.get(sub_name)
        if sub is not None:
            existing = sub.by_name.get(consumer_name)
            if existing is not None:
                # Reconnect by name (upstream's takeover): same id; the stream it has ends
                # now and the subscribing client's next ReceiveMessages gets what follows.
                existing.take_over(client, self.cfg.consumer_stream_grace_ms / 1000)
                sub.consumer_changed(existing)
                return existing.consumer_id
            if sub.sub_type != sub_type:
                raise SubscribeDenied(
                    f"subscription {sub_name!r} is {sub.type_name}, not {TYPE_NAMES[sub_type]}")
        policies = topic.policies
        if sub is None and policies.max_subscriptions_per_topic and \
                len(topic.subscriptions) >= policies.max_subscriptions_per_topic:
            raise SubscriptionLimit(f"topic {topic_name} already has {len(topic.subscriptions)} "
                                    f"subscriptions (max_subscriptions_per_topic)")
        if policies.max_consumers_per_topic:
            count = sum(len(s.active_consumers()) for s in topic.subscriptions.values())
            if count >= policies.max_consumers_per_topic:
                raise ConsumerLimit(f"topic {topic_name} already has {count} consumers "
                                    f"(max_consumers_per_topic)")
        new_sub = sub is None
        if new_sub:
            sub = Subscription(topic, sub_name, sub_type)
        sub.check_new_consumer(consumer_name, policies.max_consumers_per_subscription)
        consumer = None
        try:
            if new_sub:
                if topic.delivery == RELIABLE:
                    # A new reliable subscription starts at the live tail (upstream: Latest).
                    policy = self.default_failure_policy.for_subscription(topic_name, sub_name)
                    await self.store.put(keys.subscription_failure_policy(topic_name, sub_name),
                                         policy.to_json())
                    cursor = topic.log.next_offset - 1
                    await self.store.put(keys.subscription_cursor(topic_name, sub_name), cursor)
                    window = await self._load_window(topic_name, sub_name)
                    self._attach_subscription(topic, sub, cursor, policy, window)
                else:
                    topic.subscriptions[sub_name] = sub
                    topic.subscriptions_changed()
            consumer_id = _random_id(self.consumers)
            consumer = Consumer(consumer_id, consumer_name, sub, key_filters, loop=self.loop)
            sub.add(consumer)
            consumer.expect_stream(self.cfg.consumer_stream_grace_ms / 1000)
            self.consumers[consumer_id] = consumer
            self.registry.add_consumer(consumer_id, consumer)
            await self.store.put(keys.topic_subscription(topic_name, sub_name), {
                "subscription_name": sub_name, "subscription_type": sub.type_name,
                "consumer_id": consumer_id, "consumer_name": consumer_name,
                "key_filters": list(key_filters)})
        except BaseException:
            # The client is told the Subscribe failed: a consumer (or subscription) left
            # registered would refuse its next attempt ("already has a consumer").
            await self._undo_subscribe(topic, sub, consumer, new_sub)
            raise
        return consumer_id

    async def _undo_subscribe(self, topic, sub, consumer, new_sub):
        try:
            if consumer is not None:
                sub.remove(consumer)
            if new_sub:
                if topic.subscriptions.get(sub.name) is sub:
                    del topic.subscriptions[sub.name]
                    sub.close()
                    topic.subscriptions_changed()
                if sub.dispatcher is not None:
                    await sub.dispatcher.close()     # writes its cursor: delete after this
                await self.store.delete_prefix(keys.topic_subscription(topic.name, sub.name))
        except Exception:  # noqa: BLE001 - the original failure is the one to report
            log.exception("cleaning up after a failed Subscribe to %s/%s", topic.name, sub.name)

    def consumer(self, consumer_id):
        consumer = self.consumers.get(consumer_id)
        if consumer is None or consumer.subscription.topic.closed:
            raise ConsumerNotFound(f"The consumer with id {consumer_id} does not exist")
        return consumer

    async def _load_window(self, topic_name, sub_name):
        """max_unacked_messages: the subscription's dispatch_config if one was set (the
        admin API's SetSubscriptionDispatchConfig writes it), else the broker's."""
        record = await self.store.get(keys.subscription_dispatch_config(topic_name, sub_name))
        value = record.get("max_unacked_messages") if isinstance(record, dict) else None
        if isinstance(value, int) and 1 <= value <= 10000:
            return value
        return self.cfg.max_unacked_messages

    def _attach_subscription(self, topic, sub, cursor, policy, window):
        topic_name, sub_name = topic.name, sub.name

        async def save_cursor(value):
            await self.store.put(keys.subscription_cursor(topic_name, sub_name), value)

        async def dead_letter(delivery, attempts, reason):
            await self.dead_letter(topic, sub, policy, delivery, attempts, reason)

        sub.dispatcher = ReliableDispatcher(
            sub, topic, cursor, policy, window, loop=self.loop,
            on_cursor=save_cursor, dead_letter=dead_letter)
        topic.subscriptions[sub_name] = sub
        topic.subscriptions_changed()

    async def _load_failure_policy(self, topic_name, sub_name):
        record = await self.store.get(keys.subscription_failure_policy(topic_name, sub_name))
        default = self.default_failure_policy.for_subscription(topic_name, sub_name)
        if not isinstance(record, dict):
            return default
        try:
            return FailurePolicy.from_config({k: v for k, v in record.items()
                                              if v is not None or k == "dead_letter_topic"})
        except (ValueError, TypeError):
            log.warning("ignoring unreadable failure policy of %s/%s", topic_name, sub_name)
            return default

    async def dead_letter(self, topic, sub, policy, delivery, attempts, reason):
        """Republish a poisoned message to the dead-letter topic (created reliable if it
        does not exist), with upstream's x-original-* attributes."""
        msg = pb.StreamMessage.FromString(
            canonical_stream_message(delivery.payload, topic.delivery_stamp))
        original = msg.msg_id
        attributes = {
            "x-original-topic": topic.name,
            "x-original-subscription": sub.name,
            "x-original-topic-offset": str(original.topic_offset),
            "x-original-producer-id": str(original.producer_id),
            "x-original-broker-addr": original.broker_addr,
            "x-poison-policy": "dead_letter",      # upstream's poison_policy_label
            "x-delivery-attempt": str(attempts),
        }
        if reason:
            attributes["x-failure-reason"] = reason
        msg.attributes.update(attributes)
        target = policy.dead_letter_topic
        msg.msg_id.CopyFrom(pb.MsgID(producer_id=0, topic_name=target,
                                     broker_addr=original.broker_addr))
        dlq = self.topics.get(target)
        if dlq is None:
            async with self._lock:
                dlq = self.topics.get(target) or await self._create_topic(target, RELIABLE)
        if dlq.delivery == RELIABLE:
            await dlq.publish_reliable([msg])
        else:
            key = msg.routing_key if msg.HasField("routing_key") else msg.producer_name
            dlq.publish(msg.SerializeToString(), len(msg.payload), key)

    def consumer_removed(self, consumer):
        """A subscription let a consumer go: forget its id everywhere."""
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
        self.registry.remove_consumer(consumer.consumer_id)

    def subscription_for_ack(self, topic_name, sub_name):
        topic = self.topics.get(topic_name)
        if topic is None:
            raise TopicNotFound(f"Error acknowledging message: topic {topic_name} not found")
        sub = topic.subscriptions.get(sub_name)
        if sub is None:
            raise SubscriptionNotFound(
                f"Error acknowledging message: subscription {sub_name!r} not found on {topic_name}")
        return sub

    async def _reap_idle_subscriptions(self):
        """Consumers whose stream ended and that did not come back within the grace are
        removed (their ids then answer CLOSE); a subscription left without consumers for the
        grace is removed too (upstream: non-reliable subscriptions, 60 s)."""
        while True:
            await asyncio.sleep(min(REAP_INTERVAL, self.idle_subscription_grace))
            now = time.monotonic()
            grace = self.idle_subscription_grace
            for topic in list(self.topics.values()):
                for sub in list(topic.subscriptions.values()):
                    for consumer in list(sub.consumers.values()):
                        if consumer.inactive_since is not None and \
                                now - consumer.inactive_since >= grace:
                            sub.remove(consumer)
                    if sub.dispatcher is None and sub.idle_since is not None and \
                            now - sub.idle_since >= grace:
                        sub.close()
                        del topic.subscriptions[sub.name]
                        topic.subscriptions_changed()
                        await self.store.delete_prefix(
                            keys.topic_subscription(topic.name, sub.name))
                        log.info("removed idle subscription %s on %s", sub.name, topic.name)

    async def _enforce_retention(self):
        """Local retention (storage.local_retention): delete old sealed WAL segments by age
        and total size, but never one holding an offset a subscription still needs (above
        the slowest cursor) unless `delete_unconsumed` is set. By default a stuck
        subscription therefore keeps its backlog on disk; with `delete_unconsumed` it loses
        what retention deleted and resumes at the oldest message left."""
        cfg = self.cfg
        while True:
            await asyncio.sleep(cfg.retention_check_interval_minutes * 60)
            uploaded = {}
            if self.tiered is not None:
                try:
                    uploaded = await self.tiered.durable_ends()
                except Exception:  # noqa: BLE001 - tiered topics keep their WAL this pass
                    log.exception("retention: cannot sync the segment catalogue")
            for topic in list(self.topics.values()):
                if topic.log is None or topic.closed:
                    continue
                if topic.tier is not None:
                    # Subscriptions behind the local WAL read from the durable tier, so
                    # what is uploaded (and recorded for good) may go, and the rest stays.
                    end = uploaded.get(topic.name)
                    if end is None:
                        continue
                    keep_from, force = end + 1, False
                else:
                    needed = [s.dispatcher.cursor + 1 for s in topic.subscriptions.values()
                              if s.dispatcher is not None]
                    keep_from = min(needed) if needed else topic.log.next_offset
                    force = cfg.retention_delete_unconsumed
                try:
                    deleted = await topic.log.retention(
                        max_age_seconds=cfg.retention_time_minutes * 60,
                        max_bytes=cfg.retention_size_mb * 1024 * 1024,
                        keep_from_offset=keep_from, force=force)
                except Exception:  # noqa: BLE001 - retry on the next pass
                    log.exception("retention on %s failed", topic.name)
                    continue
                if deleted:
                    log.info("retention deleted %d WAL segments of %s", len(deleted),
                             topic.name)
