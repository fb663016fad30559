"""The cluster's own sections of the broker YAML: ``load_manager.rebalancing`` (upstream's
keys and defaults) and the connection to etcd (``meta_store.etcd_tls``, ours).

A module of its own so that ``config.py`` stays a list of fields and the checks for each
section live next to the section's defaults."""

from __future__ import annotations

import dataclasses
import os

from danube.config_errors import ConfigError

#: Upstream's aggressiveness levels and the coefficient of variation at which each acts.
CV_THRESHOLDS = {"conservative": 0.40, "balanced": 0.30, "aggressive": 0.20}


@dataclasses.dataclass
class RebalancingConfig:
    """``load_manager.rebalancing``; the defaults are upstream's ``RebalancingConfig``."""
    enabled: bool = False
    aggressiveness: str = "balanced"
    check_interval_seconds: float = 300.0
    max_moves_per_hour: int = 10
    cooldown_seconds: float = 60.0
    min_brokers_for_rebalance: int = 2
    min_topic_age_seconds: float = 300.0
    blacklist_topics: tuple = ()

    @property
    def cv_threshold(self) -> float:
        return CV_THRESHOLDS[self.aggressiveness]


@dataclasses.dataclass
class EtcdTLS:
    """``meta_store.etcd_tls``: how to reach etcd over https. ``ca_file`` verifies etcd's
    certificate (None: the system's CAs); ``cert_file`` and ``key_file`` are this broker's
    client certificate, for an etcd started with ``--client-cert-auth``."""
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def _section(tree, dotted):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return None
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(f"{dotted}: expected a mapping, got {node!r}")
    return node


def _seconds(section, where, key, default, *, positive=False):
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
            (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ConfigError(f"{where}.{key}: expected {kind} number of seconds, got {value!r}")
    return float(value)


def _count(section, where, key, default, minimum):
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}.{key}: expected an integer of at least {minimum}, got "
                          f"{value!r}")
    return value


def load_rebalancing(tree: dict) -> RebalancingConfig:
    where = "load_manager.rebalancing"
    section = _section(tree, where)
    defaults = RebalancingConfig()
    if section is None:
        return defaults
    enabled = section.get("enabled", defaults.enabled)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled: expected true or false, got {enabled!r}")
    aggressiveness = section.get("aggressiveness", defaults.aggressiveness)
    if aggressiveness not in CV_THRESHOLDS:
        raise ConfigError(f"{where}.aggressiveness: expected conservative, balanced or "
                          f"aggressive, got {aggressiveness!r}")
    blacklist = section.get("blacklist_topics") or []
    if not isinstance(blacklist, list) or not all(
            isinstance(p, str) and p.startswith("/") for p in blacklist):
        raise ConfigError(f"{where}.blacklist_topics: expected a list of topic names or "
                          f"'/namespace/*' patterns, got {blacklist!r}")
    return RebalancingConfig(
        enabled=enabled, aggressiveness=aggressiveness,
        check_interval_seconds=_seconds(section, where, "check_interval_seconds",
                                        defaults.check_interval_seconds, positive=True),
        max_moves_per_hour=_count(section, where, "max_moves_per_hour",
                                  defaults.max_moves_per_hour, 0),
        cooldown_seconds=_seconds(section, where, "cooldown_seconds", defaults.cooldown_seconds),
        min_brokers_for_rebalance=_count(section, where, "min_brokers_for_rebalance",
                                         defaults.min_brokers_for_rebalance, 1),
        min_topic_age_seconds=_seconds(section, where, "min_topic_age_seconds",
                                       defaults.min_topic_age_seconds),
        blacklist_topics=tuple(blacklist))


def load_etcd_tls(tree: dict) -> EtcdTLS | None:
    where = "meta_store.etcd_tls"
    section = _section(tree, where)
    if section is None:
        return None
    for key, value in section.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}.{key}: expected a file path, got {value!r}")
    return EtcdTLS(ca_file=section.get("ca_file"), cert_file=section.get("cert_file"),
                   key_file=section.get("key_file"))


def check_etcd_tls(endpoints: list, tls: EtcdTLS | None) -> None:
    """One scheme for all endpoints, https with ``etcd_tls``; the files exist and a client
    certificate comes with its key."""
    for endpoint in endpoints:
        scheme = endpoint.split("://", 1)[0] if "://" in endpoint else None
        if scheme not in (None, "http", "https"):
            raise ConfigError(f"meta_store.etcd_endpoints: {endpoint!r}: expected http:// or "
                              "https://")
    schemes = {e.split("://", 1)[0] for e in endpoints if "://" in e}
    if len(schemes) > 1:
        raise ConfigError("meta_store.etcd_endpoints: mix http:// and https://")
    if tls is None:
        return
    if schemes == {"http"}:
        raise ConfigError("meta_store.etcd_tls is set but meta_store.etcd_endpoints are "
                          "http://: use https:// (or no scheme)")
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError("meta_store.etcd_tls: cert_file and key_file go together (a client "
                          "certificate and its key)")
    for key in ("ca_file", "cert_file", "key_file"):
        path = getattr(tls, key)
        if path and not os.path.isfile(path):
            raise ConfigError(f"meta_store.etcd_tls.{key}: no such file: {path}")


def load_etcd_auth(tree: dict) -> tuple[str, str] | None:
    """``meta_store.etcd_auth: {user, password}``: (user, password) for an etcd with
    authentication enabled."""
    where = "meta_store.etcd_auth"
    section = _section(tree, where)
    if section is None:
        return None
    user, password = section.get("user"), section.get("password")
    if not isinstance(user, str) or not user:
        raise ConfigError(f"{where}.user: expected an etcd user name, got {user!r}")
    if not isinstance(password, str):
        raise ConfigError(f"{where}.password: expected the user's password (a string)")
    return user, password
