"""Connectors by name, from the ``danube.connectors`` entry-point group: the project's own
(pyproject.toml) and any a user's package registers."""

from importlib.metadata import entry_points

from danube.connect.connector import SinkConnector, SourceConnector
from danube.connect.errors import ConfigError

GROUP = "danube.connectors"
#: The pip extra of each connector whose library is not in the ``connect`` extra (a
#: server's client with a dependency tree of its own).
EXTRAS = {"sink-qdrant": "qdrant", "sink-surrealdb": "surrealdb"}


def available():
    """{name: entry point}"""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load(name):
    """The connector class registered as ``name``; ConfigError naming the known ones, or
    what failed to import (a missing optional dependency names its pip extra)."""
    found = available()
    if name not in found:
        raise ConfigError(f"connector: no connector named {name!r} (registered: "
                          f"{', '.join(sorted(found)) or 'none'})")
    try:
        cls = found[name].load()
    except ImportError as exc:
        extra = EXTRAS.get(name, "connect")
        raise ConfigError(f"connector {name!r} cannot be loaded: {exc} (install its "
                          f"dependencies: pip install 'danube-broker-py[{extra}]')") from None
    if not (isinstance(cls, type) and issubclass(cls, (SourceConnector, SinkConnector))):
        raise ConfigError(f"connector {name!r}: {found[name].value} is not a SourceConnector "
                          f"or SinkConnector class")
    return cls
