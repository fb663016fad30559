"""A Danube-compatible publish/subscribe message broker."""

__version__ = "0.1.0"
