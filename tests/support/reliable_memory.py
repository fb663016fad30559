"""A reliable dispatcher over an in-memory log, for the dispatcher's unit tests
(test_reliable_dispatcher.py, test_ack_ranges.py)."""

import asyncio

from danube import failure_policy as fp
from danube.broker._canon import DeliveryStamp
from danube.broker.consumer import Consumer
from danube.broker.reliable import ReliableDispatcher
from danube.broker.subscription import EXCLUSIVE, Subscription
from danube.codec.grpcframe import GrpcDeframer
from danube.proto import DanubeApi_pb2 as pb


class MemoryTopic:
    """What a dispatcher reads from a topic: the log, how far it may read, and a reader of
    every tier of its log (here just the messages: no durable tier)."""

    def __init__(self):
        self.name = "/default/t"
        self.log = self
        self.messages = []
        self.broker = self
        self.subs = []
        self.delivery_stamp = DeliveryStamp(self.name, "http://broker:1")

    @property
    def dispatchable_end(self):
        return len(self.messages)

    def read(self, offset, n):
        return [(o, self.messages[o]) for o in range(offset, min(offset + n, len(self.messages)))]

    def reader(self, on_ready):
        topic = self

        class Reader:
            def read(self, offset, n):
                return topic.read(offset, n)

            def close(self):
                pass
        return Reader()

    def publish(self, payload, key=None):
        msg = pb.StreamMessage(payload=payload, producer_name="p",
                               msg_id=pb.MsgID(topic_offset=len(self.messages)))
        if key is not None:
            msg.routing_key = key
        self.messages.append(msg.SerializeToString())
        for d in self.subs:
            d.notify()

    def consumer_removed(self, consumer):
        pass


def drain(consumer):
    return [pb.StreamMessage.FromString(m)
            for m in GrpcDeframer().feed(bytes(consumer.outbox.take()))]


async def make(sub_type=EXCLUSIVE, window=10, consumers=("c1",), *, topic=None, cursor=-1,
               on_acked=None, acked=(), **policy):
    """A dispatcher on ``topic`` (a new MemoryTopic by default) resuming at ``cursor`` with
    ``acked`` (persisted [first, last] runs above it)."""
    loop = asyncio.get_running_loop()
    topic = topic or MemoryTopic()
    sub = Subscription(topic, "s", sub_type)
    made = []
    for i, name in enumerate(consumers):
        c = Consumer(i + 1, name, sub, loop=loop)
        sub.add(c)
        made.append(c)
    saved = []
    dead = []

    async def on_cursor(cursor):
        saved.append(cursor)

    async def dead_letter(delivery, attempts, reason):
        dead.append((delivery.offset, attempts, reason))
    d = ReliableDispatcher(sub, topic, cursor, fp.FailurePolicy(**policy).validate(), window,
                           loop=loop, on_cursor=on_cursor, dead_letter=dead_letter,
                           on_acked=on_acked, acked=acked)
    topic.subs.append(d)
    return topic, d, made, saved, dead
