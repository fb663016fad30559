"""Upstream Danube's metadata key layout (reference section d.2), built in one place.

Keeping every key shape here means the broker, the cluster layer and the admin service cannot
drift apart on a spelling, and the layout stays the one upstream uses, so a reader who knows
Danube finds the same keys. Each helper's docstring gives the value stored under the key.

Topic names are passed whole, in canonical form ``/ns/topic``, as they travel through the
broker; upstream builds its keys by appending that name, which is why a namespace's topic
membership key repeats the namespace (``/namespaces/ns/topics/ns/topic``). Helpers ending in
``_prefix`` name a subtree for ``scan``/``watch``/``delete_prefix``; the store's '/' boundary
keeps ``/ns/foo``'s subtree free of ``/ns/foobar``.

Ids (broker, producer, schema) are u64 in upstream and appear in keys as decimal strings.
"""

from __future__ import annotations

# -- roots -----------------------------------------------------------------------------------

CLUSTER = "/cluster"
CLUSTER_REGISTER = "/cluster/register"
CLUSTER_BROKERS = "/cluster/brokers"
CLUSTER_UNASSIGNED = "/cluster/unassigned"
CLUSTER_LOAD = "/cluster/load"
CLUSTER_LEADER = "/cluster/leader"
"""Value: the leader's broker id."""
NAMESPACES = "/namespaces"
TOPICS = "/topics"
SCHEMAS = "/schemas"
SCHEMA_NEXT_ID = "/schemas/_global/next_schema_id"
"""Value: the last schema id allocated (an ``allocate_id`` counter)."""
SCHEMA_INDEX_BY_ID = "/schemas/_index/by_id"
AUTH_ROLES = "/auth/roles"
AUTH_BINDINGS = "/auth/bindings"
EDGE = "/edge"
DEFAULT_METADATA_PREFIX = "/danube"
"""Upstream's ``metadata_prefix``, under which the durable storage catalogue lives."""

SEGMENT_OFFSET_DIGITS = 20


def _segment(value, what: str) -> str:
    text = str(value)
    if "/" in text:
        raise ValueError(f"{what} must not contain '/': {text!r}")
    return text


def split_topic(topic: str) -> tuple[str, str]:
    """``"/ns/topic"`` -> ``("ns", "topic")``; ValueError unless the name is canonical."""
    parts = topic.split("/") if isinstance(topic, str) else ()
    if len(parts) != 3 or parts[0]:
        raise ValueError(f"topic name must have the form /namespace/topic, got {topic!r}")
    return parts[1], parts[2]


def _topic(topic: str) -> str:
    split_topic(topic)
    return topic


# -- cluster ---------------------------------------------------------------------------------

def cluster(cluster_name: str) -> str:
    """Value: null (the cluster exists)."""
    return f"{CLUSTER}/{_segment(cluster_name, 'cluster name')}"


def cluster_register(broker_id) -> str:
    """Value: ``{"broker_url","connect_url","admin_addr","prom_exporter"?}``; TTL 32 s in a
    cluster, renewed every ~10 s; no TTL standalone."""
    return f"{CLUSTER_REGISTER}/{_segment(broker_id, 'broker id')}"


def cluster_broker_prefix(broker_id) -> str:
    """Subtree of one broker: its state and its topic assignments."""
    return f"{CLUSTER_BROKERS}/{_segment(broker_id, 'broker id')}"


def cluster_broker_state(broker_id) -> str:
    """Value: ``{"mode":"active"|"draining"|"drained","reason":...}``."""
    return f"{cluster_broker_prefix(broker_id)}/state"


def cluster_broker_topic(broker_id, topic: str) -> str:
    """Value: null; the key's existence assigns ``topic`` to the broker (the owner watches
    ``cluster_broker_prefix``)."""
    return f"{cluster_broker_prefix(broker_id)}{_topic(topic)}"


def cluster_unassigned(topic: str) -> str:
    """Value: null for a new topic; ``{"reason":"unload","from_broker":id,"ready":bool}``; or
    ``{"reason":"rebalance","from_broker":id,"to_broker":id}``."""
    return f"{CLUSTER_UNASSIGNED}{_topic(topic)}"


def cluster_load(broker_id) -> str:
    """Value: a LoadReport (``resources_usage``, ``topics``, totals, ``timestamp``,
    ``broker_id``)."""
    return f"{CLUSTER_LOAD}/{_segment(broker_id, 'broker id')}"


# -- namespaces ------------------------------------------------------------------------------

def namespace_prefix(ns: str) -> str:
    """Subtree of one namespace: its policy and its topic membership keys."""
    return f"{NAMESPACES}/{_segment(ns, 'namespace')}"


