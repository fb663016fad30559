"""A lookup on a broker whose view of the cluster lags the metadata store (ClusterNode.catch_up):
a topic the store has, or one between owners, is waited for instead of answered NOT_FOUND
(seen beside a CPU hog: a lookup right after a creation through another broker); a topic
nobody has is answered at once."""

import asyncio
import types

from danube.cluster.node import ClusterNode
from danube.config_cluster import RebalancingConfig
from danube.metadata import keys
from danube.metadata.memory import MemoryStore

TOPIC = "/default/lagging"
URL = "http://10.0.0.2:6650"


def node():
    cfg = types.SimpleNamespace(assignment_strategy="fair", lease_ttl_seconds=3,
                                rebalancing=RebalancingConfig())
    return ClusterNode(MemoryStore(), cfg)


def owner_arrives(n, delay):
    async def later():
        await asyncio.sleep(delay)
        n.view.registered["2"] = {"broker_url": URL}
        n.view.owners[TOPIC] = "2"
    return asyncio.get_running_loop().create_task(later())


async def test_a_topic_the_store_has_is_waited_for():
    n = node()
    await n.store.put(keys.namespace_topic(TOPIC), None)
    assert n.locate(TOPIC) is None
    arrival = owner_arrives(n, 0.2)
    assert await n.catch_up(TOPIC)
    assert n.locate(TOPIC) == (URL, URL)
    await arrival


async def test_a_topic_between_owners_is_waited_for():
    n = node()
    n.view.unassigned[TOPIC] = {"reason": "unload", "from_broker": "1"}
    arrival = owner_arrives(n, 0.2)
    assert await n.catch_up(TOPIC)
    await arrival


async def test_a_topic_nobody_has_is_answered_at_once():
    n = node()
    waits = []

    async def until(condition, timeout):
        waits.append(timeout)
        return condition()
    n.view.until = until
    assert not await n.catch_up("/default/nobody")
    assert waits == []              # no wait for the view: NOT_FOUND straight away
