"""The core's subscriptions and consumers: Subscribe (and undoing one that failed), consumer
lookup, each reliable subscription's dispatcher with its cursor, window and failure policy
(restored after a restart), dead-lettering, and the reaper of idle consumers and
subscriptions. Owns the table of consumers connected here (by id); the topic table tells it
when a topic is loaded (its reliable subscriptions come back at their cursors) and when one
closes."""

import asyncio
import logging
import time

from danube.broker._canon import canonical_stream_message
from danube.broker import names
from danube.broker.consumer import Consumer
from danube.broker.core.ids import random_id
from danube.broker.errors import (ConsumerLimit, ConsumerNotFound, InvalidArgument,
                                  SubscribeDenied, SubscriptionLimit, SubscriptionNotFound,
                                  TopicNotFound)
from danube.broker.reliable import ReliableDispatcher
from danube.broker.subscription import TYPE_NAMES, TYPES_BY_NAME, Subscription
from danube.broker.topic import RELIABLE
from danube.failure_policy import FailurePolicy
from danube.metadata import keys
from danube.proto import DanubeApi_pb2 as pb

log = logging.getLogger("danube.broker")

# A non-reliable subscription with no consumer is removed after this grace (upstream: 60 s,
# checked every 30 s).
IDLE_SUBSCRIPTION_GRACE = 60.0
REAP_INTERVAL = 30.0


def _acked_within(ranges, last):
    """The persisted out-of-order acks that name offsets of this log (up to ``last``).
    Offsets past the log's end were acknowledged on a log that held more than this one
    resumed from (a broker's own WAL lost with it): the same offsets now go to new messages,
    which must not be skipped as acknowledged. A damaged entry is dropped (it only costs
    redeliveries)."""
    kept = []
    for entry in ranges:
        try:
            first, end = int(entry[0]), int(entry[1])
        except (TypeError, IndexError, ValueError):
            continue
        if first <= last:
            kept.append([first, min(end, last)])
    return kept


