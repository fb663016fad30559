"""The central brokers' side of edge brokers (upstream's danube-broker/src/edge_service): an edge
registers the topics of its edge.yaml (created here under ``/{edge_name}/``, reliable, each
with its schema subject resolved from the registry), asks by heartbeat whether any of those
schemas changed, and replicates its local log into the topics batch by batch.

Per-edge state lives in the metadata store in upstream's shape (keys.edge_registry), so any
broker sharing the metadata can answer a heartbeat. Replication is idempotent: the highest edge
offset stored per topic (keys.edge_replicated) is written after the batch is durable, and a
batch resent after a lost ack is skipped message by message (upstream compares only the
batch's last offset, which stores a resent batch twice when its boundaries moved; see
docs/edge.md). The marker also names the edge log the offsets belong to (our edge stamps
its data directory's id in msg_id.producer_id): an edge that starts again from an empty
directory numbers from 0 again, and its messages must not be taken for resends.
"""

import asyncio
import logging
import time
import weakref

from danube.broker import names
from danube.broker.errors import (BrokerError, InvalidArgument, SchemaNotFound,
                                  TopicAlreadyExists)
from danube.broker.topic import RELIABLE
from danube.metadata import keys
from danube.metadata.errors import MetadataError

log = logging.getLogger("danube.broker.edges")

#: Topics one RegisterEdge may declare: an edge.yaml maps a few; the bound keeps one request
#: from creating topics without end.
MAX_EDGE_TOPICS = 1024

SCHEMA_UPDATED, SCHEMA_REMOVED, TOPIC_REMOVED = 0, 1, 2


class EdgeStateFailed(BrokerError):
    """The metadata store failed under an edge call (INTERNAL, as upstream answers)."""


def _stored(fn):
    """Metadata failures of an edge call as EdgeStateFailed, saying what failed."""
    async def call(self, *args):
        try:
            return await fn(self, *args)
        except MetadataError as exc:
            raise EdgeStateFailed(f"{_WHAT[fn.__name__]}: {exc}") from None
    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    return call


_WHAT = {"register": "failed to persist edge state", "heartbeat": "failed to load edge state",
         "ingest": "failed to store the replication marker"}


def _now():
    return int(time.time())


