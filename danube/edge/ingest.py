"""The edge's local topics: one WAL per mapped Danube topic (danube.storage's WAL, fsync'd
group commit), each message stored as the StreamMessage the cluster will receive, and the
topic's readiness (its schema, cached from the cluster, and whether payloads are validated).

Upstream buffers MQTT messages in memory and acknowledges them before they reach its WAL
(mqtt/ingester.rs); here the messages of one read from a connection are appended to the
WAL together (one append per topic) and a QoS 1/2 device is acknowledged once a sync covers
them (the WAL's group commit shares one fsync among every message appended meanwhile, which
is the batching upstream's ingestion.batch_size and batch_timeout_ms did). A crash after
PUBACK loses nothing."""

import logging
import os
import secrets

from danube.mqtt import codec
from danube.metadata import keys
from danube.proto import DanubeApi_pb2 as pb
from danube.schema import formats
from danube.schema.errors import PayloadInvalid, SchemaError
from danube.schema.validate import validator_for
from danube.storage.wal import ALWAYS, WAL, WALConfig

log = logging.getLogger("danube.edge")

PRODUCER_NAME = "mqtt-gateway"
LOG_ID_KEY = f"{keys.EDGE}/log_id"


class NotReady(Exception):
    """The topic waits for its schema from the cluster (transient)."""


class Invalid(Exception):
    """The payload fails the topic's schema (permanent: resending it cannot help)."""


class LocalTopic:
    def __init__(self, mapping, wal, log_id=0):
        self.name = mapping.danube_topic
        self.subject = mapping.schema_subject
        self.enforce = mapping.enforce
        self.wal = wal
        self.schema = None              # the ResolvedSchema fields, as a dict
        self.validator = None
        self.ready = self.subject is None   # raw bytes need nothing from the cluster
        self.received = 0
        self.rejected = 0
        # msg_id (the topic's name) before the payload, serialized once.
        # msg_id.producer_id carries the edge's log id (see Ingest.open).
        self.log_id = log_id
        self.prefix = pb.StreamMessage(msg_id=pb.MsgID(
            producer_id=log_id, topic_name=self.name)).SerializeToString()
        self._suffixes = {}

    def suffix(self, attributes):
        """producer_name, the route's attributes and the schema's id and version, as the
        fields after publish_time (one serialization per distinct set of attributes)."""
        key = tuple(attributes.items())
        found = self._suffixes.get(key)
        if found is None:
            msg = pb.StreamMessage(producer_name=PRODUCER_NAME, attributes=attributes)
            if self.schema is not None:
                msg.schema_id = self.schema["schema_id"]
                msg.schema_version = self.schema["schema_version"]
            found = msg.SerializeToString()
            if len(self._suffixes) >= 4096:
                self._suffixes.clear()
            self._suffixes[key] = found
        return found

    def set_schema(self, schema):
        """Cache the cluster's ResolvedSchema (a dict; None: the subject is gone)."""
        self.schema = schema
        self.validator = None
        self._suffixes = {}
        if schema is None:
            self.ready = self.subject is None
            return
        try:
            defn = formats.from_definition_json(schema["schema_definition"].decode())
            self.validator = validator_for(defn)
        except (SchemaError, UnicodeDecodeError, KeyError) as exc:
            log.warning("%s: schema %r from the cluster cannot be compiled (%s): payloads "
                        "are not validated", self.name, schema.get("subject"), exc)
        self.ready = True


