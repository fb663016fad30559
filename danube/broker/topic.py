"""A topic served by this broker: its producers and subscriptions, and the publish path."""

import dataclasses

from danube.broker._canon import DeliveryStamp, canonical_stream_message
from danube.broker._fanout import fanout
from danube.broker.errors import MessageTooLarge, PublishFailed, StorageFailed
from danube.config import Policies
from danube.storage.errors import WALError
from danube.storage.wal import ALWAYS

NON_RELIABLE, RELIABLE = 0, 1
DELIVERY_NAMES = {NON_RELIABLE: "NonReliable", RELIABLE: "Reliable"}


@dataclasses.dataclass
class Producer:
    producer_id: int
    name: str
    topic: "Topic"
    access_mode: int = 0
    active: bool = True
    sent: int = 0


class Topic:
    def __init__(self, broker, name, delivery=NON_RELIABLE):
        self.broker = broker
        self.name = name
        self.delivery = delivery
        self.producers = {}           # producer_id -> Producer
        self.producers_by_name = {}
        self.subscriptions = {}       # name -> Subscription
        self._fanouts = []
        self.closed = False
        self.policies = Policies()
        self.messages_in = 0
        self.bytes_in = 0
        self.log = None               # the WAL, for reliable topics
        self.tier = None              # its TopicTier when storage is tiered
        self.durability = None
        self._delivery_stamp = None

    @property
    def dispatchable_end(self):
        """Offsets below this may be delivered. In mode `always` only what a sync covers is
        delivered, so a consumer never sees a message that a machine crash could take back
        (and whose offset would then be given to another message)."""
        if self.durability == ALWAYS:
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

    async def publish_reliable_raw(self, batch, msg_id_fields, own_id_fields, extra):
        """Batched reliable publish of a ``danube._core.MessageBatchView``: msg_id (with
        topic_offset) and producer_name are stamped by appending fields protobuf merges,
        all messages into one packed buffer that the WAL frames as it is, so there is no
        Python object per message (see ``MessageBatchView.stamp``; delivery merges them
        into canonical form). Returns the offsets."""
        if self.closed:
            raise PublishFailed(f"topic {self.name} is closed")
        self._check_size(batch.max_payload)
        data, ends = batch.stamp(self.log.next_offset, msg_id_fields, own_id_fields, extra)
        return await self._store(data, batch.payload_bytes, ends)

    async def publish_reliable(self, messages):
        """Append StreamMessages to the log with their offsets stamped in msg_id.topic_offset,
        wait for durability as the topic's mode says, then wake the subscriptions. Returns
        the offsets. Messages are all checked first, so a batch is taken whole or not at
        all."""
        if self.closed:
            raise PublishFailed(f"topic {self.name} is closed")
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
            if self.durability == ALWAYS:
                await log.sync_to(last)
        except WALError as exc:
            raise StorageFailed(f"could not store the messages on {self.name}: {exc}") from exc
        self.messages_in += last - first + 1
        self.bytes_in += nbytes
        for sub in self.subscriptions.values():
            sub.dispatcher.notify()
        return range(first, last + 1)

    @property
    def delivery_name(self):
        return DELIVERY_NAMES[self.delivery]

    def subscriptions_changed(self):
        if self.delivery == NON_RELIABLE:
            self._fanouts = [s.fanout for s in self.subscriptions.values()]

    def publish(self, raw, payload_len, key):
        """Non-reliable publish: the producer's StreamMessage goes to every subscription
        with its values unchanged (as upstream, topic_offset 0), in canonical form (the
        official clients' bytes already are, and pass through as they came)."""
        if self.closed:
            raise PublishFailed(f"topic {self.name} is closed")
        self._check_size(payload_len)
        self.messages_in += 1
        self.bytes_in += payload_len
        if self._fanouts:
            fanout(self._fanouts, canonical_stream_message(raw), key)
