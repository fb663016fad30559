"""A topic served by this broker: its producers and subscriptions, and the publish path."""

import asyncio
import dataclasses
import time

from google.protobuf.message import DecodeError

from danube.broker._canon import DeliveryStamp, canonical_stream_message
from danube.broker._fanout import fanout
from danube.broker.errors import (BrokerError, InvalidArgument, MessageTooLarge,
                                  PartlyPublished, PublishFailed, TopicUnloaded,
                                  storage_error)
from danube.broker.rate import RateLimiter
from danube.config import Policies
from danube.metering import Summary
from danube.proto import DanubeApi_pb2 as pb
from danube.storage.errors import WALError

NON_RELIABLE, RELIABLE = 0, 1
DELIVERY_NAMES = {NON_RELIABLE: "NonReliable", RELIABLE: "Reliable"}


@dataclasses.dataclass
class Producer:
    producer_id: int
    name: str
    topic: "Topic"
    access_mode: int = 0
    active: bool = True
    # The connection that created it (what has ``closed``), None in-process: a producer
    # whose connection closed no longer keeps its topic loaded (danube.broker.core.idle).
    client: object = None
    sent: int = 0
    _batch_stamp: tuple | None = None

    @property
    def batch_stamp(self):
        """What a batch stamp appends to each of this producer's messages:
        msg_id.producer_id, msg_id.topic_name (only over a msg_id the message came with:
        otherwise the topic's delivery stamp supplies it) and producer_name, serialized
        once per producer."""
        if self._batch_stamp is None:
            self._batch_stamp = (
                pb.MsgID(producer_id=self.producer_id).SerializeToString(),
                pb.MsgID(topic_name=self.topic.name).SerializeToString(),
                pb.StreamMessage(producer_name=self.name).SerializeToString())
        return self._batch_stamp


