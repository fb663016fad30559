"""The core's topics: the table of those served here and the locks that serialise their
creation, loading, unloading and deletion (one per topic family: a topic and the partitions
of its base name). Creation (plain and partitioned, all or nothing), lookup, deletion,
unloading and reloading, what a placement drives (PlacementHost's members) and what the
local retention sweep keeps.

A topic served here is loaded (a Topic in ``topics``, its log open) or resting (its name in
``resting``: recorded in metadata, nothing of it in memory). After a restart every recorded
topic rests; a topic nobody uses rests again once idle (danube.broker.core.idle). Any use
loads it (``use``, ``get_or_create``, the admin calls through ``served_targets``), its
reliable subscriptions at their cursors, as a reload does.

A topic's clients are the producer and subscription tables' (producers.py,
subscriptions.py); this table tells them when a topic is loaded and when it closes, through
the public methods ``attach`` names. Its schema binding is TopicSchemas' (schemas.py)."""

import asyncio
import logging
import time

from danube.broker import names, stats
from danube.broker.errors import (InvalidTopicName, NamespaceNotFound, TopicAlreadyExists,
                                  TopicElsewhere, TopicNotFound, TopicUnloaded, storage_error)
from danube.broker.core.idle import IdleTopics, in_use
from danube.broker.core.keylocks import KeyedLocks
from danube.broker.placement import LOG_ERRORS, SYSTEM_TOPIC
from danube.broker.topic import DELIVERY_NAMES, NON_RELIABLE, RELIABLE
from danube.metadata import keys
from danube.tasks import TaskSet

log = logging.getLogger("danube.broker")

__all__ = ["SYSTEM_TOPIC", "TopicTable"]

#: How long a fenced broker waits for a subscription's last cursor write before closing the
#: topic's log anyway (seconds).
FENCED_CLOSE = 0.2

#: Topics closed at once when idle ones are unloaded or the broker stops: enough to overlap
#: their logs' last syncs, few enough not to flood the WAL threads.
CLOSE_CONCURRENCY = 64

#: How long a stopping broker spends closing topics (seconds): past it, the rest of the
#: logs are left to recovery at the next start (what a sync covered is kept either way).
SHUTDOWN_CLOSE_TIMEOUT = 5.0

#: How long an idle topic's last segments may take to reach the durable tier before it is
#: unloaded (seconds); it stays loaded, and is tried again later, if they do not.
IDLE_UPLOAD_TIMEOUT = 10.0


