"""Which keys a broker YAML may hold: every key of upstream Danube v0.15.1's configuration
(its `danube_broker.yml`, `danube_broker_secure.yml`, docker and test configs, and the
aliases its loader accepts), plus ours. Upstream's loader ignores keys it does not know;
ours refuses them, so a typo is an error with a suggestion instead of a silently ignored
setting, while a file written for upstream always loads. Keys of upstream features this
build does not have are accepted and named in one warning line."""

from __future__ import annotations


class Unbuilt:
    """A key of an upstream feature this build does not have: loaded, then ignored."""

    def __init__(self, feature: str, keys: dict | None = None):
        self.feature = feature
        self.keys = keys    # a section's own keys, still checked for typos


KEY = "key"          # a leaf (or a list) read by the loader
OPAQUE = "opaque"    # a subtree whose own loader checks its keys (or whose keys are names)

_RAFT = Unbuilt("Raft metadata replication: a cluster shares etcd instead "
                "(meta_store.etcd_endpoints, docs/cluster.md)")
_WAL_FILE_NAME = Unbuilt("a single WAL file name; segments are named by offset")
_FLUSH_BYTES = Unbuilt("flush by buffered bytes; syncs follow storage.wal.durability")

#: grpc.* keys for the limits against hostile clients; each is a positive integer and becomes
#: the TransportConfig field of the same name (config.py loads them in one loop).
GRPC_LIMIT_KEYS = ("max_connection_buffered_bytes", "max_header_list_size",
                   "max_settings_per_second", "max_resets_per_second", "handshake_timeout_ms",
                   "idle_timeout_ms", "max_connections")

_FILE_SYNC = {"interval_ms": KEY, "max_batch_bytes": _FLUSH_BYTES}
_ROTATION = {"max_bytes": KEY, "max_hours": KEY}
_RETENTION = {"time_minutes": KEY, "size_mb": KEY, "check_interval_minutes": KEY,
              "delete_unconsumed": KEY}

SCHEMA = {
    "cluster_name": KEY,
    "broker": {
        "host": KEY,
        "ports": {"client": KEY, "admin": KEY, "raft": _RAFT, "prometheus": KEY},
        "advertised_listeners": {"broker_url": KEY, "connect_url": KEY},
    },
    # etcd_endpoints, lease_ttl_seconds, etcd_tls and etcd_auth are ours: cluster mode on etcd.
    "meta_store": {"data_dir": KEY, "seed_nodes": _RAFT, "etcd_endpoints": KEY,
                   "lease_ttl_seconds": KEY,
                   "etcd_tls": {"ca_file": KEY, "cert_file": KEY, "key_file": KEY},
                   "etcd_auth": {"user": KEY, "password": KEY}},
    "bootstrap_namespaces": KEY,
    "auto_create_topics": KEY,
    "admin_tls": KEY,
    "auth": {
        "mode": KEY,
        # require_client_cert is ours (mTLS; docs/security.md).
        "tls": {"cert_file": KEY, "key_file": KEY, "ca_file": KEY, "require_client_cert": KEY},
        # public_key_file and leeway_seconds are ours (danube/security/tokens.py).
        "jwt": {"secret_key": KEY, "issuer": KEY, "expiration_time": KEY,
                "public_key_file": KEY, "leeway_seconds": KEY},
        "super_admins": KEY,
    },
    "load_manager": {
        "assignment_strategy": KEY,
        "load_report_interval_seconds": KEY,
        "rebalancing": {name: KEY for name in (
            "enabled", "aggressiveness", "check_interval_seconds", "max_moves_per_hour",
            "cooldown_seconds", "min_brokers_for_rebalance", "min_topic_age_seconds",
            "blacklist_topics")},
    },
    "storage": {
        "mode": KEY,
        "local_wal_root": KEY,
        "root": KEY,            # alias: local_wal_root (local), the durable root (shared_fs)
        "cache_root": KEY,      # alias of local_wal_root
        "metadata_prefix": KEY,
        "metadata_root": KEY,   # alias of metadata_prefix
        "failover": KEY,        # ours: how acknowledged messages outlive their owner
        "local_retention": _RETENTION,
        "wal": {
            "dir": KEY,         # alias of local_wal_root
            "file_name": _WAL_FILE_NAME,
            "rotation": _ROTATION,
            "advanced": {"cache_capacity": KEY, "file_sync": _FILE_SYNC,
                         "rotation": _ROTATION},
            "cache_capacity": KEY,
            "file_sync": _FILE_SYNC,
            "retention": _RETENTION,
            "durability": KEY,          # ours
            "topic_durability": OPAQUE,  # ours: topic name -> mode
            "journal": {"enabled": KEY, "file_mb": KEY, "max_open_segments": KEY},     # ours: danube/storage/journal
        },
        "durable": OPAQUE,          # storage/durable/config.py checks it
        "object_store": OPAQUE,     # upstream's older name of durable
        # danube/config_writebuffer.py checks the values; max_pending_bytes is ours.
        "write_buffer": {name: KEY for name in (
            "backend", "endpoints", "wait_replicas", "wait_timeout_ms", "on_wait_timeout",
            "max_cached_closed_segments", "max_pending_bytes")},
    },
    "dispatch": {
        "max_unacked_messages": KEY,
        "consumer_stream_grace_ms": KEY,   # ours
        "failure_policy": OPAQUE,          # ours; FailurePolicy.from_config checks it
    },
    "topics": {                            # ours: idle topics unloaded, loaded on use
        "idle_unload_seconds": KEY,
        "max_idle_loaded": KEY,
    },
    "policies": {name: KEY for name in (
        "max_producers_per_topic", "max_subscriptions_per_topic", "max_consumers_per_topic",
        "max_consumers_per_subscription", "max_publish_rate",
        "max_subscription_dispatch_rate", "max_message_size")},
    "grpc": {name: KEY for name in (                                   # ours
        "max_message_size", "max_concurrent_streams", "stream_idle_timeout_ms",
        *GRPC_LIMIT_KEYS)},
}