def namespace_policy(ns: str) -> str:
    """Value: Policies JSON (the 7 policy fields). The namespace exists exactly when this key
    does."""
    return f"{namespace_prefix(ns)}/policy"


def namespace_topics_prefix(ns: str) -> str:
    """Subtree of the namespace's topic membership keys."""
    return f"{namespace_prefix(ns)}/topics"


def namespace_topic(topic: str) -> str:
    """Value: null (membership): ``/namespaces/{ns}/topics/{ns}/{topic}``."""
    ns, _ = split_topic(topic)
    return f"{namespace_topics_prefix(ns)}{topic}"


# -- topics ----------------------------------------------------------------------------------

def topic_root(topic: str) -> str:
    """Value: a number (only the system topic uses it); also the prefix of everything stored
    about the topic."""
    return f"{TOPICS}{_topic(topic)}"


def topic_delivery(topic: str) -> str:
    """Value: ``"Reliable"`` or ``"NonReliable"``."""
    return f"{topic_root(topic)}/delivery"


def topic_owner_epoch(topic: str) -> str:
    """Value: an integer raised by each broker that begins to own the reliable topic (ours;
    the fencing token its writes to shared storage carry, docs/cluster.md)."""
    return f"{topic_root(topic)}/owner_epoch"


def topic_owner(topic: str) -> str:
    """Value: ``{"broker": id, "epoch": n}``, the last broker that began to own the reliable
    topic (ours): one that finds another broker named here knows its own local WAL of the
    topic is a past ownership's."""
    return f"{topic_root(topic)}/owner"


def topic_policy(topic: str) -> str:
    """Value: topic-level Policies JSON (optional; the namespace policy is the fallback)."""
    return f"{topic_root(topic)}/policy"


def topic_schema_subject(topic: str) -> str:
    """Value: the subject name string."""
    return f"{topic_root(topic)}/schema_subject"


def topic_schema_config(topic: str) -> str:
    """Value: ``{"subject","validation_policy":"None"|"Warn"|"Enforce",
    "enable_payload_validation"}``."""
    return f"{topic_root(topic)}/schema_config"


def topic_producers_prefix(topic: str) -> str:
    """Subtree of the topic's producers."""
    return f"{topic_root(topic)}/producers"


def topic_producer(topic: str, producer_id) -> str:
    """Value: ``{"producer_id","producer_name","topic_name","access_mode","status"}``."""
    return f"{topic_producers_prefix(topic)}/{_segment(producer_id, 'producer id')}"


def topic_subscriptions_prefix(topic: str) -> str:
    """Subtree of the topic's subscriptions."""
    return f"{topic_root(topic)}/subscriptions"


def topic_subscription(topic: str, subscription: str) -> str:
    """Value: SubscriptionOptions JSON; also the prefix of the subscription's other keys."""
    return f"{topic_subscriptions_prefix(topic)}/{_segment(subscription, 'subscription')}"


def subscription_cursor(topic: str, subscription: str) -> str:
    """Value: u64, the last contiguously acknowledged offset."""
    return f"{topic_subscription(topic, subscription)}/cursor"


def subscription_acked(topic: str, subscription: str) -> str:
    """Value: ``[[first, last], ...]``, offsets above the cursor acknowledged out of order
    (inclusive ranges), so a restart redelivers only what was not acknowledged."""
    return f"{topic_subscription(topic, subscription)}/acked"


def subscription_failure_policy(topic: str, subscription: str) -> str:
    """Value: ``{max_redelivery_count, ack_timeout_ms, base_redelivery_delay_ms,
    max_redelivery_delay_ms, backoff_strategy, dead_letter_topic, poison_policy}``."""
    return f"{topic_subscription(topic, subscription)}/failure_policy"


def subscription_dispatch_config(topic: str, subscription: str) -> str:
    """Value: ``{"max_unacked_messages": N}``."""
    return f"{topic_subscription(topic, subscription)}/dispatch_config"


# -- schema registry -------------------------------------------------------------------------

def schema_subject_prefix(subject: str) -> str:
    """Subtree of one schema subject."""
    return f"{SCHEMAS}/{_segment(subject, 'schema subject')}"


def schema_metadata(subject: str) -> str:
    """Value: SchemaMetadata JSON (id, subject, versions, latest_version, compatibility_mode,
    created/updated_at, created_by, topics_using)."""
    return f"{schema_subject_prefix(subject)}/metadata"


def schema_versions_prefix(subject: str) -> str:
    """Subtree of the subject's versions."""
    return f"{schema_subject_prefix(subject)}/versions"