class TopicTable:
    def __init__(self, cfg, store, *, namespaces, placement, logs, unloaded, identity,
                 new_topic):
        self.cfg = cfg
        self.store = store
        self.namespaces = namespaces
        self.placement = placement
        self.logs = logs
        self.unloaded = unloaded            # UnloadedIds: an unloaded topic's clients
        self.identity = identity            # BrokerIdentity: the id statistics name
        self.new_topic = new_topic          # (name, delivery) -> Topic
        self.topics = {}                    # name -> Topic served here, loaded
        self.resting = {}                   # name -> delivery name (None: not read yet)
        self._locks = KeyedLocks()          # per topic family: create, load, unload, delete
        self.idle = IdleTopics(cfg.topic_idle_unload_seconds, cfg.topic_max_idle_loaded)
        self._closing = TaskSet("idle-topic unloads")   # closes a stop must wait for
        self._schemas = self._producers = self._subscriptions = None

    def attach(self, schemas, producers, subscriptions):
        """The components a topic's loading and closing involve (called once, by BrokerCore):
        ``schemas.load_binding(topic)``, ``producers.topic_loaded(topic)`` and
        ``producers.topic_closed(topic)``, ``subscriptions.topic_loaded(topic)`` and
        ``subscriptions.topic_closed(topic, reason, dispatcher_timeout)``."""
        self._schemas, self._producers, self._subscriptions = schemas, producers, subscriptions

    # -- loading -------------------------------------------------------------------------

    async def load_recorded_topics(self):
        """Topics recorded in metadata are served again after a restart, resting: each is
        loaded on first use, so a broker with many topics is ready at once. Producers and
        non-reliable subscriptions are not kept: their clients learn through HealthCheck
        CLOSE and create them again."""
        for key in await self.store.keys(keys.NAMESPACES):
            parts = key.split("/")
            # /namespaces/{ns}/topics/{ns}/{topic}
            if len(parts) != 6 or parts[3] != "topics":
                continue
            name = f"/{parts[4]}/{parts[5]}"
            if name not in self.topics:
                self.resting.setdefault(name, None)
        if self.resting:
            log.info("serving %d topics from metadata (each loaded on first use)",
                     len(self.resting))

    @staticmethod
    def _family(name):
        """The lock key of ``name``: its base name when it is a partition."""
        ns, short = name.lstrip("/").split("/", 1)
        split = names.split_partition(short)
        return f"/{ns}/{split[0]}" if split is not None else name

    async def use(self, name):
        """The topic ``name`` served here, loaded if it rests; get_topic's errors if it is
        not served here."""
        topic = self.topics.get(name)
        if topic is not None:
            topic.idle_since = None
            return topic
        if name in self.resting:
            async with self._locks.hold(self._family(name)):
                topic = await self._loaded(name)
            if topic is not None:
                return topic
        return self.get_topic(name)

    async def _loaded(self, name):
        """(under the family's lock) The topic, loaded if it rests; None if neither."""
        topic = self.topics.get(name)
        if topic is None and name in self.resting:
            topic = await self._load_topic(name)
        if topic is not None:
            topic.idle_since = None
        return topic

    async def _load_topic(self, name):
        """Serve a topic recorded in metadata: its policies, schema binding, log and reliable
        subscriptions (at their cursors); its producers and non-reliable subscriptions are
        forgotten, their clients create them again."""
        delivery = self.resting.get(name) or await self.store.get(keys.topic_delivery(name))
        topic = self.new_topic(name, RELIABLE if delivery == "Reliable" else NON_RELIABLE)
        topic.policies = await self.namespaces.policies_for(name)
        await self._schemas.load_binding(topic)
        await self._producers.topic_loaded(topic)
        if topic.delivery == RELIABLE:
            await self._open_log(topic)
        await self._subscriptions.topic_loaded(topic)
        self.topics[name] = topic
        self.resting.pop(name, None)
        await self.placement.record_served(name)
        return topic

    async def _open_log(self, topic):
        # Not validate_topic: a topic recorded before a name rule tightened is still served.
        keys.split_topic(topic.name)
        epoch, taken_over = await self.placement.ownership_epoch(topic.name)
        topic.log = await self.logs.open(topic.name, epoch=epoch, taken_over=taken_over)
        topic.durability = topic.log.durability
        if topic.log.buffer is not None:
            # Appends whose publish failed are confirmed by a later pass: deliver them then.
            topic.log.buffer.on_confirmed = lambda _offset: topic.wake_subscriptions()

    # -- what a placement drives (danube.broker.placement.PlacementHost) -----------------

    def served_topics(self):
        return [name for name in (*self.topics, *self.resting) if name != SYSTEM_TOPIC]

    def serves(self, name):
        return name in self.topics or name in self.resting

    def served(self, name):
        """The loaded Topic ``name``, or None (not served here, or resting: see ``use``)."""
        return self.topics.get(name)

    async def delivery_name(self, name):
        """The delivery ("Reliable", "NonReliable") of a topic served here, loaded or
        resting, without loading it; None if it is not served here."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic.delivery_name
        if name not in self.resting:
            return None
        delivery = self.resting[name]
        if delivery is None:
            delivery = "Reliable" if await self.store.get(keys.topic_delivery(name)) == \
                "Reliable" else "NonReliable"
            if name in self.resting:
                self.resting[name] = delivery
        return delivery

    def topic_summaries(self):
        return [stats.topic_stats(topic, self.identity.value, detail=False)
                for topic in list(self.topics.values())]

    async def serve_topic(self, name):
        """Serve a topic placed here (see _load_topic)."""
        if name not in self.topics:
            await self._load_topic(name)

    async def release_topic(self, name, reason, upload_timeout=None, fenced=False):
        """Stop serving a topic that moves elsewhere. Its clients are told to look it up
        again; with ``upload_timeout`` (a graceful move) its last segments go to the durable
        tier first, so the next owner starts from all of it. ``fenced``: the metadata is out
        of reach, so nothing waits for it. Returns whether the topic had a log."""
        topic = self.topics.get(name)
        if topic is None:
            if name not in self.resting:
                return False
            # Unloaded already (its last segments uploaded when it went idle).
            delivery = await self.delivery_name(name)
            self.resting.pop(name, None)
            return delivery == "Reliable"
        topic.closed = True
        if upload_timeout and topic.log is not None:
            # This topic's segments only: each release waiting for every topic's uploads
            # made a drain's releases queue behind one another.
            await topic.log.upload_all(upload_timeout)
        if self.topics.get(name) is topic:
            del self.topics[name]
        self.unloaded.remember(topic)
        topic.close_reason = reason
        await self._close(topic, reason, dispatcher_timeout=FENCED_CLOSE if fenced else None)
        return topic.log is not None

    async def upload_released(self, name, upload_timeout):
        """A reliable topic this broker let go without uploading its last segments (it was
        fenced) but that no other broker has taken yet: open its log here once more, upload
        what the durable tier lacks, and close it, so that the next owner continues from
        every message this broker acknowledged."""
        if not self.logs.has_durable_tier or self.serves(name) or \
                await self.store.get(keys.topic_delivery(name)) != "Reliable":
            return
        topic = self.new_topic(name, RELIABLE)
        await self._open_log(topic)
        try:
            await topic.log.upload_all(upload_timeout)
        finally:
            await topic.log.close()

    async def delete_topic_data(self, name):
        """A deleted topic's log goes: its WAL directory and its durable tier's objects."""
        await self.logs.delete_released(name)

    async def _topic_exists(self, name):
        """Served here, or recorded in metadata wherever another broker serves it."""
        return self.serves(name) or await self.placement.known_elsewhere(name)

    # -- topics --------------------------------------------------------------------------

    def get_topic(self, name):
        topic = self.topics.get(name)
        if topic is None:
            names.validate_topic(name)
            self.placement.check_elsewhere(name)
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        return topic

    async def create_topic(self, name, delivery=NON_RELIABLE):
        """Admin creation: ALREADY_EXISTS if present; partition/plain name conflicts refused."""
        names.validate_topic(name)
        async with self._locks.hold(self._family(name)):
            if await self._topic_exists(name):
                raise TopicAlreadyExists(f"topic {name} already exists")
            await self._check_partition_conflict(name)
            try:
                return await self._create_topic(name, delivery)
            except TopicElsewhere:
                return None         # created, and served by another broker

    async def get_or_create(self, name, delivery, *, check_conflict=True):
        """(the topic served here, whether this call created it): a producer's
        auto-creation (``check_conflict``: refused where a partitioned topic of that name, or
        the plain topic of that partition, exists) and a dead-letter topic's. A resting topic
        is loaded."""
        names.validate_topic(name)
        async with self._locks.hold(self._family(name)):
            topic = await self._loaded(name)
            if topic is not None:
                return topic, False
            if check_conflict:
                await self._check_partition_conflict(name)
            return await self._create_topic(name, delivery), True

    async def discard_unused(self, topic):
        """Take back a topic this broker created for a request that then failed, if no
        client uses it (see _discard_topic)."""
        if topic.producers or topic.subscriptions:
            return
        async with self._locks.hold(self._family(topic.name)):
            await self._discard_topic(topic)

    async def create_partitioned_topic(self, base, partitions, delivery=NON_RELIABLE):
        names.validate_topic(base, "base_name")
        names.validate_partitions(base, partitions)
        async with self._locks.hold(self._family(base)):
            if await self._topic_exists(base):
                raise TopicAlreadyExists(f"topic {base} already exists as a non-partitioned topic")
            existing = await self.partitions(base)
            if existing:
                raise TopicAlreadyExists(f"partitioned topic {base} already exists")
            created = []
            try:
                for i in range(partitions):
                    try:
                        created.append(await self._create_topic(
                            names.partition_name(base, i), delivery))
                    except TopicElsewhere:
                        pass        # created, and served by another broker
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
        if split is not None and await self._topic_exists(f"/{ns}/{split[0]}"):
            raise TopicAlreadyExists(
                f"cannot create partition {name}: a non-partitioned topic /{ns}/{split[0]} exists")
        if split is None and await self.partitions(name):
            raise TopicAlreadyExists(
                f"cannot create {name}: a partitioned topic with that name exists")

    async def create_system_topic(self):
        """Each broker's own non-reliable system topic, unless served already."""
        if SYSTEM_TOPIC in self.resting:
            await self._load_topic(SYSTEM_TOPIC)
        elif SYSTEM_TOPIC not in self.topics:
            await self._create_topic(SYSTEM_TOPIC, NON_RELIABLE)

    async def _create_topic(self, name, delivery):
        ns, _ = names.validate_topic(name)
        namespace = await self.namespaces.namespace_entry(ns)
        if namespace is None:
            raise NamespaceNotFound(f"Unable to find the namespace {ns}")
        delivery_name = DELIVERY_NAMES[delivery]     # a KeyError here, before any write
        if name == SYSTEM_TOPIC:        # every broker has its own
            return await self._create_here(name, delivery, delivery_name, namespace)
        return await self.placement.create(
            name, delivery_name,
            lambda: self._create_here(name, delivery, delivery_name, namespace))

    async def _create_here(self, name, delivery, delivery_name, namespace):
        topic = self.new_topic(name, delivery)
        topic.policies = await self.namespaces.policies_for(name, namespace)
        try:
            if delivery == RELIABLE:
                await self._open_log(topic)
            # One commit for the topic's records, the placement's beside it: topics created
            # side by side share the store's group commits.
            await asyncio.gather(
                self.store.put_many({keys.namespace_topic(name): None,
                                     keys.topic_delivery(name): delivery_name}),
                self.placement.record_served(name))
        except BaseException as exc:
            # A topic recorded in metadata but not served would be listed by the admin API
            # and unknown to lookup; take back whatever got written.
            await self._discard_topic(topic)
            if isinstance(exc, LOG_ERRORS):     # a full disk, the descriptor limit...
                raise storage_error(exc, f"could not create topic {name}") from exc
            raise
        self.topics[name] = topic
        self.resting.pop(name, None)
        log.info("topic %s created (%s)", name, delivery_name)
        return topic

    async def _discard_topic(self, topic):
        """Undo _create_topic for a topic no client has used yet (its creation, or the
        request that created it, failed part-way)."""
        name = topic.name
        if self.topics.get(name) is topic:
            del self.topics[name]
        self.resting.pop(name, None)
        try:
            await self._close(topic, TopicNotFound(f"topic {name} was not created"))
            if topic.log is not None:
                await self.logs.discard(name)
            await self.store.delete(keys.namespace_topic(name))
            await self.store.delete_prefix(keys.topic_root(name))
            await self.placement.drop_assignment(name)
        except Exception:  # noqa: BLE001 - the original failure is the one to report
            log.exception("cleaning up after the failed creation of %s", name)
        else:
            log.info("topic %s removed again: the request that created it failed", name)

    async def delete_topic(self, name):
        """Delete a topic (or every partition of a partitioned one): its producers and
        consumers are disconnected, and HealthCheck answers CLOSE for them."""
        ns, topic_part = names.validate_topic(name)
        if names.split_partition(topic_part) is not None and self.serves(name):
            raise InvalidTopicName(
                f"Cannot delete individual partition '{name}'. Delete the base topic instead "
                f"(e.g., if partition is '/default/mytopic-part-0', delete '/default/mytopic').")
        async with self._locks.hold(self._family(name)):
            targets = await self.partitions(name)
            if not targets:
                raise TopicNotFound(f"Unable to find the requested topic: {name}")
            for target in targets:
                delivery = await self.delivery_name(target)     # None: not served here
                topic = self.topics.pop(target, None)
                self.resting.pop(target, None)
                if topic is not None:
                    await self._close(topic, TopicNotFound(f"topic {target} was deleted"))
                if topic is not None or delivery == "Reliable":
                    await self.logs.delete(target)
                await asyncio.gather(self.store.delete(keys.namespace_topic(target)),
                                     self.store.delete_prefix(keys.topic_root(target)),
                                     self.placement.forget(target))
                log.info("topic %s deleted", target)

    async def reload(self, name):
        """Unload the topic (each partition served here) and serve it anew from metadata:
        its clients are told to look it up again; reliable subscriptions resume at their
        cursors."""
        async with self._locks.hold(self._family(name)):
            targets = await self.partitions(name)
            if not targets:
                raise TopicNotFound(f"Unable to find the requested topic: {name}")
            # A resting topic is unloaded already: its next use loads it anew.
            for topic in [self.topics[t] for t in targets if t in self.topics]:
                del self.topics[topic.name]
                self.unloaded.remember(topic)
                reason = TopicUnloaded(f"topic {topic.name} was unloaded; look it up and "
                                       "connect again")
                topic.close_reason = reason
                try:
                    await self._close(topic, reason)
                finally:
                    await self._load_topic(topic.name)
                log.info("topic %s unloaded and loaded again", topic.name)

    def stop_publishing(self):
        """Every topic refuses publishes from now on (a shutdown: the segments sealed now
        are the last ones uploaded)."""
        for topic in self.topics.values():
            topic.closed = True

    async def close_all(self, reason, timeout=SHUTDOWN_CLOSE_TIMEOUT):
        """Close every loaded topic (a shutdown), many at once, for at most ``timeout``
        seconds: one by one, thousands of topics each waiting for its log's last sync made a
        stop take minutes. What is left open then is recovered at the next start."""
        async def close(topic):
            try:
                await self._close(topic, reason)
            except Exception:  # noqa: BLE001 - the other topics still close
                log.exception("shutdown: closing %s failed", topic.name)

        deadline = time.monotonic() + timeout
        await asyncio.wait_for(self._closing.wait(), timeout)
        topics = list(self.topics.values())
        for start in range(0, len(topics), CLOSE_CONCURRENCY):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            chunk = [asyncio.ensure_future(close(t))
                     for t in topics[start:start + CLOSE_CONCURRENCY]]
            _done, pending = await asyncio.wait(chunk, timeout=left)
            if pending:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        unclosed = sum(1 for t in topics if t.log is not None and not t.log.closed)
        if unclosed:
            log.warning("shutdown: %d topics' logs not closed within %.0fs; recovered at the "
                        "next start", unclosed, timeout)

    # -- idle topics (danube.broker.core.idle) -------------------------------------------

    async def unload_idle(self):
        """Run by BrokerCore while it lives: unload the topics nobody uses, as
        ``self.idle`` chooses them."""
        while True:
            await asyncio.sleep(self.idle.interval)
            due = self.idle.due(list(self.topics.values()), time.monotonic())
            for start in range(0, len(due), CLOSE_CONCURRENCY):
                await asyncio.gather(*(self._rest(t.name)
                                       for t in due[start:start + CLOSE_CONCURRENCY]))
            if due:
                log.debug("unloaded %d idle topics; %d loaded, %d resting", len(due),
                          len(self.topics), len(self.resting))

    async def _rest(self, name):
        """Unload topic ``name`` if it is still idle: its log closes, its subscriptions'
        cursors are saved; it rests until its next use."""
        async with self._locks.hold(self._family(name)):
            topic = self.topics.get(name)
            if topic is None or topic.idle_since is None or topic.closed or in_use(topic):
                return
            if topic.log is not None and self.logs.has_durable_tier and \
                    not await topic.log.upload_all(IDLE_UPLOAD_TIMEOUT):
                return          # tried again at a later sweep
            if self.topics.get(name) is not topic or topic.idle_since is None or \
                    in_use(topic):
                return
            del self.topics[name]
            # Resting before it closes: a lookup meanwhile still finds it served here.
            self.resting[name] = topic.delivery_name
            self.unloaded.remember(topic)
            reason = TopicUnloaded(f"topic {name} was unloaded (idle); look it up and "
                                   "connect again")
            topic.close_reason = reason
            try:
                # Shielded: a stopping broker cancels the sweep, not a log half closed;
                # close_all waits for it.
                await asyncio.shield(self._closing.spawn(self._close(topic, reason)))
            except Exception:  # noqa: BLE001 - the next use opens it again
                log.exception("unloading idle topic %s", name)

    async def _close(self, topic, reason, dispatcher_timeout=None):
        """Close the topic. ``dispatcher_timeout``: give up waiting for the subscriptions'
        last cursor writes after that long (a fenced broker cannot reach its metadata, and
        its log must be let go for the next owner; a lost cursor write only redelivers)."""
        topic.closed = True
        if topic.log is not None:
            topic.log.stop_uploads()
        self._producers.topic_closed(topic)
        await self._subscriptions.topic_closed(topic, reason, dispatcher_timeout)
        if topic.log is not None:
            await topic.log.close()

    async def partitions(self, name):
        """The topic itself if it exists, else its partitions `{name}-part-N` in order.
        Partitions are numbered from 0 without gaps, so probing costs O(partitions), not a
        scan of the namespace."""
        names.validate_topic(name)
        if await self._topic_exists(name):
            return [name]
        found = []
        while True:
            candidate = names.partition_name(name, len(found))
            if not self.serves(candidate) and \
                    await self.store.get_entry(keys.namespace_topic(candidate)) is None:
                return found
            found.append(candidate)

    async def served_targets(self, name):
        """The topic, or each partition of a partitioned topic, served here; NOT_FOUND if
        neither exists, the placement's error if none is served here."""
        targets = await self.partitions(name)
        if not targets:
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        local = [t for t in [await self._use_if_served(t) for t in targets] if t is not None]
        if not local:
            error = self.placement.not_served_here(targets)
            if error is not None:
                raise error
        return local

    async def served_parts(self, name, field="topic_name"):
        """The served topics ``name`` stands for (itself, or each partition served here);
        TopicNotFound, upstream's message, if none."""
        names.validate_topic(name, field)
        parts = [name] if self.serves(name) else await self.partitions(name)
        topics = [t for t in [await self._use_if_served(p) for p in parts] if t is not None]
        if not topics:
            self.get_topic(name)
        return topics

    async def _use_if_served(self, name):
        return await self.use(name) if self.serves(name) else None

    def lookup(self, name):
        """(broker_url, connect_url) of the broker serving the topic: this one, or the
        owner its placement knows. A resting topic is not loaded by its lookup: the
        producer or consumer that follows loads it."""
        names.validate_topic(name)
        if self.serves(name):
            return self.cfg.advertised_broker_url, self.cfg.advertised_connect_url
        located = self.placement.locate(name)
        if located is None:
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        return located

    # -- retention (run by the logs' owner, danube.storage.logs) -------------------------

    def retained_logs(self):
        """(name, log, the lowest offset a subscription still needs) of every open log: by
        default retention keeps what is above the slowest cursor."""
        for topic in list(self.topics.values()):
            if topic.log is None or topic.closed:
                continue
            needed = [s.dispatcher.cursor + 1 for s in topic.subscriptions.values()
                      if s.dispatcher is not None]
            yield topic.name, topic.log, min(needed) if needed else topic.log.next_offset