def suggest(key: str, siblings, *, elsewhere=()) -> str:
    """' (did you mean X?)' for the closest known spelling, or ''."""
    import difflib      # only for a misspelt key

    close = difflib.get_close_matches(key, list(siblings), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    if elsewhere:
        return f" (did you mean {elsewhere[0]!r}?)"
    return ""


def _paths_of(leaf_name, schema=SCHEMA, prefix=""):
    for name, node in schema.items():
        path = f"{prefix}{name}"
        if name == leaf_name:
            yield path
        if isinstance(node, Unbuilt):
            node = node.keys
        if isinstance(node, dict):
            yield from _paths_of(leaf_name, node, path + ".")


def check_keys(tree: dict) -> list[str]:
    """Raise ValueError naming the first unknown key (with a suggestion); return the
    dotted paths of keys whose feature this build does not have, in file order."""
    unbuilt: list[str] = []

    def walk(node, schema, prefix):
        for key, value in node.items():
            path = f"{prefix}{key}"
            if key not in schema:
                raise ValueError(f"{path}: unknown key"
                                 + suggest(str(key), schema,
                                           elsewhere=list(_paths_of(str(key)))))
            spec = schema[key]
            if isinstance(spec, Unbuilt):
                unbuilt.append(path)
                spec = spec.keys
            if isinstance(spec, dict):
                if value is None:
                    continue
                if not isinstance(value, dict):
                    raise ValueError(f"{path}: expected a mapping, got {value!r}")
                walk(value, spec, path + ".")

    walk(tree, SCHEMA, "")
    return unbuilt


def unbuilt_warning(paths: list[str]) -> str | None:
    """One line naming the ignored keys, grouped by the feature they belong to."""
    if not paths:
        return None
    by_feature: dict[str, list[str]] = {}
    for path in paths:
        by_feature.setdefault(_feature_of(path), []).append(path)
    parts = [f"{', '.join(keys)} ({feature})" for feature, keys in by_feature.items()]
    return "config keys for features this build does not have are ignored: " + "; ".join(parts)


def _feature_of(path: str) -> str:
    if path.startswith("--"):       # upstream's Raft flags: --raft-addr, --seed-nodes, --join
        return _RAFT.feature
    node = SCHEMA
    for part in path.split("."):
        node = node[part]
        if isinstance(node, Unbuilt):
            return node.feature
        if not isinstance(node, dict):
            break
    raise KeyError(path)
