"""Automatic rebalancing's rules (danube.cluster.rebalance_policy) as pure functions, and one
leader's checks (danube.cluster.rebalancer) on a cluster view of an in-memory store with a
fake clock: one move per check from the most to the least loaded broker, none below the
aggressiveness' CV threshold, with too few brokers, within the cooldown, past the hourly
budget, for a blacklisted or too young topic, or while the last move is under way."""

import types

import pytest

from danube.cluster import rebalance_policy as policy
from danube.cluster.admin import ClusterOps
from danube.cluster.rebalancer import HISTORY, AutoRebalancer
from danube.cluster.view import ClusterView
from danube.config_cluster import RebalancingConfig
from danube.metadata import keys
from danube.metadata.memory import MemoryStore


@pytest.mark.parametrize("topic, patterns, expected", [
    ("/default/a", ["/default/a"], True),
    ("/default/a", ["/default/*"], True),
    ("/defaultx/a", ["/default/*"], False),
    ("/default", ["/default/*"], False),
    ("/default/a", ["/default/b", "/other/*"], False),
    ("/default/a", [], False),
])
def test_blacklist_matches_names_and_namespace_wildcards(topic, patterns, expected):
    assert policy.is_blacklisted(topic, patterns) is expected


def test_topic_age():
    assert policy.old_enough(100.0, 130.0, 30)
    assert not policy.old_enough(100.0, 129.9, 30)
    assert not policy.old_enough(None, 1e9, 0)      # a placement this leader never saw


def test_budget_per_hour_and_cooldown():
    budget = policy.MoveBudget(per_hour=2, cooldown=10)
    assert budget.blocked(0) is None
    budget.record(0)
    assert "cooling down" in budget.blocked(5)
    assert budget.blocked(10) is None
    budget.record(10)
    assert "2 moves in the last hour" in budget.blocked(100)
    assert "2 moves in the last hour" in budget.blocked(3599)
    assert budget.blocked(3600.5) is None           # the first move left the hour
    assert budget.in_last_hour(3600.5) == 1


@pytest.mark.parametrize("aggressiveness, cv, moves", [
    ("conservative", 0.39, False), ("conservative", 0.40, True),
    ("balanced", 0.29, False), ("balanced", 0.30, True),
    ("aggressive", 0.19, False), ("aggressive", 0.20, True),
])
def test_cv_threshold_by_aggressiveness(aggressiveness, cv, moves):
    cfg = RebalancingConfig(enabled=True, aggressiveness=aggressiveness)
    assert (policy.skip_reason(cfg, 3, cv) is None) is moves


def test_minimum_brokers():
    cfg = RebalancingConfig(enabled=True, min_brokers_for_rebalance=3)
    assert "min_brokers_for_rebalance 3" in policy.skip_reason(cfg, 2, 1.0)
    assert policy.skip_reason(cfg, 3, 1.0) is None
    one = RebalancingConfig(enabled=True, min_brokers_for_rebalance=1)
    assert policy.skip_reason(one, 1, 1.0) is not None     # nowhere to move to


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


async def cluster(counts, **rebalancing):
    """A view of brokers 1..n owning counts[i] topics each; the rebalancer and its clock."""
    store = MemoryStore()
    for i, n in enumerate(counts, 1):
        await store.put(keys.cluster_register(i), {"broker_url": f"http://b{i}:1"})
        await store.put(keys.cluster_broker_state(i), {"mode": "active"})
        for t in range(n):
            await store.put(keys.cluster_broker_topic(i, f"/ns{i}/t{t}"), None)
    view = ClusterView(store)
    await view.start()
    node = types.SimpleNamespace(store=store, view=view,
                                 cfg=types.SimpleNamespace(assignment_strategy="fair"))
    clock = Clock()
    cfg = RebalancingConfig(**{"enabled": True, "aggressiveness": "aggressive",
                               "cooldown_seconds": 0, "min_topic_age_seconds": 0,
                               **rebalancing})
    rebalancer = AutoRebalancer(ClusterOps(node), cfg, clock=clock)
    rebalancer.placed_at = {t: clock.now for t in view.owners}
    return store, view, rebalancer, clock


async def finish(store, view, move):
    """What the owner and the leader do with a move marker: place it on its target."""
    topic = move["topic_name"]
    await store.delete(keys.cluster_unassigned(topic))
    await store.put(keys.cluster_broker_topic(move["to_broker"], topic), None)
    await view.until(lambda: topic not in view.unassigned and topic in view.owners)


