"""The edge's configuration: upstream's edge.yaml keys (danube-edge/src/config.rs) with their
defaults, plus ours for the limits against hostile MQTT clients (mqtt.limits) and for MQTT
credentials (mqtt.auth). Every value is checked at load; a bad one stops the start with the
key named."""

import dataclasses
import re

import yaml

from danube.config_errors import ConfigError

_TOPIC = re.compile(r"^/[\w-]+/[\w-]+$")


@dataclasses.dataclass
class TopicMapping:
    mqtt_pattern: str
    danube_topic: str
    schema_subject: str | None = None
    validation_policy: str | None = None
    extract_attributes: dict = dataclasses.field(default_factory=dict)

    @property
    def enforce(self):
        """Upstream validates payloads only under ``validation_policy: enforce``."""
        return (self.validation_policy or "").lower() == "enforce"


@dataclasses.dataclass
class Limits:
    """Ours (mqtt.limits): bounds on what MQTT clients may hold of the edge."""
    max_connections_per_ip: int = 256
    max_topic_length: int = 1024
    max_inflight: int = 1024              # QoS 1/2 messages not acked yet, per connection
    connect_timeout_ms: int = 10_000      # from accept to CONNECT
    max_client_id_length: int = 256


@dataclasses.dataclass
class EdgeConfig:
    edge_name: str
    cluster_url: str
    token: str = ""
    heartbeat_interval_ms: int = 30_000
    replicator_batch_size: int = 100
    replicator_batch_timeout_ms: int = 1000
    listener: str = "0.0.0.0:1883"
    topic_mappings: list = dataclasses.field(default_factory=list)
    ingestion_batch_size: int = 100
    ingestion_batch_timeout_ms: int = 500
    max_payload_size: int = 262_144
    max_connections: int = 10_000
    limits: Limits = dataclasses.field(default_factory=Limits)
    users: dict = dataclasses.field(default_factory=dict)    # mqtt.auth.users: name -> password
    wal_segment_max_bytes: int = 64 << 20    # ours: wal.segment_max_bytes

    @property
    def listener_host_port(self):
        host, _, port = self.listener.rpartition(":")
        return host or "0.0.0.0", int(port)

    def danube_topics(self):
        """The mapped topics, each once, in mapping order."""
        seen = {}
        for m in self.topic_mappings:
            seen.setdefault(m.danube_topic, m)
        return list(seen.values())


def _section(doc, key, required=False):
    value = doc.get(key)
    if value is None:
        if required:
            raise ConfigError(f"edge config: {key} is required")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"edge config: {key} must be a mapping")
    return value


def _int(section, key, path, default, minimum=1):
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"edge config: {path}.{key} must be an integer >= {minimum}, "
                          f"got {value!r}")
    return value


def _str(section, key, path, default=None, required=False):
    value = section.get(key, default)
    if value is None and required:
        raise ConfigError(f"edge config: {path}.{key} is required")
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"edge config: {path}.{key} must be a string, got {value!r}")
    return value


def _check_pattern(pattern, path):
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ConfigError(f"edge config: {path}: '#' must be a whole last level, got "
                              f"{pattern!r}")
        if "+" in level and level != "+":
            raise ConfigError(f"edge config: {path}: '+' must be a whole level, got {pattern!r}")


def parse(text):
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"edge config is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError("edge config must be a mapping with an edge: section")
    edge = _section(doc, "edge", required=True)
    name = _str(edge, "edge_name", "edge", required=True)
    if not re.fullmatch(r"[\w-]+", name):
        raise ConfigError(f"edge config: edge.edge_name must use only letters, digits, '_' or "
                          f"'-' (it is the namespace of the edge's topics), got {name!r}")
    cfg = EdgeConfig(edge_name=name, cluster_url=_str(edge, "cluster_url", "edge",
                                                      required=True))
    cfg.token = _str(edge, "token", "edge", "") or ""
    cfg.heartbeat_interval_ms = _int(edge, "heartbeat_interval_ms", "edge", 30_000)
    rep = _section(doc, "replicator")
    cfg.replicator_batch_size = _int(rep, "batch_size", "replicator", 100)
    cfg.replicator_batch_timeout_ms = _int(rep, "batch_timeout_ms", "replicator", 1000)
    mqtt = _section(doc, "mqtt")
    cfg.listener = _str(mqtt, "listener", "mqtt", "0.0.0.0:1883")
    try:
        cfg.listener_host_port
    except ValueError:
        raise ConfigError(f"edge config: mqtt.listener must be HOST:PORT, got "
                          f"{cfg.listener!r}") from None
    ing = _section(mqtt, "ingestion")
    cfg.ingestion_batch_size = _int(ing, "batch_size", "mqtt.ingestion", 100)
    cfg.ingestion_batch_timeout_ms = _int(ing, "batch_timeout_ms", "mqtt.ingestion", 500)
    cfg.max_payload_size = _int(mqtt, "max_payload_size", "mqtt", 262_144, minimum=64)
    cfg.max_connections = _int(mqtt, "max_connections", "mqtt", 10_000)
    lim = _section(mqtt, "limits")
    cfg.limits = Limits(**{f.name: _int(lim, f.name, "mqtt.limits", f.default)
                           for f in dataclasses.fields(Limits)})
    unknown = set(lim) - {f.name for f in dataclasses.fields(Limits)}
    if unknown:
        raise ConfigError(f"edge config: unknown key(s) in mqtt.limits: "
                          f"{', '.join(sorted(unknown))}")
    users = _section(_section(mqtt, "auth"), "users")
    for user, password in users.items():
        if not isinstance(user, str) or not isinstance(password, str):
            raise ConfigError("edge config: mqtt.auth.users maps user names to passwords "
                              "(strings)")
    cfg.users = dict(users)
    wal = _section(doc, "wal")
    cfg.wal_segment_max_bytes = _int(wal, "segment_max_bytes", "wal", 64 << 20, minimum=4096)
    mappings = mqtt.get("topic_mappings") or []
    if not isinstance(mappings, list):
        raise ConfigError("edge config: mqtt.topic_mappings must be a list")
    prefix = f"/{name}/"
    for i, m in enumerate(mappings):
        path = f"mqtt.topic_mappings[{i}]"
        if not isinstance(m, dict):
            raise ConfigError(f"edge config: {path} must be a mapping")
        pattern = _str(m, "mqtt_pattern", path, required=True)
        topic = _str(m, "danube_topic", path, required=True)
        _check_pattern(pattern, f"{path}.mqtt_pattern")
        if not _TOPIC.match(topic):
            raise ConfigError(f"edge config: {path}.danube_topic must be /namespace/topic, got "
                              f"{topic!r}")
        if not topic.startswith(prefix):
            # Upstream skips such a mapping with a warning; a typo there loses messages
            # silently, so ours refuses to start.
            raise ConfigError(f"edge config: {path}.danube_topic {topic!r} must be under the "
                              f"edge's namespace {prefix}")
        attrs = m.get("extract_attributes") or {}
        if not isinstance(attrs, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"\$[1-9]\d*", v)
                for k, v in attrs.items()):
            raise ConfigError(f"edge config: {path}.extract_attributes maps attribute names to "
                              f"captures $1, $2, ...")
        cfg.topic_mappings.append(TopicMapping(
            pattern, topic, _str(m, "schema_subject", path),
            _str(m, "validation_policy", path), dict(attrs)))
    return cfg


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"failed to read edge config '{path}': {exc}") from None
    return parse(text)
