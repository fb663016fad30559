"""The configuration error every layer raises for a bad setting.

A module of its own, below everything: the per-layer sections (``storage/durable/config.py``)
raise it while ``config.py`` imports them to parse their part of the YAML, so defining it in
``config.py`` made the two import each other."""


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the problem."""