async def test_one_move_per_check_to_the_least_loaded_broker():
    store, view, rebalancer, clock = await cluster([4, 4, 4, 0])
    move = await rebalancer.check()
    assert move["to_broker"] == 4 and move["from_broker"] in (1, 2, 3)
    marker = await store.get(keys.cluster_unassigned(move["topic_name"]))
    assert marker == {"reason": "rebalance", "from_broker": str(move["from_broker"]),
                      "to_broker": "4", "ready": False}
    assert await store.get_entry(keys.cluster_broker_topic(move["from_broker"],
                                                           move["topic_name"])) is None
    history = await store.scan(HISTORY)
    assert [v["topic"] for _, v in history] == [move["topic_name"]]
    # The next check waits for this move to be placed.
    assert await rebalancer.check() is None
    await finish(store, view, move)
    made = 1
    while (move := await rebalancer.check()) is not None:
        await finish(store, view, move)
        made += 1
    assert made == 3 and rebalancer.moves_total == 3
    assert sorted(len(view.topics_of(str(b))) for b in range(1, 5)) == [3, 3, 3, 3]
    assert rebalancer.last_cv == 0.0


async def test_nothing_moves_below_the_threshold():
    _, _, rebalancer, _ = await cluster([3, 3, 2, 2], aggressiveness="balanced")
    assert await rebalancer.check() is None      # CV 0.2 < 0.3
    assert rebalancer.last_cv == pytest.approx(0.2)


async def test_hourly_budget_and_cooldown():
    store, view, rebalancer, clock = await cluster([6, 6, 0], max_moves_per_hour=2,
                                                   cooldown_seconds=30)
    await finish(store, view, await rebalancer.check())
    clock.now += 29
    assert await rebalancer.check() is None      # cooling down
    clock.now += 1
    await finish(store, view, await rebalancer.check())
    clock.now += 600
    assert await rebalancer.check() is None      # two moves this hour
    clock.now += 3000
    assert await rebalancer.check() is not None


async def test_young_and_blacklisted_topics_stay():
    store, view, rebalancer, clock = await cluster([3, 3, 0], min_topic_age_seconds=60,
                                                   blacklist_topics=("/ns1/*",))
    assert await rebalancer.check() is None      # every topic just placed
    clock.now += 60
    move = await rebalancer.check()
    assert move["topic_name"].startswith("/ns2/") and move["from_broker"] == 2
    await finish(store, view, move)
    rebalancer.on_event(types.SimpleNamespace(
        kind="put", key=keys.cluster_broker_topic(3, move["topic_name"])))
    # broker 2 has 2 topics now, broker 3 one (just moved), broker 1 only blacklisted ones.
    assert await rebalancer.check() is None


async def test_a_move_whose_assignment_delete_failed_is_finished():
    store, view, rebalancer, _ = await cluster([4, 0])
    await store.put(keys.cluster_unassigned("/ns1/t0"),
                    {"reason": "rebalance", "from_broker": "1", "to_broker": "2",
                     "ready": False})
    await view.until(lambda: "/ns1/t0" in view.unassigned)
    assert await rebalancer.check() is None
    assert await store.get_entry(keys.cluster_broker_topic(1, "/ns1/t0")) is None


async def test_disabled_does_not_start():
    _, view, _, _ = await cluster([4, 0])
    rebalancer = AutoRebalancer(types.SimpleNamespace(view=view), RebalancingConfig())
    rebalancer.start()
    assert rebalancer._task is None


async def test_a_placement_starts_the_age_and_a_removal_forgets_it():
    _, _, rebalancer, clock = await cluster([1, 0])
    key = keys.cluster_broker_topic(2, "/ns1/t0")
    clock.now += 5
    rebalancer.on_event(types.SimpleNamespace(kind="put", key=key))
    assert rebalancer.placed_at["/ns1/t0"] == clock.now
    rebalancer.on_event(types.SimpleNamespace(kind="put", key=keys.cluster_broker_state(2)))
    rebalancer.on_event(types.SimpleNamespace(kind="delete", key=key))
    assert "/ns1/t0" not in rebalancer.placed_at


async def test_a_failed_move_is_counted_and_tried_again():
    """upstream's danube_rebalancing_failures_total: a check whose move the store refuses
    counts one failure, and the next check makes the move."""
    from danube.metadata.errors import MetadataUnavailable

    store, view, rebalancer, clock = await cluster([4, 0], check_interval_seconds=0.01)
    put = store.put
    refused = []

    async def refusing_put(key, value, *args, **kwargs):
        if key.startswith(keys.CLUSTER_UNASSIGNED) and not refused:
            refused.append(key)
            raise MetadataUnavailable("etcd is away")
        return await put(key, value, *args, **kwargs)

    store.put = refusing_put
    rebalancer.start()
    try:
        await view.until(lambda: rebalancer.moves_total >= 1 and bool(view.unassigned),
                         timeout=30)
    finally:
        await rebalancer.stop()
    assert refused and rebalancer.failures_total == 1 and rebalancer.moves_total >= 1
