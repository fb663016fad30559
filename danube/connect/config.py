"""The core keys every connector shares, as upstream's danube-connect-core names them
(``danube_service_url``, ``connector_name``, ``[retry]``, ``[processing]``, ``[[schemas]]``),
plus ours: ``connector`` (which registered connector runs this file: upstream ships one
binary per connector), ``dead_letter_topic``, ``processing.metrics_host``,
``processing.log_format`` and ``processing.shutdown_timeout_ms``."""

from __future__ import annotations

import os
import tomllib
import types

from danube.connect.errors import ConfigError
from danube.connect.settings import Field, Table, Tables, one_of_names, parse, topic_name

CONFIG_PATH_ENV = "CONNECTOR_CONFIG_PATH"      # upstream's variable for the file


def _url(value):
    if not value.startswith(("http://", "https://")):
        return f"{value!r}: expected http://host:port or https://host:port"
    return None


def _optional_topic(value):
    return topic_name(value) if value else None


RETRY = {
    "max_retries": Field(int, 3, min=0, max=100),
    "retry_backoff_ms": Field(int, 1000, min=1),
    "max_backoff_ms": Field(int, 30000, min=1),
}

PROCESSING = {
    "batch_size": Field(int, 1000, min=1, max=100_000),
    "batch_timeout_ms": Field(int, 1000, min=1),
    "poll_interval_ms": Field(int, 100, min=1),
    "metrics_port": Field(int, 9090, min=0, max=65535, env="CONNECTOR_METRICS_PORT"),
    "metrics_host": Field(str, "0.0.0.0"),
    "log_level": Field(str, "info", env="LOG_LEVEL",
                       choices=("trace", "debug", "info", "warn", "warning", "error")),
    "log_format": Field(str, "json", choices=("json", "text")),
    "shutdown_timeout_ms": Field(int, 30000, min=0),
}

SCHEMA = {
    "topic": Field(str, check=topic_name),
    "subject": Field(str, check=lambda v: None if v else "must not be empty"),
    "schema_type": Field(str, choices=("json_schema", "avro", "string", "bytes", "number")),
    "schema_file": Field(str, ""),
    "auto_register": Field(bool, True),
    "version_strategy": Field(str, "latest", check=lambda v: None if v == "latest" else
                              "only \"latest\" is supported in a file (pin with the registry)"),
}

CORE = {
    "connector": Field(str, env="CONNECTOR_TYPE", help="the registered connector to run"),
    "danube_service_url": Field(str, "http://localhost:6650", env="DANUBE_SERVICE_URL",
                                check=_url),
    "connector_name": Field(str, env="CONNECTOR_NAME", check=one_of_names),
    "dead_letter_topic": Field(str, "", env="DEAD_LETTER_TOPIC", check=_optional_topic),
    "retry": Table(RETRY),
    "processing": Table(PROCESSING),
    "schemas": Tables(SCHEMA),
}


def read_file(path):
    """The TOML file as a dict; ConfigError naming the file and the problem."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"no such configuration file: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def load(raw, connector_fields, env=None):
    """(core, connector) namespaces from the parsed file: the core keys at the root, the
    connector's declared ``connector_fields`` (its own tables, e.g. ``{"mqtt": Table(...)}``)
    beside them. Every key of the file must belong to one of the two."""
    env = os.environ if env is None else env
    fields = dict(CORE)
    overlap = set(fields) & set(connector_fields)
    if overlap:
        raise ConfigError(f"the connector declares core keys: {sorted(overlap)}")
    fields.update(connector_fields)
    every = parse(raw, fields, "", env)
    core = types.SimpleNamespace(**{k: getattr(every, k) for k in CORE})
    own = types.SimpleNamespace(**{k: getattr(every, k) for k in connector_fields})
    if core.retry.max_backoff_ms < core.retry.retry_backoff_ms:
        raise ConfigError("retry.max_backoff_ms: below retry.retry_backoff_ms")
    if core.dead_letter_topic == "":
        core.dead_letter_topic = None
    return core, own


def connector_of(raw, env=None):
    """The ``connector`` key (or CONNECTOR_TYPE) before anything else is parsed."""
    env = os.environ if env is None else env
    name = env.get("CONNECTOR_TYPE") or raw.get("connector")
    if not isinstance(name, str) or not name:
        raise ConfigError("missing key connector (the connector to run, e.g. "
                          "\"source-mqtt\"; `danube connect list` shows them) or set "
                          "CONNECTOR_TYPE")
    return name