class EdgeRegistry:
    """Registration, heartbeats and replicated ingest, over the broker core."""

    def __init__(self, core):
        self.core = core
        self.store = core.store
        # topic -> lock: a topic's marker check and its append run one batch at a time (an
        # edge that reconnects may have two streams open for a moment). Weak: a lock lives
        # only while a batch holds or waits for it.
        self._locks = weakref.WeakValueDictionary()

    # -- registration ---------------------------------------------------------------------

    async def resolve_schema(self, subject):
        """The ResolvedSchema fields of ``subject``'s latest version, or None if the
        registry has no such subject."""
        registry = self.core.schemas
        try:
            doc = await registry.subject(subject)
        except (SchemaNotFound, BrokerError):
            return None
        entry = registry.version_of(doc)
        definition = registry.definition(entry)
        return {"subject": subject, "schema_id": doc["id"], "schema_version": entry["version"],
                "schema_type": entry["schema_type"],
                "schema_definition": definition.definition_json.encode(),
                "fingerprint": entry["fingerprint"],
                "compatibility_mode": str(doc["compatibility_mode"]).lower()}

    @_stored
    async def register(self, edge_name, declarations):
        """``declarations``: (topic_name, schema_subject or None) pairs. Returns
        (config_version, [result dict per declaration]) as upstream's register_edge."""
        names.validate_namespace(edge_name, "edge_name")
        if len(declarations) > MAX_EDGE_TOPICS:
            raise InvalidArgument(f"topics: {len(declarations)} declared, at most "
                                  f"{MAX_EDGE_TOPICS} per edge")
        prefix = f"/{edge_name}/"
        results, state_topics = [], {}
        for topic_name, subject in declarations:
            result = {"topic_name": topic_name, "topic_created": False,
                      "schema_resolved": False, "schema": None, "error": ""}
            results.append(result)
            if not topic_name.startswith(prefix):
                result["error"] = (f"topic must be under /{edge_name}/ namespace, got: "
                                   f"{topic_name}")
                continue
            try:
                await self.core.topic_table.create_topic(topic_name, RELIABLE)
                result["topic_created"] = True
            except TopicAlreadyExists:
                pass
            except BrokerError as exc:
                result["error"] = f"failed to create topic: {exc}"
                continue
            schema = await self.resolve_schema(subject) if subject is not None else None
            # No subject: raw bytes, resolved by definition (upstream).
            result["schema_resolved"] = subject is None or schema is not None
            result["schema"] = schema
            state_topics[topic_name] = {
                "schema_subject": subject,
                "schema_id": schema and schema["schema_id"],
                "schema_version": schema and schema["schema_version"],
                "schema_fingerprint": schema and schema["fingerprint"]}
        key = keys.edge_registry(edge_name)
        previous = await self.store.get(key)
        version = previous["config_version"] + 1 if isinstance(previous, dict) else 1
        now = _now()
        state = {"config_version": version, "registered_at": now, "last_heartbeat": now,
                 "topics": state_topics,
                 "observed": {t: [s["schema_fingerprint"], True]
                              for t, s in state_topics.items()}}
        await self.store.put(key, state)
        log.info("edge %s registered: config_version %d, %d topics (%d refused)", edge_name,
                 version, len(state_topics), len(results) - len(state_topics))
        return version, results

    # -- heartbeat ------------------------------------------------------------------------

    @_stored
    async def heartbeat(self, edge_name, edge_version):
        """(changed, config_version, [change dict]) as upstream's edge_heartbeat; None for
        an edge that never registered.

        Upstream bumps config_version from hooks in the schema registry's handlers; here
        the heartbeat itself looks at the edge's few subjects and topics and bumps the
        version when what it sees differs from what the previous heartbeat saw, so a
        change made by any path (admin API, another broker) is found. The changes are
        then reported against the registration, as upstream reports them."""
        names.validate_namespace(edge_name, "edge_name")
        key = keys.edge_registry(edge_name)
        state = await self.store.get(key)
        if not isinstance(state, dict):
            return None
        topics = state.get("topics", {})
        current = {}
        for topic_name, t in topics.items():
            subject = t.get("schema_subject")
            schema = await self.resolve_schema(subject) if subject is not None else None
            exists = await self._topic_exists(topic_name)
            current[topic_name] = (schema, exists)
        observed = {t: [s["fingerprint"] if s else None, e] for t, (s, e) in current.items()}
        if state.get("observed") != observed:
            state["config_version"] += 1
            state["observed"] = observed
        state["last_heartbeat"] = _now()
        await self.store.put(key, state)
        version = state["config_version"]
        if version == edge_version:
            return False, version, []
        changes = []
        for topic_name, t in topics.items():
            schema, exists = current[topic_name]
            if not exists:
                changes.append({"topic_name": topic_name, "change_type": TOPIC_REMOVED,
                                "schema": None,
                                "detail": f"topic '{topic_name}' no longer exists on cluster"})
                continue
            subject = t.get("schema_subject")
            if subject is None:
                continue
            if schema is not None and schema["fingerprint"] != t.get("schema_fingerprint"):
                changes.append({"topic_name": topic_name, "change_type": SCHEMA_UPDATED,
                                "schema": schema,
                                "detail": f"schema '{subject}' updated (fingerprint changed)"})
            elif schema is None and t.get("schema_id") is not None:
                changes.append({"topic_name": topic_name, "change_type": SCHEMA_REMOVED,
                                "schema": None,
                                "detail": f"schema subject '{subject}' no longer exists on "
                                          f"cluster"})
        return bool(changes), version, changes

    async def _topic_exists(self, name):
        if self.core.topic_table.serves(name):
            return True
        return await self.store.get_entry(keys.namespace_topic(name)) is not None

    # -- replication ----------------------------------------------------------------------

    @_stored
    async def ingest(self, topic_name, batch_last_offset, messages):
        """Store a replicated batch (StreamMessages whose msg_id.topic_offset is the edge's
        offset) unless it is stored already; returns how many were stored."""
        names.validate_topic(topic_name)
        # The marker check, the append and the marker's update run to the end even when
        # the edge's stream ends meanwhile (the call is cancelled): a batch stored without
        # its marker would be stored again when the edge resends it.
        return await asyncio.shield(asyncio.ensure_future(
            self._ingest(topic_name, batch_last_offset, messages)))

    async def _ingest(self, topic_name, last, messages):
        lock = self._locks.get(topic_name)
        if lock is None:
            lock = self._locks[topic_name] = asyncio.Lock()
        async with lock:
            topic = await self.core.topic_table.use(topic_name)
            key = keys.edge_replicated(topic_name)
            log_id = _log_of(messages)
            stored_log, marker = _marker(await self.store.get(key))
            if marker is not None and log_id != stored_log:
                log.warning("%s: replication from a new edge log (id %d, was %d: a new data "
                            "directory at the edge): its offsets are taken from 0 again",
                            topic_name, log_id, stored_log)
                marker = None
            fresh = _unseen(messages, last, marker)
            if fresh:
                await topic.append_replicated(fresh)
            if marker is None or last > marker:
                await self.store.put(key, {"log": log_id, "offset": last} if log_id else last)
            if len(fresh) < len(messages):
                log.info("%s: %d of %d replicated messages were stored already (edge offsets "
                         "up to %d)", topic_name, len(messages) - len(fresh), len(messages),
                         marker)
            return len(fresh)


def _log_of(messages):
    """The edge log a batch comes from: msg_id.producer_id, which our edge stamps with its
    data directory's id (0 from upstream's edge, and for a batch that mixes logs)."""
    ids = {m.msg_id.producer_id for m in messages}
    return ids.pop() if len(ids) == 1 else 0


def _marker(value):
    """(edge log id, highest edge offset stored) of a stored marker: upstream's plain u64
    (log 0), or ours with the log id."""
    if isinstance(value, dict):
        return value.get("log", 0), value.get("offset")
    return 0, value


def _unseen(messages, last, marker):
    """The messages above ``marker`` (the highest edge offset stored). When the batch's own
    offsets are not strictly increasing up to ``last`` (a client that does not number
    them), the batch is taken or skipped whole by ``last``, as upstream does."""
    if marker is None:
        return messages
    offsets = [m.msg_id.topic_offset for m in messages]
    ordered = offsets and offsets[-1] == last and all(
        a < b for a, b in zip(offsets, offsets[1:]))
    if not ordered:
        return messages if last > marker else []
    return [m for m, off in zip(messages, offsets) if off > marker]
