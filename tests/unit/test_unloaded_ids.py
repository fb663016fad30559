"""danube.broker.core.unloaded: an unloaded topic's producer and consumer ids are answered
"look it up again" for a while, then forgotten; the table never keeps expired entries."""

from types import SimpleNamespace

import pytest

from danube.broker.core.unloaded import UnloadedIds
from danube.broker.errors import TopicUnloaded


def topic(name, producers=(), consumers=()):
    sub = SimpleNamespace(consumers={c: None for c in consumers})
    return SimpleNamespace(name=name, producers={p: None for p in producers},
                           subscriptions={"s": sub})


def test_an_unloaded_topics_ids_are_answered_unloaded():
    ids = UnloadedIds()
    ids.remember(topic("/default/t", producers=[1, 2], consumers=[7]))
    for kind, client in (("producer", 1), ("producer", 2), ("consumer", 7)):
        with pytest.raises(TopicUnloaded, match=f"/default/t was unloaded.*{kind}"):
            ids.check(kind, client)
    ids.check("producer", 7)            # another kind's id, or an unknown one: nothing
    ids.check("consumer", 1)
    ids.check("producer", 99)


def test_expired_ids_are_forgotten_and_dropped():
    ids = UnloadedIds(memory=-1.0)      # expired as soon as remembered
    ids.remember(topic("/default/a", producers=[1]))
    ids.check("producer", 1)
    ids.memory = 60.0
    ids.remember(topic("/default/b", producers=[2]))
    assert list(ids._ids) == [("producer", 2)]     # /default/a's expired entry is gone
