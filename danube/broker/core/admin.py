"""What the admin API asks of the core beyond creating and deleting: brokers and their state,
namespace policies, describing, unloading and listing topics, a subscription's removal and
its failure policy and dispatch window (both applied to the live dispatcher), statistics,
and the rate sampler behind them. A mixin of BrokerCore (see broker.py).

One broker is a cluster of one: it is its own leader, is balanced, and has nowhere to move
a topic to, so unloading the broker is refused (FAILED_PRECONDITION, as upstream answers a
one-broker cluster) while unloading a topic closes it and serves it again here."""

import asyncio
import dataclasses
import logging
import time

from danube.broker import names, stats
from danube.broker.errors import (BrokerNotFound, ClusterRequired, InvalidArgument,
                                  NamespaceNotFound, NotReliable, SchemaNotFound,
                                  SubscriptionNotFound, TopicNotFound, TopicUnloaded)
from danube.broker.subscription import TYPES_BY_NAME
from danube.broker.topic import RELIABLE
from danube.metadata import keys

log = logging.getLogger("danube.broker")

MAX_UNACKED_RANGE = (1, 10_000)     # upstream's bounds for max_unacked_messages
UNLOADED_ID_MEMORY = 60.0           # seconds; clients retry within their health-check period


class Admin:
    # -- brokers -------------------------------------------------------------------------

    async def list_brokers(self):
        """Every registered broker as upstream's BrokerInfo fields."""
        out = []
        for key, record in await self.store.scan(keys.CLUSTER_REGISTER):
            broker_id = key.rsplit("/", 1)[-1]
            if not isinstance(record, dict) or not record.get("broker_url"):
                continue
            out.append({"broker_id": broker_id, "broker_addr": record["broker_url"],
                        "broker_role": "Cluster_Leader" if broker_id == self.leader_id
                        else "Cluster_Follower",
                        "admin_addr": record.get("admin_addr", ""),
                        "metrics_addr": record.get("prom_exporter", ""),
                        "broker_status": await self.broker_status(broker_id)})
        return out

    @property
    def leader_id(self):
        if self.cluster is not None:
            return self.cluster.view.leader or ""
        return str(self.broker_id)

    async def broker_status(self, broker_id):
        state = await self.store.get(keys.cluster_broker_state(broker_id))
        mode = state.get("mode") if isinstance(state, dict) else None
        return mode if mode in ("active", "draining", "drained") else "active"

    async def _registered(self, broker_id):
        if not broker_id:
            raise InvalidArgument("broker_id must be provided")
        if "/" in broker_id or \
                await self.store.get_entry(keys.cluster_register(broker_id)) is None:
            raise BrokerNotFound(f"broker {broker_id} is not registered in the cluster")

    async def activate_broker(self, broker_id, reason):
        await self._registered(broker_id)
        await self.store.put(keys.cluster_broker_state(broker_id),
                             {"mode": "active", "reason": reason or "admin_activate"})

    async def unload_broker(self, broker_id, **options):
        """Drain a broker of a cluster (danube.cluster.admin.ClusterOps.drain); refused
        on a single broker."""
        if self.cluster is not None:
            await self._registered(broker_id)
            return await self.cluster.ops.drain(broker_id, **options)
        brokers = await self.list_brokers()
        if len(brokers) < 2:
            raise ClusterRequired("Cannot unload broker: single broker cluster detected.")
        await self._registered(broker_id)
        # Moving topics between brokers is the cluster mode's (not in this build).
        raise ClusterRequired(f"Cannot unload broker {broker_id}: moving topics to another "
                              f"broker needs cluster mode")

    def cluster_balance(self):
        """One broker: its load is its topic count, and it is balanced by definition."""
        if self.cluster is not None:
            return self.cluster.ops.balance()
        count = len(self.topics)
        return {"coefficient_of_variation": 0.0, "mean_load": float(count),
                "max_load": float(count), "min_load": float(count), "std_deviation": 0.0,
                "broker_count": 1, "assignment_strategy": "Fair",
                "brokers": [{"broker_id": self.broker_id, "load": float(count),
                             "topic_count": count, "is_overloaded": False,
                             "is_underloaded": False}]}

    # -- namespaces ----------------------------------------------------------------------

    async def namespace_policies(self, ns):
        names.validate_namespace(ns)
        value = await self.store.get(keys.namespace_policy(ns))
        if value is None and not await self.namespace_exists(ns):
            raise NamespaceNotFound(f"namespace {ns} does not exist")
        policies = dataclasses.asdict(self.cfg.policies)
        if isinstance(value, dict):
            policies.update({k: v for k, v in value.items() if k in policies})
        return policies

    # -- topics --------------------------------------------------------------------------

    async def broker_topics(self, broker_id):
        await self._registered(broker_id)
        if self.cluster is not None:
            return self.cluster.view.topics_of(broker_id)
        if broker_id == str(self.broker_id):
            return sorted(self.topics)
        prefix = keys.cluster_broker_prefix(broker_id)
        return sorted(k[len(prefix):] for k in await self.store.keys(prefix)
                      if k.count("/") == prefix.count("/") + 2)

    async def topic_infos(self, names_):
        """ListNamespaceTopics/ListBrokerTopics rows: name, serving broker, delivery."""
        out = []
        for name in names_:
            topic = self.topics.get(name)
            if topic is not None:
                out.append({"name": name, "broker_id": str(self.broker_id),
                            "delivery": topic.delivery_name})
            elif self.cluster is not None:
                delivery = await self.store.get(keys.topic_delivery(name))
                out.append({"name": name, "broker_id": self.cluster.view.owners.get(name, ""),
                            "delivery": delivery or "NonReliable"})
            else:
                out.append({"name": name, "broker_id": str(self.broker_id),
                            "delivery": "NonReliable"})
        return out

    async def _targets(self, name):
        """The topic, or each partition of a partitioned topic; NOT_FOUND if neither."""
        targets = await self.partitions(name)
        if not targets:
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        local = [self.topics[t] for t in targets if t in self.topics]
        if not local and self.cluster is not None:
            # Live state (subscriptions, dispatchers, rates) is the owner's alone.
            raise self.cluster.ops.elsewhere(targets[0])
        return local

    async def unload_topic(self, name):
        """Close the topic (its producers and consumers are told to look it up again) and
        serve it anew from metadata: reliable subscriptions resume at their cursors."""
        names.validate_topic(name)
        if self.cluster is not None:
            targets = await self.partitions(name)
            if not targets:
                raise TopicNotFound(f"Unable to find the requested topic: {name}")
            for target in targets:
                await self.cluster.ops.unload_topic(target)
            return
        async with self._lock:
            for topic in await self._targets(name):
                del self.topics[topic.name]
                self._remember_unloaded(topic)
                reason = TopicUnloaded(f"topic {topic.name} was unloaded; look it up and "
                                       "connect again")
                topic.close_reason = reason
                try:
                    await self._unload(topic, reason)
                finally:
                    await self._load_topic(topic.name)
                log.info("topic %s unloaded and loaded again", topic.name)

    def _remember_unloaded(self, topic):
        """For a while, a producer or consumer id of the unloaded topic is answered
        UNAVAILABLE ("look it up again"), which clients retry with a new lookup, instead of
        NOT_FOUND, which the official clients give up on."""
        now = time.monotonic()
        self.unloaded_ids = {k: v for k, v in self.unloaded_ids.items() if v[1] > now}
        until = now + UNLOADED_ID_MEMORY
        for producer_id in topic.producers:
            self.unloaded_ids[("producer", producer_id)] = (topic.name, until)
        for sub in topic.subscriptions.values():
            for consumer_id in sub.consumers:
                self.unloaded_ids[("consumer", consumer_id)] = (topic.name, until)

    def check_unloaded(self, kind, client_id):
        entry = self.unloaded_ids.get((kind, client_id)) if self.unloaded_ids else None
        if entry is not None and entry[1] > time.monotonic():
            raise TopicUnloaded(f"topic {entry[0]} was unloaded; look it up and create the "
                                f"{kind} again")

    async def subscription_names(self, name):
        names.validate_topic(name)
        out = []
        for topic in await self._targets(name):
            out.extend(s for s in topic.subscriptions if s not in out)
        return out

    async def describe_topic(self, name):
        """Upstream's DescribeTopicResponse fields; a partitioned topic is described by its
        first partition's delivery and schema, with the subscriptions of all."""
        if self.cluster is not None and \
                not any(t in self.topics for t in await self.partitions(name)):
            return await self.cluster.ops.describe_remote(name, await self.partitions(name))
        subscriptions = await self.subscription_names(name)
        topic = (await self._targets(name))[0]
        info = {"name": name, "subscriptions": subscriptions,
                "broker_id": str(self.broker_id), "delivery": topic.delivery_name}
        gate = topic.schema
        if gate is not None:
            info["schema_subject"] = gate.subject
            try:
                doc = await self.schemas.subject(gate.subject)
            except SchemaNotFound:
                return info
            latest = self.schemas.version_of(doc)
            info.update(schema_id=doc["id"], schema_version=latest["version"],
                        schema_type=latest["schema_type"],
                        # Upper case here, as upstream's DescribeTopic (the registry's
                        # own calls answer lower case, as upstream's do).
                        compatibility_mode=doc["compatibility_mode"].upper())
        return info

    def _subscription(self, topic, sub_name):
        sub = topic.subscriptions.get(sub_name)
        if sub is None:
            raise SubscriptionNotFound(f"subscription {sub_name!r} not found on {topic.name}")
        return sub

    async def _subscriptions(self, name, sub_name):
        names.validate_topic(name)
        names.validate_client_name(sub_name, "subscription")
        topics = await self._targets(name)
        found = [(t, t.subscriptions[sub_name]) for t in topics if sub_name in t.subscriptions]
        if not found:
            raise SubscriptionNotFound(f"subscription {sub_name!r} not found on {name}")
        return found

    async def unsubscribe(self, name, sub_name):
        """Remove the subscription (of every partition): its consumers are disconnected and
        what it had not acked no longer holds retention."""
        for topic, sub in await self._subscriptions(name, sub_name):
            if topic.subscriptions.get(sub_name) is not sub:
                continue
            del topic.subscriptions[sub_name]
            sub.close(SubscriptionNotFound(f"subscription {sub_name!r} on {topic.name} was "
                                           "removed (unsubscribe)"))
            topic.subscriptions_changed()
            if sub.dispatcher is not None:
                await sub.dispatcher.close()        # writes its cursor: delete after this
            await self.store.delete_prefix(keys.topic_subscription(topic.name, sub_name))
            log.info("subscription %s on %s removed (unsubscribe)", sub_name, topic.name)

    async def set_failure_policy(self, name, sub_name, policy):
        """Persist and apply at once: the next failure of a delivery is judged by it.

        The topic's kind is checked before the subscription is looked up: on a
        non-reliable topic the answer is FAILED_PRECONDITION whether or not the
        subscription exists, as upstream's (which checks only the dispatch strategy)."""
        names.validate_topic(name)
        names.validate_client_name(sub_name, "subscription")
        if any(t.delivery != RELIABLE for t in await self._targets(name)):
            raise NotReliable("subscription failure policy can only be configured for "
                              "reliable topics")
        policy.validate()
        found = await self._subscriptions(name, sub_name)
        for topic, sub in found:
            await self.store.put(keys.subscription_failure_policy(topic.name, sub_name),
                                 policy.to_json())
            sub.dispatcher.policy = policy
            sub.dispatcher.notify()

    async def failure_policy(self, name, sub_name):
        """(the policy in force, or None on a non-reliable subscription; the subscription
        type as upstream's SubType number)."""
        topic, sub = (await self._subscriptions(name, sub_name))[0]
        policy = sub.dispatcher.policy if sub.dispatcher is not None else None
        return policy, TYPES_BY_NAME[sub.type_name]

    async def set_dispatch_config(self, name, sub_name, max_unacked):
        low, high = MAX_UNACKED_RANGE
        if not low <= max_unacked <= high:
            raise InvalidArgument(f"max_unacked_messages must be between {low} and {high}, "
                                  f"not {max_unacked}")
        found = await self._subscriptions(name, sub_name)
        if any(t.delivery != RELIABLE for t, _ in found):
            raise NotReliable("dispatch config (max_unacked_messages) applies to reliable "
                              "topics only")
        for topic, sub in found:
            await self.store.put(keys.subscription_dispatch_config(topic.name, sub_name),
                                 {"max_unacked_messages": max_unacked})
            sub.dispatcher.window = max_unacked
            sub.dispatcher.notify()

    async def dispatch_config(self, name, sub_name):
        """The max_unacked_messages set on the subscription, or None (the broker's default
        applies), as upstream answers."""
        topic, _ = (await self._subscriptions(name, sub_name))[0]
        record = await self.store.get(keys.subscription_dispatch_config(topic.name, sub_name))
        value = record.get("max_unacked_messages") if isinstance(record, dict) else None
        return value if isinstance(value, int) else None

    # -- statistics ----------------------------------------------------------------------

    async def topic_stats(self, name):
        names.validate_topic(name)
        return [stats.topic_stats(t, self.broker_id) for t in await self._targets(name)]

    async def namespace_stats(self, ns):
        if ns:
            names.validate_namespace(ns)
            if not await self.namespace_exists(ns):
                raise NamespaceNotFound(f"namespace {ns} does not exist")
            prefix = f"/{ns}/"
            chosen = [t for n, t in self.topics.items() if n.startswith(prefix)]
        else:
            chosen = list(self.topics.values())
        chosen.sort(key=lambda t: t.name)
        return [stats.topic_stats(t, self.broker_id, detail=False) for t in chosen]

    async def _sample_rates(self):
        while True:
            stats.sample_all(list(self.topics.values()))
            await asyncio.sleep(stats.SAMPLE_INTERVAL)
