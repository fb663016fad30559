"""The broker core (see broker.py): the topics, producers and subscriptions of this broker."""

from danube.broker.core.broker import BrokerCore

__all__ = ["BrokerCore"]
