"""What the admin API asks of the core beyond creating and deleting (the topic table's) and
the namespaces (Namespaces'): brokers and their state, describing, unloading and listing
topics, a subscription's removal and its failure policy and dispatch window (both applied to
the live dispatcher), statistics, and the rate sampler behind them. Built on the topic
table's public methods.

What depends on other brokers (the leader, draining, the balance, where a topic not served
here lives) is the placement's answer (danube.broker.placement)."""

import asyncio
import logging

from danube.broker import names, stats
from danube.broker.errors import (InvalidArgument, NamespaceNotFound, NotReliable,
                                  SchemaNotFound, SubscriptionNotFound, TopicNotFound)
from danube.broker.subscription import TYPES_BY_NAME
from danube.broker.topic import RELIABLE
from danube.metadata import keys

log = logging.getLogger("danube.broker")

MAX_UNACKED_RANGE = (1, 10_000)     # upstream's bounds for max_unacked_messages


class Admin:
    def __init__(self, store, schemas, *, placement, namespaces, topic_table, identity):
        self.store = store
        self.schemas = schemas              # SchemaRegistry (DescribeTopic's schema fields)
        self.placement = placement
        self.namespaces = namespaces
        self.topic_table = topic_table
        self.identity = identity            # BrokerIdentity

    # -- brokers -------------------------------------------------------------------------

    async def list_brokers(self):
        """Every registered broker as upstream's BrokerInfo fields."""
        return await self.placement.list_brokers()

    @property
    def leader_id(self):
        return self.placement.leader_id

    async def broker_status(self, broker_id):
        return await self.placement.broker_status(broker_id)

    async def activate_broker(self, broker_id, reason):
        await self.placement.activate(broker_id, reason)

    async def unload_broker(self, broker_id, **options):
        """Drain a broker: move its topics to the others (refused on a single broker)."""
        return await self.placement.drain(broker_id, **options)

    def balance(self):
        """GetClusterBalance: each broker's load."""
        return self.placement.balance()

    async def rebalance(self, dry_run, max_moves):
        """TriggerRebalance: move topics until the load is even (or propose the moves)."""
        return await self.placement.rebalance(dry_run, max_moves)

    # -- topics --------------------------------------------------------------------------

    async def broker_topics(self, broker_id):
        await self.placement.check_registered(broker_id)
        return await self.placement.topics_of(broker_id)

    async def topic_infos(self, names_):
        """ListNamespaceTopics/ListBrokerTopics rows: name, serving broker, delivery."""
        out = []
        for name in names_:
            delivery = await self.topic_table.delivery_name(name)     # loaded or resting
            if delivery is not None:
                out.append({"name": name, "broker_id": str(self.identity.value),
                            "delivery": delivery})
            else:
                out.append(await self.placement.unserved_row(name))
        return out

    async def unload_topic(self, name):
        """Close the topic (its producers and consumers are told to look it up again) and
        serve it anew from metadata: reliable subscriptions resume at their cursors."""
        names.validate_topic(name)
        targets = await self.topic_table.partitions(name)
        if not targets:
            raise TopicNotFound(f"Unable to find the requested topic: {name}")
        await self.placement.unload(targets, lambda: self.topic_table.reload(name))

    async def subscription_names(self, name):
        names.validate_topic(name)
        out = []
        for topic in await self.topic_table.served_targets(name):
            out.extend(s for s in topic.subscriptions if s not in out)
        return out

    async def describe_topic(self, name):
        """Upstream's DescribeTopicResponse fields; a partitioned topic is described by its
        first partition's delivery and schema, with the subscriptions of all."""
        targets = await self.topic_table.partitions(name)
        if not any(self.topic_table.serves(t) for t in targets):
            remote = await self.placement.describe_elsewhere(name, targets)
            if remote is not None:
                return remote
        subscriptions = await self.subscription_names(name)
        topic = (await self.topic_table.served_targets(name))[0]
        info = {"name": name, "subscriptions": subscriptions,
                "broker_id": str(self.identity.value), "delivery": topic.delivery_name}
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

    async def _subscriptions(self, name, sub_name):
        names.validate_topic(name)
        names.validate_client_name(sub_name, "subscription")
        topics = await self.topic_table.served_targets(name)
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
        if any(t.delivery != RELIABLE for t in await self.topic_table.served_targets(name)):
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
        return [stats.topic_stats(t, self.identity.value)
                for t in await self.topic_table.served_targets(name)]

    async def namespace_stats(self, ns):
        if ns:
            names.validate_namespace(ns)
            if not await self.namespaces.namespace_exists(ns):
                raise NamespaceNotFound(f"namespace {ns} does not exist")
            prefix = f"/{ns}/"
            chosen = [t for n, t in self.topic_table.topics.items() if n.startswith(prefix)]
        else:
            chosen = list(self.topic_table.topics.values())
        chosen.sort(key=lambda t: t.name)
        return [stats.topic_stats(t, self.identity.value, detail=False) for t in chosen]

    async def sample_rates(self):
        """The rate sampler (run by BrokerCore while it lives): each topic's recent
        counters, for the rates the statistics report."""
        while True:
            stats.sample_all(list(self.topic_table.topics.values()))
            await asyncio.sleep(stats.SAMPLE_INTERVAL)
