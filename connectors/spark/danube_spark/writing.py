"""The write path of one Spark task: a reliable producer per target topic (per partition of
a partitioned topic), messages published in batches with danube_ext.BatchProducer. Each
batch returns once the broker has appended it; a task that fails midway and is retried by
Spark publishes its rows again (at-least-once).

In a cluster each producer is created on the partition's owner (danube_spark.owners); a batch
whose owner fails or moves is published again on the new owner, which can duplicate it if
the first owner had appended it before failing (at-least-once, as a retried task)."""

import itertools
import time
import uuid

import grpc

from danube_spark.errors import DanubeSparkError, OptionError, PublishFailed, TopicNotFound
from danube_spark.messages import to_message
from danube_spark.owners import Owners


def fnv1a64(key):
    """The key hash every Danube client uses to pick a partition."""
    h = 0xCBF29CE484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class _Target:
    """A producer on one topic or partition, with its pending batch."""

    def __init__(self, topic, name):
        self.topic = topic
        self.name = name
        self.broker = None          # the owner the producer was created on
        self.producer_id = None
        self.request_ids = itertools.count(1)
        self.pending = []
        self.pending_bytes = 0


class TaskWriter:
    def __init__(self, opts, task_label):
        self.opts = opts
        self.owners = Owners(opts.service_url, opts.timeout, opts.owner_wait)
        self.prefix = f"spark-{task_label}-{uuid.uuid4().hex[:8]}"
        self.targets = {}           # partition or topic name -> _Target
        self.partitions = {}        # topic -> [partition names] ([topic] if not partitioned)
        self.round_robin = {}
        self.sent = 0

    def close(self):
        self.owners.close()

    def _pick(self, topic, key):
        names = self.partitions.get(topic)
        if names is None:
            try:
                names = self.owners.partitions(topic)
            except TopicNotFound:
                names = [topic]     # a new topic: CreateProducer creates it
            self.partitions[topic] = names
        if len(names) == 1:
            return names[0]
        if key is not None:
            return names[fnv1a64(key) % len(names)]
        index = self.round_robin.get(topic, 0)
        self.round_robin[topic] = (index + 1) % len(names)
        return names[index]

    def _target(self, name):
        target = self.targets.get(name)
        if target is None:
            target = _Target(name, f"{self.prefix}-{len(self.targets)}")
            self._connect(target)
            self.targets[name] = target
        return target

    def _connect(self, target):
        """The producer on the owner of the target's partition. A topic that does not exist
        yet is created by CreateProducer on any broker; in a cluster that call answers
        UNAVAILABLE "look it up again" if it landed on another broker, and the retry finds it
        there."""
        def create(broker):
            return broker, broker.create_reliable_producer(target.topic, target.name)

        retry = self.owners.retry(target.topic, "creating a reliable producer")
        while True:
            try:
                try:
                    broker = self.owners.owner(target.topic)
                except TopicNotFound:
                    _, (broker, producer_id) = self.owners.on_seed(create)
                else:
                    broker, producer_id = create(broker)
                target.broker, target.producer_id = broker, producer_id
                return
            except DanubeSparkError as exc:
                retry.failed(exc)

    def add(self, value, key, attributes, topic):
        topic = topic or self.opts.topic
        if not topic:
            raise OptionError("no topic to write to: set option topic or give a topic column")
        target = self._target(self._pick(topic, key))
        msg = to_message(next(target.request_ids), value, key, attributes, target.name,
                         int(time.time() * 1000))
        target.pending.append(msg)
        target.pending_bytes += len(msg.payload)
        if (len(target.pending) >= self.opts.batch_messages
                or target.pending_bytes >= self.opts.batch_bytes):
            self._flush(target)

    def _flush(self, target):
        if not target.pending:
            return
        batch, target.pending, target.pending_bytes = target.pending, [], 0
        retry = self.owners.retry(target.topic, f"publishing {len(batch)} messages")
        while True:
            try:
                accepted = target.broker.send_messages(batch[0].request_id,
                                                       target.producer_id, batch)
                break
            except grpc.RpcError as exc:
                failure = PublishFailed(f"publishing {len(batch)} messages to {target.topic} "
                                        f"on the Danube broker at "
                                        f"{target.broker.service_url} failed: "
                                        f"{exc.code().name}: {exc.details()}")
                failure.code = exc.code().name
            # The owner failed or gave the partition up: a producer on the new owner.
            retry.failed(failure)
            self._connect(target)
        if accepted != len(batch):
            raise PublishFailed(f"the broker accepted {accepted} of {len(batch)} messages "
                                f"published to {target.topic}")
        self.sent += accepted

    def flush(self):
        for target in self.targets.values():
            self._flush(target)
