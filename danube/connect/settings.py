"""Declared configuration: a connector lists its keys as ``Field``s, and one TOML file plus
environment variables become a validated namespace, or a ConfigError naming the bad key.

Upstream reads one TOML file (``CONNECTOR_CONFIG_PATH``) with the core keys at the root and
the connector's under its own table (``[mqtt]``, ``[deltalake]``); some keys may be given by
environment variables (``DANUBE_SERVICE_URL``, ``MQTT_PASSWORD``...), which win over the
file. Unlike upstream (serde ignores unknown keys), an unknown key is an error: a misspelt
``brokr_host`` would otherwise fall back to a default without a word."""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Callable

from danube.connect.errors import ConfigError

REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Field:
    """One key: its type (str, int, float, bool, list, dict, or ``Table``/``Tables`` for a
    nested table or array of tables), default (REQUIRED: must be given), the environment
    variable that overrides it, allowed ``choices``, a numeric ``min``/``max``, and a
    ``check(value) -> error or None``."""
    kind: Any
    default: Any = REQUIRED
    env: str | None = None
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    check: Callable[[Any], str | None] | None = None
    help: str = ""


@dataclasses.dataclass(frozen=True)
class Table:
    """A nested table (``[retry]``) of fields."""
    fields: dict


@dataclasses.dataclass(frozen=True)
class Tables:
    """An array of tables (``[[mqtt.routes]]``), each of ``fields``; ``min_items`` at least."""
    fields: dict
    min_items: int = 0


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "an array", dict: "a table"}


def _from_env(name, kind, text):
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"environment variable {name}: expected true or false, not {text!r}")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise ConfigError(f"environment variable {name}: expected {_TYPE_NAMES[kind]}, "
                              f"not {text!r}") from None
    if kind is str:
        return text
    raise ConfigError(f"environment variable {name}: a {kind.__name__} cannot be given so")


def _typed(path, kind, value):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{path}: expected {_TYPE_NAMES.get(kind, kind.__name__)}, "
                          f"not {type(value).__name__} {value!r}")
    return value


def parse(section, fields, path="", env=None):
    """A SimpleNamespace of ``fields`` read from the dict ``section`` (the part of the TOML
    at ``path``), environment variables winning; ConfigError names the first bad key."""
    env = os.environ if env is None else env
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{path or 'the configuration'}: expected a table, not "
                          f"{type(section).__name__}")
    prefix = f"{path}." if path else ""
    unknown = sorted(set(section) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]} (known here: "
                          f"{', '.join(sorted(fields))})")
    out = {}
    for name, spec in fields.items():
        key = prefix + name
        if isinstance(spec, Table):
            out[name] = parse(section.get(name), spec.fields, key, env)
            continue
        if isinstance(spec, Tables):
            items = section.get(name, [])
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise ConfigError(f"{key}: expected an array of tables ([[{key}]])")
            if len(items) < spec.min_items:
                raise ConfigError(f"{key}: at least {spec.min_items} needed ([[{key}]])")
            out[name] = [parse(item, spec.fields, f"{key}[{i}]", env)
                         for i, item in enumerate(items)]
            continue
        if spec.env and env.get(spec.env) not in (None, ""):
            value = _from_env(spec.env, spec.kind, env[spec.env])
            where = f"{key} (from {spec.env})"
        elif name in section:
            value = _typed(key, spec.kind, section[name])
            where = key
        elif spec.default is REQUIRED:
            hint = f" or set {spec.env}" if spec.env else ""
            raise ConfigError(f"missing key {key}{hint}")
        else:
            out[name] = spec.default
            continue
        _check(where, spec, value)
        out[name] = value
    return types.SimpleNamespace(**out)


def _check(where, spec, value):
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{where}: {value!r} is not one of "
                          f"{', '.join(map(repr, spec.choices))}")
    if spec.min is not None and value < spec.min:
        raise ConfigError(f"{where}: {value!r} is below the minimum {spec.min}")
    if spec.max is not None and value > spec.max:
        raise ConfigError(f"{where}: {value!r} is above the maximum {spec.max}")
    if spec.check is not None:
        problem = spec.check(value)
        if problem:
            raise ConfigError(f"{where}: {problem}")


def topic_name(value):
    """A check: a Danube topic is /namespace/topic of letters, digits, '_' and '-'."""
    parts = value.split("/")
    if len(parts) != 3 or parts[0] or not all(
            p and all(c.isalnum() or c in "_-" for c in p) for p in parts[1:]):
        return f"{value!r} is not a Danube topic name (/namespace/topic)"
    return None


def upstream_subscription_type(value):
    """A check: upstream's connectors write ``Exclusive``, ``Shared``, ``FailOver``; any
    case is taken (the consumer gets it lower-cased)."""
    if value.lower() not in ("exclusive", "shared", "failover"):
        return f"{value!r} is not one of Exclusive, Shared, FailOver"
    return None


def one_of_names(value):
    """A check for names used in topics, producers and metrics labels."""
    if not value or not all(c.isalnum() or c in "_-." for c in value):
        return f"{value!r}: use letters, digits, '_', '-' or '.'"
    return None
