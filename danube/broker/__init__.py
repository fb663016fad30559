"""Broker core: topics, producers, subscriptions, dispatchers, policies."""