def schema_version(subject: str, version: int) -> str:
    """Value: SchemaVersion JSON."""
    return f"{schema_versions_prefix(subject)}/{_segment(version, 'schema version')}"


def schema_compatibility(subject: str) -> str:
    """Value: the subject's compatibility mode."""
    return f"{schema_subject_prefix(subject)}/compatibility"


def schema_by_id(schema_id) -> str:
    """Value: ``{"schema_id", "subject"}`` (reverse index)."""
    return f"{SCHEMA_INDEX_BY_ID}/{_segment(schema_id, 'schema id')}"


# -- security --------------------------------------------------------------------------------

def auth_role(name: str) -> str:
    """Value: an RBAC role definition."""
    return f"{AUTH_ROLES}/{_segment(name, 'role name')}"


def auth_binding(scope: str, resource: str, binding_id: str) -> str:
    """Value: an RBAC binding. Cluster bindings live at ``/auth/bindings/cluster/{id}``,
    the others at ``/auth/bindings/{scope}/{resource}/{id}``; a topic resource keeps its
    own slashes (``/auth/bindings/topic/ns/t/{id}``), as upstream's join_path makes it."""
    bid = _segment(binding_id, "binding id")
    if scope == "cluster":
        return f"{AUTH_BINDINGS}/cluster/{bid}"
    resource = resource.strip("/")
    if not resource:
        raise ValueError(f"a {scope} binding needs a resource name")
    return f"{AUTH_BINDINGS}/{_segment(scope, 'scope')}/{resource}/{bid}"


# -- durable storage catalogue ---------------------------------------------------------------

def storage_topic_prefix(topic: str, metadata_prefix: str = DEFAULT_METADATA_PREFIX) -> str:
    """Subtree of the topic's durable storage catalogue."""
    return f"{metadata_prefix}/storage/topics{_topic(topic)}"


def storage_segments_prefix(topic: str, metadata_prefix: str = DEFAULT_METADATA_PREFIX) -> str:
    """Subtree of the topic's segment descriptors (and the ``cur`` pointer)."""
    return f"{storage_topic_prefix(topic, metadata_prefix)}/segments"


def storage_segment(topic: str, start_offset: int,
                    metadata_prefix: str = DEFAULT_METADATA_PREFIX) -> str:
    """Value: SegmentDescriptor ``{segment_id, start_offset, end_offset, size, etag?,
    created_at, completed, offset_index?}``; the offset is zero-padded to 20 digits so keys
    sort by offset."""
    if isinstance(start_offset, bool) or not isinstance(start_offset, int) or start_offset < 0:
        raise ValueError(f"start offset must be a non-negative int, got {start_offset!r}")
    return (f"{storage_segments_prefix(topic, metadata_prefix)}/"
            f"{start_offset:0{SEGMENT_OFFSET_DIGITS}d}")


def storage_segments_cur(topic: str, metadata_prefix: str = DEFAULT_METADATA_PREFIX) -> str:
    """Value: ``{"start": "<20-digit start offset>"}``, the current segment pointer."""
    return f"{storage_segments_prefix(topic, metadata_prefix)}/cur"


def storage_topic_state(topic: str, metadata_prefix: str = DEFAULT_METADATA_PREFIX) -> str:
    """Value: the sealed marker ``{sealed, last_committed_offset, broker_id, timestamp}``."""
    return f"{storage_topic_prefix(topic, metadata_prefix)}/state"


# -- edges (danube.edge.EdgeReplicatorService; upstream's edge_service keys) -----------------

EDGE_REGISTRY = "/edge_registry/edges"


def edge_registry(edge_name: str) -> str:
    """Value: ``{"config_version","registered_at","last_heartbeat","topics":{topic:
    {"schema_subject","schema_id","schema_version","schema_fingerprint"}}}`` (upstream's
    EdgeState), plus ``"observed"``: the schema fingerprints the last heartbeat saw."""
    return f"{EDGE_REGISTRY}/{_segment(edge_name, 'edge name')}"


def edge_replicated(topic: str) -> str:
    """Value: the highest edge offset of ``topic`` stored on the cluster (the ReplicateData
    idempotency marker): ``{"log": edge log id, "offset": u64}``, or a plain u64 (upstream's
    form) for an edge that sends no log id."""
    return f"{EDGE}/replicated{_topic(topic)}"


def edge_checkpoint(topic: str) -> str:
    """Edge side. Value: u64, the highest local offset of ``topic`` the cluster acked."""
    return f"{EDGE}/checkpoints{_topic(topic)}"