class Topic:
    def __init__(self, broker, name, delivery=NON_RELIABLE):
        self.broker = broker
        self.lease = broker.placement.lease
        self.name = name
        self.delivery = delivery
        self.producers = {}           # producer_id -> Producer
        self.producers_by_name = {}
        self.subscriptions = {}       # name -> Subscription
        self._fanouts = []
        self.closed = False
        self.publish_limiter = None   # policies.max_publish_rate's RateLimiter, if set
        self.policies = Policies()
        self.messages_in = 0
        self.bytes_in = 0
        self.log = None               # its TopicLog, for reliable topics
        self.durability = None
        self._delivery_stamp = None
        self.schema = None            # its SchemaGate, once bound to a schema subject
        self.close_reason = None      # a BrokerError publishes get once it is closed, if set
        self.rate_window = None       # its recent counters, for rates (danube.broker.stats)
        # Upstream's danube_topic_message_size_bytes, danube_producer_send_latency_ms and
        # danube_producer_send_total{result, error_code}.
        self.message_sizes = Summary()
        self.send_latency_ms = Summary()
        self.send_results = {}        # ("error", error_code) -> refused sends
        # Since when nobody uses it (None: in use), and messages_in when last looked at
        # (danube.broker.core.idle).
        self.idle_since = None
        self.idle_mark = 0

    @property
    def policies(self):
        return self._policies

    @policies.setter
    def policies(self, policies):
        self._policies = policies
        rate = policies.max_publish_rate
        self.publish_limiter = RateLimiter(rate, time.monotonic()) if rate else None

    @property
    def dispatchable_end(self):
        """Offsets below this may be delivered. In mode `always` only what a sync covers is
        delivered, so a consumer never sees a message that a machine crash could take back
        (and whose offset would then be given to another message)."""
        if self.log.ack_waits:
            # Only what an ack could have been given for (synced; with a write buffer,
            # confirmed by it; in mode uploaded, uploaded): nothing else is sure to keep
            # its offset when the log is recovered elsewhere.
            return self.log.durable_offset + 1
        return self.log.next_offset

    def read(self, offset, max_messages):
        return self.log.read(offset, max_messages)

    @property
    def delivery_stamp(self):
        """What every stored message of a reliable topic is delivered with: msg_id's
        topic_name and broker_addr, the same for all of its messages, so the WAL (and the
        durable tier) does not store them in every frame. Delivery rewrites each frame with
        them into one msg_id (a value the frame does hold, e.g. a client's broker_addr,
        wins), so no client has to merge two msg_ids."""
        if self._delivery_stamp is None:
            self._delivery_stamp = DeliveryStamp(self.name,
                                                 self.broker.cfg.advertised_broker_url)
        return self._delivery_stamp

    def stored_form(self, msg):
        """``msg`` (a StreamMessage whose offset is stamped) serialized as the WAL keeps it:
        without the msg_id fields ``delivery_stamp`` gives back on delivery, nor unknown
        fields (delivery drops them, as upstream's prost does)."""
        mid = msg.msg_id
        if mid.topic_name == self.name:
            mid.ClearField("topic_name")
        if mid.broker_addr == self.broker.cfg.advertised_broker_url:
            mid.ClearField("broker_addr")
        msg.DiscardUnknownFields()
        return msg.SerializeToString()

    def _check_size(self, payload_len):
        limit = self.policies.max_message_size
        if limit and payload_len > limit:
            raise MessageTooLarge(f"message of {payload_len} bytes exceeds max_message_size "
                                  f"({limit} bytes) on {self.name}")

    async def publish(self, message, producer=None, raw=None):
        """The one publish path. ``message`` is a StreamMessage (``raw``: its bytes as the
        client sent them, when there are any) or a batch from ``producer`` (a
        ``danube.broker._stamp.MessageBatchView``). A reliable topic stamps each message's
        offset and stores the whole message or batch at once, or nothing of it; a
        non-reliable one fans each message out to the subscriptions as it comes. Returns the
        offsets (a range) on a reliable topic, None on a non-reliable one. ``producer``, when
        given, counts what it got accepted.

        With ``policies.max_publish_rate`` set, a publish waits for its turn: the topic's
        producers together are held to the rate (upstream only logs a warning and takes
        the message; here nothing is refused or lost, the answer comes later)."""
        limiter = self.publish_limiter
        if limiter is not None:
            count = 1 if isinstance(message, pb.StreamMessage) else len(message)
            delay = limiter.reserve(count, time.monotonic())
            if delay > 0:
                await asyncio.sleep(delay)
        if isinstance(message, pb.StreamMessage):
            self.message_sizes.observe(len(message.payload))
        elif len(message):
            self.message_sizes.observe_many(len(message), message.payload_bytes,
                                            message.payload_bytes / len(message))
        gate = self.schema
        if gate is not None and gate.policy != "none":
            if isinstance(message, pb.StreamMessage):
                await gate.check_message(message)
            else:
                await gate.check_batch(message)
        if isinstance(message, pb.StreamMessage):
            if self.delivery == RELIABLE:
                offsets = await self._store_messages([message])
            else:
                self._fan_out_message(message, raw)
                offsets = None
            if producer is not None:
                producer.sent += 1
            return offsets
        if self.delivery == RELIABLE:
            offsets = await self._store_batch(message, producer)
            producer.sent += len(offsets)
            return offsets
        self._fan_out_batch(message, producer)
        return None

    async def append_replicated(self, messages):
        """StreamMessages an edge replicated (danube.broker.edges): stored as they came,
        each with this topic's offset, without a producer of this broker. The edge has
        validated them against its cached schema, as upstream's central broker writes them
        straight to the WAL. A non-reliable topic fans them out instead (None)."""
        if self.delivery == RELIABLE:
            return await self._store_messages(messages)
        for msg in messages:
            self._fan_out_message(msg)
        return None

    async def _store_batch(self, batch, producer):
        """A ``danube.broker._stamp.MessageBatchView``: msg_id (with topic_offset) and
        producer_name are stamped by appending fields protobuf merges, all messages into one
        packed buffer that the WAL frames as it is, so there is no Python object per message (see
        ``MessageBatchView.stamp``; delivery merges them into canonical form)."""
        if self.closed:
            raise self.closed_error()
        self._check_size(batch.max_payload)
        data, ends = batch.stamp(self.log.next_offset, *producer.batch_stamp)
        return await self._store(data, batch.payload_bytes, ends)

    async def _store_messages(self, messages):
        """StreamMessages with their offsets stamped in msg_id.topic_offset. Messages are
        all checked first, so a batch is taken whole or not at all."""
        if self.closed:
            raise self.closed_error()
        for msg in messages:
            self._check_size(len(msg.payload))
        first = self.log.next_offset
        raws = []
        for i, msg in enumerate(messages):
            msg.msg_id.topic_offset = first + i
            raws.append(self.stored_form(msg))
        return await self._store(raws, sum(len(m.payload) for m in messages))

    async def _store(self, raws, nbytes, ends=None):
        """Append to the log (``raws`` packed in one buffer when ``ends`` is given, see
        ``WAL.append_packed``), wait for durability as the topic's mode says, then wake the
        subscriptions. Returns the offsets (a range)."""
        log = self.log
        try:
            first, last = log.append(raws) if ends is None else log.append_packed(raws, ends)
            if log.ack_waits:
                await log.sync_to(last)
        except (WALError, OSError) as exc:
            # DiskFull and DescriptorLimit (RESOURCE_EXHAUSTED) or StorageFailed.
            raise storage_error(exc, f"could not store the messages on {self.name}") from exc
        if time.monotonic() >= self.lease.deadline:
            # Paused past the lease: another broker may own the topic by now, and what was
            # just stored may not be in its log. Not acknowledged: the client sends it again
            # to whoever owns the topic (at least once).
            raise TopicUnloaded(f"topic {self.name}: this broker's cluster lease ran out "
                                f"before the ack; look the topic up and send again")
        self.messages_in += last - first + 1
        self.bytes_in += nbytes
        self.wake_subscriptions()
        return range(first, last + 1)

    def wake_subscriptions(self):
        for sub in self.subscriptions.values():
            sub.dispatcher.notify()

    def record_send(self, started, error_code=None):
        """One send at the API boundary (SendMessage, or a batch) that began at
        ``started`` (time.perf_counter()): its latency when it was accepted, its outcome
        by upstream's error codes (``error_code`` the status code's name, e.g.
        INVALID_ARGUMENT -> InvalidArgument)."""
        if error_code is None:
            self.send_latency_ms.observe((time.perf_counter() - started) * 1000.0)
            return
        key = ("error", "".join(w.capitalize() for w in error_code.split("_")))
        self.send_results[key] = self.send_results.get(key, 0) + 1

    def closed_error(self):
        """What a publish to the closed topic is refused with: the reason it was closed
        (e.g. unloaded: clients retry and look it up again), or PublishFailed."""
        return self.close_reason or PublishFailed(f"topic {self.name} is closed")

    @property
    def delivery_name(self):
        return DELIVERY_NAMES[self.delivery]

    def subscriptions_changed(self):
        if self.delivery == NON_RELIABLE:
            self._fanouts = [s.fanout for s in self.subscriptions.values()]

    def _fan_out_message(self, msg, raw=None):
        """Non-reliable: the producer's StreamMessage goes to every subscription with its
        values unchanged (as upstream, topic_offset 0), in canonical form (the official
        clients' bytes already are, and pass through as they came)."""
        if raw is None:
            raw = msg.SerializeToString()
        key = msg.routing_key if msg.HasField("routing_key") else msg.producer_name
        if self.closed:
            raise self.closed_error()
        payload_len = len(msg.payload)
        self._check_size(payload_len)
        self.messages_in += 1
        self.bytes_in += payload_len
        if self._fanouts:
            fanout(self._fanouts, canonical_stream_message(raw), key)

    def _fan_out_batch(self, batch, producer):
        """Non-reliable batch: each message is stamped with the producer (as SendMessage's
        client would have) and fanned out in turn; a message that fails ends the batch with
        PartlyPublished, saying how many went out before it."""
        raws = batch.messages()
        accepted = 0
        try:
            for index, raw in enumerate(raws):
                try:
                    msg = pb.StreamMessage.FromString(raw)
                except DecodeError as exc:
                    # The C index checks the framing, not the strings' UTF-8.
                    raise InvalidArgument(f"messages[{index}]: invalid StreamMessage: "
                                          f"{exc}") from None
                mid = msg.msg_id
                if not msg.HasField("msg_id"):
                    mid.broker_addr = self.broker.cfg.advertised_broker_url
                mid.producer_id = producer.producer_id
                mid.topic_name = self.name
                if not msg.producer_name:
                    msg.producer_name = producer.name
                self._fan_out_message(msg)
                accepted += 1
        except BrokerError as exc:
            raise PartlyPublished(exc, accepted, len(raws)) from None
        finally:
            producer.sent += accepted