class Ingest:
    """Owns the local topics' WALs. ``store(route, publish)`` appends one MQTT message and
    returns (wal, offset)."""

    def __init__(self, cfg, data_dir, store):
        self.cfg = cfg
        self.data_dir = data_dir
        self.store = store              # the edge's metadata store (checkpoints, schemas)
        self.topics = {}
        self.log_id = 0

    async def open(self):
        # The id of this data directory's logs, made once: the edge's offsets start again
        # at 0 in a new directory (a replaced disk, a re-provisioned edge of the same name),
        # and the cluster tells a new log from a resend of the old one by it (stamped in
        # every message's msg_id.producer_id, which upstream's edge leaves 0).
        self.log_id = await self.store.get(LOG_ID_KEY)
        if not isinstance(self.log_id, int):
            self.log_id = secrets.randbits(63) or 1
            await self.store.put(LOG_ID_KEY, self.log_id)
        wal_cfg = WALConfig(durability=ALWAYS,
                            segment_max_bytes=self.cfg.wal_segment_max_bytes,
                            segment_initial_bytes=min(1 << 20, self.cfg.wal_segment_max_bytes))
        for mapping in self.cfg.danube_topics():
            ns, name = keys.split_topic(mapping.danube_topic)
            wal = await WAL.open(os.path.join(self.data_dir, "wal", ns, name), wal_cfg)
            topic = LocalTopic(mapping, wal, self.log_id)
            cached = await self.store.get(_schema_key(topic.name))
            if cached and topic.subject is not None:
                topic.set_schema(_schema_from_json(cached))
            self.topics[topic.name] = topic
            log.info("local topic %s: WAL offsets %d..%d%s", topic.name, wal.first_offset,
                     wal.next_offset - 1, "" if topic.ready else
                     f" (waits for schema {topic.subject!r} from the cluster)")

    async def set_schema(self, name, schema):
        """A schema the cluster resolved (RegisterEdge, heartbeat), kept for restarts."""
        topic = self.topics.get(name)
        if topic is None:
            return
        topic.set_schema(schema)
        if schema is None:
            await self.store.delete(_schema_key(name))
        else:
            await self.store.put(_schema_key(name), _schema_to_json(schema))

    def encode(self, route, publish, now_ms):
        """``publish`` (a codec.Publish) as the StreamMessage its route's topic stores:
        (LocalTopic, bytes). Raises NotReady or Invalid.

        Written by hand in canonical field order (msg_id, payload, publish_time, then the
        fields every message of the route shares, serialized once): a protobuf object per
        message cost more than the rest of the ingest path together. A message with MQTT 5
        properties (more attributes) goes through protobuf."""
        topic = self.topics[route.topic]
        topic.received += 1
        if not topic.ready:
            raise NotReady(f"topic {topic.name} waits for schema {topic.subject!r} from "
                           f"the cluster")
        payload = publish.payload
        if topic.enforce and topic.validator is not None:
            try:
                topic.validator.check(payload)
            except PayloadInvalid as exc:
                topic.rejected += 1
                raise Invalid(str(exc)) from None
        if publish.properties:
            return topic, self._with_properties(topic, route, publish, now_ms)
        return topic, b"".join((topic.prefix, b"\x1a", _varint(len(payload)), payload,
                                b"\x20", _varint(now_ms), topic.suffix(route.attributes)))

    def _with_properties(self, topic, route, publish, now_ms):
        msg = pb.StreamMessage(payload=publish.payload, publish_time=now_ms,
                               producer_name=PRODUCER_NAME)
        msg.msg_id.topic_name = topic.name
        msg.msg_id.producer_id = topic.log_id
        msg.attributes.update(route.attributes)
        for pid, value in publish.properties:
            if pid == codec.CONTENT_TYPE:
                msg.attributes["mqtt.content_type"] = value
            elif pid == codec.RESPONSE_TOPIC:
                msg.attributes["mqtt.response_topic"] = value
            elif pid == codec.USER_PROPERTY:
                msg.attributes[f"mqtt.user.{value[0]}"] = value[1]
        schema = topic.schema
        if schema is not None:
            msg.schema_id = schema["schema_id"]
            msg.schema_version = schema["schema_version"]
        return msg.SerializeToString()

    async def close(self):
        for topic in self.topics.values():
            await topic.wal.close()


def _varint(n):
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _schema_key(topic):
    return f"{keys.EDGE}/schemas{topic}"


def _schema_to_json(schema):
    out = dict(schema)
    out["schema_definition"] = schema["schema_definition"].decode("utf-8", "replace")
    return out


def _schema_from_json(doc):
    out = dict(doc)
    out["schema_definition"] = doc["schema_definition"].encode()
    return out
