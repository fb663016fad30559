"""The write path of one Spark task: a reliable producer per target topic (per partition of
a partitioned topic), messages published in batches with danube_ext.BatchProducer. Each
batch returns once the broker has appended it; a task that fails midway and is retried by
Spark publishes its rows again (at-least-once)."""

import itertools
import time
import uuid

import grpc

from danube_spark.errors import OptionError, PublishFailed, TopicNotFound
from danube_spark.messages import to_message
from danube_spark.rpc import Broker


def fnv1a64(key):
    """The key hash every Danube client uses to pick a partition."""
    h = 0xCBF29CE484222325
    for byte in key.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class _Target:
    """A producer on one topic or partition, with its pending batch."""

    def __init__(self, broker, topic, name):
        self.topic = topic
        self.name = name
        self.producer_id = broker.create_reliable_producer(topic, name)
        self.request_ids = itertools.count(1)
        self.pending = []
        self.pending_bytes = 0


class TaskWriter:
    def __init__(self, opts, task_label):
        self.opts = opts
        self.broker = Broker(opts.service_url, opts.timeout)
        self.prefix = f"spark-{task_label}-{uuid.uuid4().hex[:8]}"
        self.targets = {}           # partition or topic name -> _Target
        self.partitions = {}        # topic -> [partition names] ([topic] if not partitioned)
        self.round_robin = {}
        self.sent = 0

    def close(self):
        self.broker.close()

    def _pick(self, topic, key):
        names = self.partitions.get(topic)
        if names is None:
            try:
                names = self.broker.partitions(topic) or [topic]
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
            target = _Target(self.broker, name, f"{self.prefix}-{len(self.targets)}")
            self.targets[name] = target
        return target

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
        try:
            accepted = self.broker.send_messages(batch[0].request_id, target.producer_id, batch)
        except grpc.RpcError as exc:
            raise PublishFailed(f"publishing {len(batch)} messages to {target.topic} on the "
                                f"Danube broker at {self.opts.service_url} failed: "
                                f"{exc.code().name}: {exc.details()}") from None
        if accepted != len(batch):
            raise PublishFailed(f"the broker accepted {accepted} of {len(batch)} messages "
                                f"published to {target.topic}")
        self.sent += accepted

    def flush(self):
        for target in self.targets.values():
            self._flush(target)