class SubscriptionTable:
    def __init__(self, cfg, store, registry, loop, *, topic_table, unloaded,
                 default_failure_policy):
        self.cfg = cfg
        self.store = store
        self.registry = registry            # ClientRegistry: the transport's view of ids
        self.loop = loop
        self.topic_table = topic_table      # TopicTable
        self.unloaded = unloaded            # UnloadedIds
        self.default_failure_policy = default_failure_policy
        self.idle_subscription_grace = IDLE_SUBSCRIPTION_GRACE
        self.consumers = {}                 # consumer_id -> Consumer

    # -- told by the topic table ---------------------------------------------------------

    async def topic_loaded(self, topic):
        """A topic served again from metadata (its log open, if reliable): its reliable
        subscriptions resume; a non-reliable topic's records are dropped (their clients
        subscribe again)."""
        if topic.delivery == RELIABLE:
            await self._restore_subscriptions(topic)
        else:
            await self.store.delete_prefix(keys.topic_subscriptions_prefix(topic.name))

    async def topic_closed(self, topic, reason, dispatcher_timeout=None):
        """A topic closes: each subscription ends its consumers' streams with ``reason`` and
        its dispatcher writes its cursor (given up after ``dispatcher_timeout``)."""
        for sub in topic.subscriptions.values():
            sub.close(reason)
            if sub.dispatcher is not None:
                try:
                    await asyncio.wait_for(sub.dispatcher.close(), dispatcher_timeout)
                except TimeoutError:
                    log.warning("%s: cursor of %s not saved (metadata unreachable)",
                                topic.name, sub.name)
        topic.subscriptions.clear()
        topic.subscriptions_changed()

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
            acked = await self.store.get(keys.subscription_acked(topic.name, sub_name))
            last = topic.log.next_offset - 1
            if not isinstance(cursor, int):
                cursor = last
            elif cursor > last:
                # The log resumed behind what was acknowledged (a broker's own WAL lost with
                # it; the durable tier held less): the offsets after `last` go to new
                # messages, which this subscription has not seen.
                log.warning("%s/%s: cursor %d is past the end of the log (%d): offsets %d-%d "
                            "were lost with a WAL; delivering from %d", topic.name, sub_name,
                            cursor, last, last + 1, cursor, last + 1)
                cursor, acked = last, ()
                # Stored at once: left at the old value, the next owner would find the log
                # grown past it by then and skip every message published in between.
                await self.store.put(keys.subscription_cursor(topic.name, sub_name), cursor)
                await self.store.put(keys.subscription_acked(topic.name, sub_name), [])
            acked = _acked_within(acked if isinstance(acked, list) else (), last)
            self._attach_subscription(topic, Subscription(topic, sub_name, sub_type), cursor,
                                      policy, window, acked)

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
        topic = await self.topic_table.use(topic_name)
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
            consumer_id = random_id(self.consumers)
            consumer = Consumer(consumer_id, consumer_name, sub, key_filters, loop=self.loop)
            sub.add(consumer)
            consumer.expect_stream(self.cfg.consumer_stream_grace_ms / 1000, client)
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
        if topic.closed:
            # Unloaded or moved while this call waited: the client subscribes again.
            raise topic.closed_error()
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
            self.unloaded.check("consumer", consumer_id)
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

    def _attach_subscription(self, topic, sub, cursor, policy, window, acked=()):
        topic_name, sub_name = topic.name, sub.name

        async def save_cursor(value):
            await self.store.put(keys.subscription_cursor(topic_name, sub_name), value)

        async def save_acked(ranges):
            await self.store.put(keys.subscription_acked(topic_name, sub_name), ranges)

        async def dead_letter(delivery, attempts, reason):
            # The dispatcher's policy, not the one it started with: the admin API may set
            # another on the live subscription.
            await self.dead_letter(topic, sub, sub.dispatcher.policy, delivery, attempts,
                                   reason)

        sub.dispatcher = ReliableDispatcher(
            sub, topic, cursor, policy, window, loop=self.loop,
            on_cursor=save_cursor, dead_letter=dead_letter, on_acked=save_acked,
            acked=acked, dispatch_rate=topic.policies.max_subscription_dispatch_rate)
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
        dlq = self.topic_table.served(target)
        if dlq is None:
            dlq, _ = await self.topic_table.get_or_create(target, RELIABLE, check_conflict=False)
        await dlq.publish(msg)

    def consumer_removed(self, consumer):
        """A subscription let a consumer go: forget its id everywhere."""
        if self.consumers.get(consumer.consumer_id) is consumer:
            del self.consumers[consumer.consumer_id]
        self.registry.remove_consumer(consumer.consumer_id)

    async def request_window(self, consumer, window, stream):
        """A consumer's ``stream`` (ReceiveBatches) asked for max_unacked_messages ``window``:
        the subscription's dispatcher takes it while the stream lasts, unless the operator
        set one for the subscription (SetSubscriptionDispatchConfig), which wins.
        Non-reliable: nothing to do."""
        sub = consumer.subscription
        if sub.dispatcher is None:
            return
        record = await self.store.get(keys.subscription_dispatch_config(sub.topic.name,
                                                                        sub.name))
        if isinstance(record, dict) and isinstance(record.get("max_unacked_messages"), int):
            return
        sub.dispatcher.window = window
        sub.dispatcher.window_owner = stream
        sub.dispatcher.notify()

    async def release_window(self, consumer, stream):
        """``stream``, which asked for a window, ended: unless another stream asked since,
        the subscription's own window (the operator's, or the broker's default) is back."""
        sub = consumer.subscription
        dispatcher = sub.dispatcher
        if dispatcher is None or dispatcher.window_owner is not stream:
            return
        window = await self._load_window(sub.topic.name, sub.name)
        if dispatcher.window_owner is stream:
            dispatcher.window = window
            dispatcher.window_owner = None
            dispatcher.notify()

    def subscription_for_ack(self, topic_name, sub_name):
        # The table's dict read directly: every Ack comes through here.
        topic = self.topic_table.topics.get(topic_name)
        if topic is None:
            raise TopicNotFound(f"Error acknowledging message: topic {topic_name} not found")
        sub = topic.subscriptions.get(sub_name)
        if sub is None:
            raise SubscriptionNotFound(
                f"Error acknowledging message: subscription {sub_name!r} not found on {topic_name}")
        return sub

    async def reap_idle(self):
        """Consumers whose stream ended and that did not come back within the grace are
        removed (their ids then answer CLOSE); a subscription left without consumers for the
        grace is removed too (upstream: non-reliable subscriptions, 60 s)."""
        while True:
            await asyncio.sleep(min(REAP_INTERVAL, self.idle_subscription_grace))
            now = time.monotonic()
            grace = self.idle_subscription_grace
            for topic in list(self.topic_table.topics.values()):
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
