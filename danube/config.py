"""Broker configuration: one typed object, loaded from upstream's danube_broker.yml keys, with
command-line overrides applied on top. Nothing else in the broker reads files or environment
variables for settings."""

import dataclasses
import logging
import os

from danube import config_keys
from danube.config_cluster import (EtcdTLS, RebalancingConfig, check_etcd_tls, load_etcd_auth,
                                   load_etcd_tls, load_rebalancing)
from danube.config_durable import BACKENDS, parse_durable, require_sdk
from danube.config_writebuffer import parse_write_buffer, require_client
from danube.config_errors import ConfigError
from danube.failure_policy import FailurePolicy, InvalidFailurePolicy

log = logging.getLogger("danube.config")

# The transport cap when grpc.max_message_size is not set, unless policies.max_message_size
# plus ENVELOPE_ALLOWANCE is larger (a message the policy refuses must meet the policy check,
# INVALID_ARGUMENT, not the transport's RESOURCE_EXHAUSTED, which official clients retry).
DEFAULT_GRPC_MAX_MESSAGE_SIZE = 16 * 1024 * 1024


def parse_hostport(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    return host, int(port)


#: What a published message may carry around its payload (msg_id, producer name, attributes,
#: routing key...) on top of policies.max_message_size: the publish RPCs refuse a request
#: longer than the two together from its gRPC length prefix, before reading it (the exact
#: payload check runs on everything shorter), and the transport's cap must leave room for it.
ENVELOPE_ALLOWANCE = 64 * 1024
#: storage.failover's choices. The last acknowledges what is only on the owner's disk: its
#: name says what it risks.
LOSSY_FAILOVER = "lossy_local_wal"
FAILOVER_MODES = ("write_buffer", "uploaded", "shared_wal_root", LOSSY_FAILOVER)


@dataclasses.dataclass
class Policies:
    max_producers_per_topic: int = 0
    max_subscriptions_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_publish_rate: int = 0
    max_subscription_dispatch_rate: int = 0
    max_message_size: int = 10 * 1024 * 1024


@dataclasses.dataclass
class BrokerConfig:
    cluster_name: str = "standalone"
    mode: str = "standalone"
    host: str = "127.0.0.1"
    client_port: int = 6650
    admin_host: str = "127.0.0.1"
    admin_port: int = 50051
    prom_host: str | None = None
    prom_port: int | None = None
    broker_url: str | None = None
    connect_url: str | None = None
    data_dir: str = "./danube-data"
    bootstrap_namespaces: list = dataclasses.field(default_factory=lambda: ["default"])
    auto_create_topics: bool = True
    auth_mode: str = "none"
    jwt: dict | None = None                     # auth.jwt (danube/security/tokens.py)
    super_admins: list = dataclasses.field(default_factory=list)   # auth.super_admins
    # --insecure-allow-unauthenticated (ours): serve auth.mode tls without token checks.
    insecure_allow_unauthenticated: bool = False
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    # auth.tls.require_client_cert (ours): mTLS, client certificates checked against ca_file.
    tls_require_client_cert: bool = False
    admin_tls: bool = False
    policies: Policies = dataclasses.field(default_factory=Policies)
    max_unacked_messages: int = 10
    consumer_stream_grace_ms: int = 10000       # dispatch.consumer_stream_grace_ms (ours)
    # topics.* (ours): a topic nobody uses is unloaded from memory (its log closed, its
    # subscriptions and cursors kept in metadata) after idle_unload_seconds (0: never by
    # age), and beyond max_idle_loaded idle ones, least recently used first; loaded again
    # on first use. Bounds memory and descriptors whatever the number of topics.
    topic_idle_unload_seconds: float = 300.0
    topic_max_idle_loaded: int = 1000
    # Reliable topics (reference d.1 keys where upstream has them; durability is ours).
    wal_root: str | None = None                 # storage.local_wal_root (default data_dir/wal)
    # storage.wal.durability: always|interval|none, or uploaded (acknowledged once in the
    # durable tier; the WAL syncs as in always)
    wal_durability: str = "always"
    wal_durability_set: bool = False            # storage.wal.durability given in the file
    # storage.failover (ours; a cluster on etcd): how a reliable topic's acknowledged
    # messages outlive the loss of its owner, one of FAILOVER_MODES; None: derived in
    # validate() (docs/cluster.md, "Reliable topics: what the new owner continues from").
    failover: str | None = None
    wal_topic_durability: dict = dataclasses.field(default_factory=dict)
    wal_sync_interval_ms: int = 5000            # storage.wal.advanced.file_sync.interval_ms
    wal_segment_max_bytes: int = 64 * 1024 * 1024   # storage.wal.rotation.max_bytes
    wal_segment_max_hours: float | None = None  # storage.wal.rotation.max_hours
    wal_cache_capacity: int = 1024              # storage.wal.advanced.cache_capacity
    wal_journal: bool = True                    # storage.wal.journal.enabled (ours)
    wal_journal_max_open_segments: int = 1000   # storage.wal.journal.max_open_segments
    wal_journal_file_mb: int = 8               # storage.wal.journal.file_mb (ours)
    retention_time_minutes: int = 2880          # storage.local_retention.time_minutes
    retention_size_mb: int = 20480              # storage.local_retention.size_mb
    retention_check_interval_minutes: float = 5  # storage.local_retention.check_interval_minutes
    retention_delete_unconsumed: bool = False   # storage.local_retention.delete_unconsumed (ours)
    failure_policy: object = None               # dispatch.failure_policy (ours): defaults
    storage_mode: str = "local"                 # storage.mode: local|shared_fs|object_store
    metadata_prefix: str = "/danube"            # storage.metadata_prefix
    durable: object = None                      # storage.durable (DurableConfig), tiers only
    write_buffer: object = None                 # storage.write_buffer (WriteBufferConfig)
    # Transport cap on one gRPC message (our key, not upstream's); policies.max_message_size
    # must stay below it so oversize publishes get INVALID_ARGUMENT, not RESOURCE_EXHAUSTED.
    grpc_max_message_size: int = DEFAULT_GRPC_MAX_MESSAGE_SIZE
    grpc_max_message_size_set: bool = False     # given in the file; else derived (validate)
    grpc_max_concurrent_streams: int = 16384
    # A call whose request stalls (no request bytes) this long is failed and its stream
    # freed; 0 disables. Calls whose request is complete are never timed out.
    grpc_stream_idle_timeout_ms: int = 30000
    # Limits against hostile clients (issue 17), per connection unless said otherwise; see
    # TransportConfig for what each does. None: derived in validate().
    grpc_max_connection_buffered_bytes: int | None = None
    grpc_max_header_list_size: int = 65536
    grpc_max_settings_per_second: int = 50
    grpc_max_resets_per_second: int = 1000
    grpc_handshake_timeout_ms: int = 10_000
    grpc_idle_timeout_ms: int = 300_000
    grpc_max_connections: int | None = None     # per listener; None: 3/4 of the fd limit
    # Cluster mode on etcd (docs/cluster.md): meta_store.etcd_endpoints, its lease, and
    # upstream's load_manager keys.
    etcd_endpoints: list = dataclasses.field(default_factory=list)
    lease_ttl_seconds: float = 10.0
    etcd_tls: EtcdTLS | None = None             # meta_store.etcd_tls (ours): https to etcd
    etcd_auth: tuple | None = None              # meta_store.etcd_auth (ours): user, password
    assignment_strategy: str = "fair"
    load_report_interval_seconds: float = 30.0
    rebalancing: RebalancingConfig = dataclasses.field(default_factory=RebalancingConfig)
    raw: dict = dataclasses.field(default_factory=dict)
    unbuilt_keys: list = dataclasses.field(default_factory=list)   # see config_keys

    @property
    def client_addr(self):
        return f"{self.host}:{self.client_port}"

    @property
    def advertised_broker_url(self):
        scheme = "https" if self.auth_mode == "tls" else "http"
        return self.broker_url or f"{scheme}://{self.host}:{self.client_port}"

    @property
    def admin_scheme(self):
        """What the admin port speaks. Upstream registers https whenever auth.mode is tls,
        even with admin_tls off (the port then serves plain text); ours says what it is."""
        return "https" if self.auth_mode == "tls" and self.admin_tls else "http"

    @property
    def advertised_connect_url(self):
        return self.connect_url or self.advertised_broker_url

    def validate(self):
        if self.mode not in ("standalone", "cluster"):
            raise ConfigError(f"--mode: expected standalone or cluster, got {self.mode!r}")
        if self.auth_mode not in ("none", "tls"):
            raise ConfigError(f"auth.mode: expected none or tls, got {self.auth_mode!r}")
        self._validate_cluster()
        self._validate_failover()
        if self.auth_mode == "tls" and not (self.tls_cert_file and self.tls_key_file):
            raise ConfigError("auth.mode tls needs auth.tls.cert_file and auth.tls.key_file")
        if self.tls_require_client_cert and not self.tls_ca_file:
            raise ConfigError("auth.tls.require_client_cert needs auth.tls.ca_file, the CA "
                              "client certificates are checked against")
        if self.auth_mode == "tls" and not self.insecure_allow_unauthenticated:
            # Upstream's tls mode means a JWT on every call: with no key to check one
            # against, fail closed rather than serve unauthenticated calls.
            jwt = self.jwt or {}
            if not (jwt.get("secret_key") or jwt.get("public_key_file")):
                raise ConfigError(
                    "auth.mode tls requires a JWT on every call, but neither "
                    "auth.jwt.secret_key nor auth.jwt.public_key_file is set, so no token "
                    "could be checked; refusing to start. Set one of them, use auth.mode "
                    "none, or pass --insecure-allow-unauthenticated to serve TLS without "
                    "authentication")
        if self.policies.max_message_size < 1:
            raise ConfigError("policies.max_message_size must be at least 1 byte")
        if not self.grpc_max_message_size_set:
            self.grpc_max_message_size = max(
                DEFAULT_GRPC_MAX_MESSAGE_SIZE,
                self.policies.max_message_size + ENVELOPE_ALLOWANCE)
        if self.policies.max_message_size > self.grpc_max_message_size - ENVELOPE_ALLOWANCE:
            raise ConfigError(
                f"policies.max_message_size ({self.policies.max_message_size}) must be at "
                f"least {ENVELOPE_ALLOWANCE} bytes below the gRPC transport limit "
                f"grpc.max_message_size ({self.grpc_max_message_size}); leave "
                f"grpc.max_message_size out to derive it")
        if self.grpc_stream_idle_timeout_ms < 0:
            raise ConfigError("grpc.stream_idle_timeout_ms must be 0 (off) or a positive "
                              "number of milliseconds")
        for key in GRPC_LIMIT_KEYS:
            value = getattr(self, f"grpc_{key}")
            if value is not None and value < 1:
                raise ConfigError(f"grpc.{key} must be a positive integer, got {value}")
        if self.grpc_max_header_list_size < 1024:
            raise ConfigError("grpc.max_header_list_size must be at least 1024 bytes")
        if self.grpc_max_connection_buffered_bytes is None:
            # Room for a few largest messages arriving at once on one connection.
            self.grpc_max_connection_buffered_bytes = max(64 * 1024 * 1024,
                                                          4 * self.grpc_max_message_size)
        elif self.grpc_max_connection_buffered_bytes < self.grpc_max_message_size:
            raise ConfigError(
                f"grpc.max_connection_buffered_bytes ({self.grpc_max_connection_buffered_bytes}) "
                f"must be at least grpc.max_message_size ({self.grpc_max_message_size}), or "
                f"no message that large could arrive")
        if not 1 <= self.max_unacked_messages <= 10000:
            raise ConfigError("dispatch.max_unacked_messages must be between 1 and 10000")
        if self.consumer_stream_grace_ms < 1:
            raise ConfigError("dispatch.consumer_stream_grace_ms must be at least 1")
        if self.topic_idle_unload_seconds < 0:
            raise ConfigError("topics.idle_unload_seconds must be 0 (never by age) or a "
                              "positive number of seconds")
        if self.topic_max_idle_loaded < 0:
            raise ConfigError("topics.max_idle_loaded must be 0 or more")
        for where, mode in [("storage.wal.durability", self.wal_durability),
                            *((f"storage.wal.topic_durability[{t}]", m)
                              for t, m in self.wal_topic_durability.items())]:
            if mode not in ("always", "interval", "none", "uploaded"):
                raise ConfigError(f"{where}: expected always, interval, none or uploaded, "
                                  f"got {mode!r}")
            if mode == "uploaded" and self.durable is None:
                # Acknowledged once in the durable tier: there must be one.
                raise ConfigError(f"{where}: uploaded acknowledges a message once it is in "
                                  f"the durable tier, which needs storage.mode object_store "
                                  f"or shared_fs")
        if self.wal_root is None:
            self.wal_root = os.path.join(self.data_dir, "wal")
        if self.failure_policy is None:
            self.failure_policy = FailurePolicy()
        return self

    def _validate_cluster(self):
        if self.etcd_endpoints and self.mode != "cluster":
            raise ConfigError("meta_store.etcd_endpoints (--etcd-endpoints) needs --mode cluster")
        for endpoint in self.etcd_endpoints:
            parse_hostport(endpoint.split("://", 1)[-1], "meta_store.etcd_endpoints")
        check_etcd_tls(self.etcd_endpoints, self.etcd_tls)
        if not 1 <= self.lease_ttl_seconds <= 3600:
            raise ConfigError("meta_store.lease_ttl_seconds: expected 1 to 3600 seconds, got "
                              f"{self.lease_ttl_seconds!r}")
        if self.assignment_strategy not in ("fair", "balanced", "weighted_load"):
            raise ConfigError("load_manager.assignment_strategy: expected fair, balanced or "
                              f"weighted_load, got {self.assignment_strategy!r}")
        if not 0 < self.load_report_interval_seconds <= 86400:
            raise ConfigError("load_manager.load_report_interval_seconds: expected a positive "
                              f"number of seconds, got {self.load_report_interval_seconds!r}")

    def _validate_failover(self):
        """Every cluster keeps what it acknowledged across the loss of any one broker,
        unless the operator names the risk: storage.failover, or a default that is safe."""
        if self.failover is not None and self.failover not in FAILOVER_MODES:
            raise ConfigError(f"storage.failover: expected {', '.join(FAILOVER_MODES)}, got "
                              f"{self.failover!r}")
        if self.mode != "cluster" or not self.etcd_endpoints:
            return              # one broker: no other owner to fail over to
        chosen = self.failover
        if chosen is None:
            if self.write_buffer is not None:
                chosen = "write_buffer"
            elif self.durable is not None and (not self.wal_durability_set
                                               or self.wal_durability == "uploaded"):
                chosen = "uploaded"
            else:
                why = (f"storage.wal.durability {self.wal_durability} acknowledges a message "
                       f"before it leaves its owner's disk" if self.durable is not None else
                       "storage.mode local keeps a topic's messages on its owner's disk only")
                raise ConfigError(
                    f"cluster mode: {why}, so the loss of that broker would lose acknowledged "
                    f"messages. Choose storage.failover: write_buffer (with "
                    f"storage.write_buffer), uploaded (acknowledge once in the durable tier), "
                    f"shared_wal_root (storage.local_wal_root on storage every broker mounts), "
                    f"or {LOSSY_FAILOVER} to accept that loss (docs/cluster.md)")
        if chosen == "write_buffer" and self.write_buffer is None:
            raise ConfigError("storage.failover: write_buffer needs a storage.write_buffer "
                              "section (Valkey/Redis endpoints)")
        if chosen == "uploaded":
            if self.durable is None:
                raise ConfigError("storage.failover: uploaded acknowledges a message once it "
                                  "is in the durable tier, which needs storage.mode "
                                  "object_store or shared_fs")
            if self.wal_durability_set and self.wal_durability != "uploaded":
                raise ConfigError(f"storage.wal.durability: {self.wal_durability} contradicts "
                                  f"storage.failover: uploaded (leave the durability out, or "
                                  f"choose another storage.failover)")
            self.wal_durability = "uploaded"
        self.failover = chosen

    @property
    def failover_is_lossy(self) -> bool:
        return self.failover == LOSSY_FAILOVER

    def durability_for(self, topic):
        return self.wal_topic_durability.get(topic, self.wal_durability)


def _get(tree, dotted, default=None):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


GRPC_LIMIT_KEYS = config_keys.GRPC_LIMIT_KEYS


def _int(tree, dotted, default):
    value = _get(tree, dotted, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{dotted}: expected an integer, got {value!r}")
    return value


def load_config(path: str | None) -> BrokerConfig:
    """Read a danube_broker.yml. Missing keys keep their defaults."""
    cfg = BrokerConfig()
    if path is None:
        return cfg
    import yaml     # here: a broker without a config file does not need its ~20 ms import

    try:
        with open(path, encoding="utf-8") as f:
            tree = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigError(f"--config-file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config-file {path}: invalid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"--config-file {path}: expected a mapping at the top level")
    try:
        cfg.unbuilt_keys = config_keys.check_keys(tree)
    except ValueError as exc:
        raise ConfigError(f"--config-file {path}: {exc}") from None
    tree = _resolve_aliases(tree)
    cfg.raw = tree
    cfg.cluster_name = str(tree.get("cluster_name", cfg.cluster_name))
    cfg.host = str(_get(tree, "broker.host", cfg.host))
    cfg.admin_host = cfg.host
    cfg.client_port = _int(tree, "broker.ports.client", cfg.client_port)
    cfg.admin_port = _int(tree, "broker.ports.admin", cfg.admin_port)
    prom = _int(tree, "broker.ports.prometheus", None)
    if prom is not None:
        cfg.prom_host, cfg.prom_port = cfg.host, prom
    cfg.broker_url = _get(tree, "broker.advertised_listeners.broker_url")
    cfg.connect_url = _get(tree, "broker.advertised_listeners.connect_url")
    cfg.data_dir = str(_get(tree, "meta_store.data_dir", cfg.data_dir))
    namespaces = tree.get("bootstrap_namespaces")
    if namespaces is not None:
        if not isinstance(namespaces, list):
            raise ConfigError("bootstrap_namespaces: expected a list")
        cfg.bootstrap_namespaces = [str(n) for n in namespaces]
    cfg.auto_create_topics = bool(tree.get("auto_create_topics", cfg.auto_create_topics))
    cfg.admin_tls = bool(tree.get("admin_tls", cfg.admin_tls))
    cfg.auth_mode = str(_get(tree, "auth.mode", cfg.auth_mode))
    cfg.tls_cert_file = _get(tree, "auth.tls.cert_file")
    cfg.tls_key_file = _get(tree, "auth.tls.key_file")
    cfg.tls_ca_file = _get(tree, "auth.tls.ca_file")
    mtls = _get(tree, "auth.tls.require_client_cert")
    if mtls is not None and not isinstance(mtls, bool):
        raise ConfigError(f"auth.tls.require_client_cert: expected true or false, got {mtls!r}")
    cfg.tls_require_client_cert = bool(mtls)
    jwt = _get(tree, "auth.jwt")
    if jwt is not None and not isinstance(jwt, dict):
        raise ConfigError("auth.jwt: expected a mapping (secret_key, issuer, expiration_time, "
                          "public_key_file, leeway_seconds)")
    cfg.jwt = jwt
    admins = _get(tree, "auth.super_admins") or []
    if not isinstance(admins, list):
        raise ConfigError("auth.super_admins: expected a list of principal names")
    cfg.super_admins = [str(a) for a in admins]
    cfg.max_unacked_messages = _int(tree, "dispatch.max_unacked_messages",
                                    cfg.max_unacked_messages)
    cfg.consumer_stream_grace_ms = _int(tree, "dispatch.consumer_stream_grace_ms",
                                        cfg.consumer_stream_grace_ms)
    cfg.topic_idle_unload_seconds = _number(tree, "topics.idle_unload_seconds",
                                            cfg.topic_idle_unload_seconds)
    cfg.topic_max_idle_loaded = _int(tree, "topics.max_idle_loaded", cfg.topic_max_idle_loaded)
    for field in dataclasses.fields(Policies):
        value = _int(tree, f"policies.{field.name}", getattr(cfg.policies, field.name))
        setattr(cfg.policies, field.name, value)
    _load_storage(cfg, tree)
    _load_cluster(cfg, tree)
    cap = _int(tree, "grpc.max_message_size", None)
    if cap is not None:
        cfg.grpc_max_message_size, cfg.grpc_max_message_size_set = cap, True
    cfg.grpc_max_concurrent_streams = _int(tree, "grpc.max_concurrent_streams",
                                           cfg.grpc_max_concurrent_streams)
    cfg.grpc_stream_idle_timeout_ms = _int(tree, "grpc.stream_idle_timeout_ms",
                                           cfg.grpc_stream_idle_timeout_ms)
    for key in GRPC_LIMIT_KEYS:
        setattr(cfg, f"grpc_{key}", _int(tree, f"grpc.{key}", getattr(cfg, f"grpc_{key}")))
    return cfg


def _number(tree, dotted, default):
    value = _get(tree, dotted, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{dotted}: expected a number, got {value!r}")
    return float(value)


def _load_cluster(cfg, tree):
    endpoints = _get(tree, "meta_store.etcd_endpoints")
    if endpoints is not None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not isinstance(endpoints, list) or not all(isinstance(e, str) for e in endpoints):
            raise ConfigError("meta_store.etcd_endpoints: expected a list of HOST:PORT")
        cfg.etcd_endpoints = endpoints
    cfg.lease_ttl_seconds = _number(tree, "meta_store.lease_ttl_seconds", cfg.lease_ttl_seconds)
    cfg.assignment_strategy = str(_get(tree, "load_manager.assignment_strategy",
                                       cfg.assignment_strategy))
    cfg.load_report_interval_seconds = _number(tree, "load_manager.load_report_interval_seconds",
                                               cfg.load_report_interval_seconds)
    cfg.rebalancing = load_rebalancing(tree)
    cfg.etcd_tls = load_etcd_tls(tree)
    cfg.etcd_auth = load_etcd_auth(tree)


def _resolve_aliases(tree):
    """The tree with upstream's older spellings moved to the current ones (the current one
    wins where both are given), so the rest of the loader reads one spelling."""
    storage = tree.get("storage")
    if not isinstance(storage, dict):
        return tree
    storage = dict(storage)
    mode = storage.get("mode", "local")
    wal = dict(storage.get("wal") or {})
    advanced = dict(wal.get("advanced") or {})

    def move(src, key, dst, new_key=None):
        if key in src:
            value = src.pop(key)
            dst.setdefault(new_key or key, value)

    if mode == "shared_fs" and "root" in storage:
        # shared_fs's legacy `root` is the shared directory, not the WAL's.
        durable = dict(storage.get("durable") or {})
        move(storage, "root", durable)
        storage["durable"] = durable
    move(storage, "root", storage, "local_wal_root")
    move(storage, "cache_root", storage, "local_wal_root")
    move(storage, "metadata_root", storage, "metadata_prefix")
    move(storage, "object_store", storage, "durable")
    move(wal, "dir", storage, "local_wal_root")
    move(wal, "retention", storage, "local_retention")
    move(wal, "cache_capacity", advanced)
    move(wal, "file_sync", advanced)
    if "rotation" in advanced:
        rotation = dict(wal.get("rotation") or {})
        for key, value in (advanced.pop("rotation") or {}).items():
            rotation.setdefault(key, value)
        wal["rotation"] = rotation
    if advanced:
        wal["advanced"] = advanced
    if wal:
        storage["wal"] = wal
    return {**tree, "storage": storage}


def _load_storage(cfg, tree):
    root = _get(tree, "storage.local_wal_root")
    if root is not None:
        cfg.wal_root = str(root)
    durability = _get(tree, "storage.wal.durability")
    if durability is not None:
        cfg.wal_durability = str(durability)
        cfg.wal_durability_set = True
    failover = _get(tree, "storage.failover")
    if failover is not None:
        cfg.failover = str(failover)
    per_topic = _get(tree, "storage.wal.topic_durability", {}) or {}
    if not isinstance(per_topic, dict):
        raise ConfigError("storage.wal.topic_durability: expected a mapping of topic -> mode")
    cfg.wal_topic_durability = {str(k): str(v) for k, v in per_topic.items()}
    cfg.wal_sync_interval_ms = _int(tree, "storage.wal.advanced.file_sync.interval_ms",
                                    cfg.wal_sync_interval_ms)
    cfg.wal_segment_max_bytes = _int(tree, "storage.wal.rotation.max_bytes",
                                     cfg.wal_segment_max_bytes)
    hours = _get(tree, "storage.wal.rotation.max_hours")
    if hours is not None:
        if not isinstance(hours, (int, float)) or hours <= 0:
            raise ConfigError("storage.wal.rotation.max_hours: expected a positive number")
        cfg.wal_segment_max_hours = float(hours)
    cfg.wal_cache_capacity = _int(tree, "storage.wal.advanced.cache_capacity",
                                  cfg.wal_cache_capacity)
    journal = _get(tree, "storage.wal.journal.enabled", True)
    if not isinstance(journal, bool):
        raise ConfigError("storage.wal.journal.enabled: expected true or false")
    cfg.wal_journal = journal
    cfg.wal_journal_file_mb = _int(tree, "storage.wal.journal.file_mb", cfg.wal_journal_file_mb)
    cfg.wal_journal_max_open_segments = _int(tree, "storage.wal.journal.max_open_segments",
                                             cfg.wal_journal_max_open_segments)
    if cfg.wal_journal_max_open_segments < 1:
        raise ConfigError("storage.wal.journal.max_open_segments: expected a positive "
                          "integer")
    if not 1 <= cfg.wal_journal_file_mb <= 4096:
        raise ConfigError(f"storage.wal.journal.file_mb: expected 1..4096 (MiB), got "
                          f"{cfg.wal_journal_file_mb}")
    cfg.retention_time_minutes = _int(tree, "storage.local_retention.time_minutes",
                                      cfg.retention_time_minutes)
    cfg.retention_size_mb = _int(tree, "storage.local_retention.size_mb", cfg.retention_size_mb)
    interval = _get(tree, "storage.local_retention.check_interval_minutes")
    if interval is not None:
        if not isinstance(interval, (int, float)) or interval <= 0:
            raise ConfigError("storage.local_retention.check_interval_minutes: expected a "
                              "positive number")
        cfg.retention_check_interval_minutes = float(interval)
    unconsumed = _get(tree, "storage.local_retention.delete_unconsumed", False)
    if not isinstance(unconsumed, bool):
        raise ConfigError("storage.local_retention.delete_unconsumed: expected true or false")
    cfg.retention_delete_unconsumed = unconsumed
    _load_tiers(cfg, tree)
    section = _get(tree, "storage.write_buffer")
    if section is not None:
        cfg.write_buffer = parse_write_buffer(section)
        require_client()
    try:
        cfg.failure_policy = FailurePolicy.from_config(_get(tree, "dispatch.failure_policy"))
    except (InvalidFailurePolicy, TypeError) as exc:
        raise ConfigError(f"dispatch.failure_policy: {exc}") from None


def _load_tiers(cfg, tree):
    """storage.mode and storage.durable. ``local`` keeps everything in the WAL (a durable
    section is then ignored); ``shared_fs`` exports to the directory ``durable.root``;
    ``object_store`` to the ``durable.backend`` (s3, gcs, azblob, and fs or memory)."""
    mode = _get(tree, "storage.mode", cfg.storage_mode)
    if mode not in ("local", "shared_fs", "object_store"):
        raise ConfigError(f"storage.mode: expected local, shared_fs or object_store, "
                          f"got {mode!r}")
    cfg.storage_mode = mode
    prefix = str(_get(tree, "storage.metadata_prefix", cfg.metadata_prefix))
    if not prefix.startswith("/") or prefix.endswith("/"):
        raise ConfigError(f"storage.metadata_prefix: expected a path like /danube, got "
                          f"{prefix!r}")
    cfg.metadata_prefix = prefix
    if mode == "local":
        cfg.durable = None
        return
    section = _get(tree, "storage.durable")
    if not isinstance(section, dict):
        raise ConfigError(f"storage.mode {mode} needs a storage.durable section")
    section = dict(section)
    if mode == "shared_fs":
        backend = section.setdefault("backend", "fs")
        if backend != "fs":
            raise ConfigError(f"storage.durable.backend: storage.mode shared_fs exports to a "
                              f"directory (backend fs), got {backend!r}")
    elif "backend" not in section and "://" not in str(section.get("root", "")):
        raise ConfigError("storage.durable.backend: required with storage.mode object_store "
                          f"({', '.join(BACKENDS[:-1])} or {BACKENDS[-1]})")
    cfg.durable = parse_durable(section, "storage.durable")
    require_sdk(cfg.durable.backend)


def apply_overrides(cfg: BrokerConfig, args) -> BrokerConfig:
    """Command-line flags win over the file (reference (g) flag semantics)."""
    if args.mode:
        cfg.mode = args.mode
    if args.broker_addr:
        cfg.host, cfg.client_port = parse_hostport(args.broker_addr, "--broker-addr")
    if args.admin_addr:
        cfg.admin_host, cfg.admin_port = parse_hostport(args.admin_addr, "--admin-addr")
    if args.prom_exporter:
        cfg.prom_host, cfg.prom_port = parse_hostport(args.prom_exporter, "--prom-exporter")
    if args.data_dir:
        cfg.data_dir = args.data_dir
    if getattr(args, "etcd_endpoints", None):
        cfg.etcd_endpoints = [e for e in args.etcd_endpoints.split(",") if e.strip()]
    for key in ("ca_file", "cert_file", "key_file"):
        value = getattr(args, f"etcd_{key}", None)
        if value:
            cfg.etcd_tls = cfg.etcd_tls or EtcdTLS()
            setattr(cfg.etcd_tls, key, value)
    if args.advertised_addr:
        parse_hostport(args.advertised_addr.split("://")[-1], "--advertised-addr")
        url = args.advertised_addr
        if "://" not in url:
            url = f"{'https' if cfg.auth_mode == 'tls' else 'http'}://{url}"
        cfg.broker_url = cfg.connect_url = url
    if getattr(args, "connect_url", None):
        url = args.connect_url
        # As upstream: a URL without a scheme takes the broker's (https under auth tls).
        scheme = "https" if cfg.auth_mode == "tls" else "http"
        cfg.connect_url = url if "://" in url else f"{scheme}://{url}"
    cfg.insecure_allow_unauthenticated = bool(
        getattr(args, "insecure_allow_unauthenticated", False))
    cfg.data_dir = os.path.abspath(cfg.data_dir)
    return cfg.validate()
