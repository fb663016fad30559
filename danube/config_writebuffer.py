"""``storage.write_buffer``: upstream's Valkey/Redis write buffer (docs/cluster.md).

Every reliable append is also written to a Valkey or Redis stream, and replicated there
(``WAIT wait_replicas``) before the producer's ack, so a broker whose disk is lost loses
nothing acknowledged: the next owner of a topic rebuilds its log from the durable tier and
the buffer's tail. The keys are upstream's; ``danube/storage/writebuffer/`` is the buffer.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

from danube.config_errors import ConfigError

BACKENDS = ("valkey", "redis")
POLICIES = ("fail", "ack")
_SCHEMES = ("redis://", "rediss://", "valkey://", "valkeys://")


@dataclasses.dataclass(frozen=True)
class WriteBufferConfig:
    """Upstream's keys and defaults (danube-persistent-storage/src/valkey/config.rs)."""
    backend: str = "valkey"
    endpoints: tuple = ("redis://127.0.0.1:6379",)
    wait_replicas: int = 1
    wait_timeout_ms: int = 100
    on_wait_timeout: str = "fail"
    max_cached_closed_segments: int = 5
    #: Bytes of appends waiting for the buffer per topic (ours): past it a publish is refused
    #: before it is stored (UNAVAILABLE), so a buffer that is down cannot fill the memory.
    max_pending_bytes: int = 64 * 1024 * 1024


def parse_write_buffer(section, where: str = "storage.write_buffer") -> WriteBufferConfig:
    """The section's values, each checked, with a message naming the key."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a mapping (backend, endpoints, wait_replicas, "
                          f"wait_timeout_ms, on_wait_timeout, max_cached_closed_segments)")
    defaults = WriteBufferConfig()
    backend = str(section.get("backend", defaults.backend)).lower()
    if backend not in BACKENDS:
        raise ConfigError(f"{where}.backend: expected valkey or redis, got {backend!r}")
    endpoints = section.get("endpoints", list(defaults.endpoints))
    if isinstance(endpoints, str):
        endpoints = [endpoints]
    if not isinstance(endpoints, list) or not endpoints \
            or not all(isinstance(e, str) for e in endpoints):
        raise ConfigError(f"{where}.endpoints: expected a list of URLs like "
                          f"redis://127.0.0.1:6379")
    for endpoint in endpoints:
        if not endpoint.startswith(_SCHEMES):
            raise ConfigError(f"{where}.endpoints: {endpoint!r} is not a redis:// or "
                              f"rediss:// URL")
    # Several endpoints are a Redis Cluster's nodes (as upstream): the buffer finds each
    # topic's primary from the cluster's slots.

    def integer(key, minimum, maximum):
        value = section.get(key, getattr(defaults, key))
        if isinstance(value, bool) or not isinstance(value, int) \
                or not minimum <= value <= maximum:
            raise ConfigError(f"{where}.{key}: expected an integer from {minimum} to "
                              f"{maximum}, got {value!r}")
        return value

    policy = str(section.get("on_wait_timeout", defaults.on_wait_timeout)).lower()
    if policy not in POLICIES:
        # Upstream reads anything but "ack" as fail; a typo here would silently change
        # what an ack means, so it is an error.
        raise ConfigError(f"{where}.on_wait_timeout: expected fail or ack, got {policy!r}")
    return WriteBufferConfig(
        backend=backend, endpoints=tuple(endpoints),
        wait_replicas=integer("wait_replicas", 0, 1000),
        wait_timeout_ms=integer("wait_timeout_ms", 0, 3_600_000),
        on_wait_timeout=policy,
        max_cached_closed_segments=integer("max_cached_closed_segments", 0, 1_000_000),
        max_pending_bytes=integer("max_pending_bytes", 1 << 20, 1 << 40))


def require_client(where: str = "storage.write_buffer") -> None:
    """ConfigError with the exact install command when the ``redis`` client is missing (an
    extra: a broker without a write buffer does not carry it)."""
    try:
        found = importlib.util.find_spec("redis") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"{where}: the write buffer needs the redis package (the Valkey/Redis client), "
            f"which is not installed: run {sys.executable} -m pip install 'redis>=5' (or, in "
            f"the source checkout, pip install '.[write-buffer]')")
