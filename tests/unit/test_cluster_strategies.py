"""Upstream's assignment strategies (danube.cluster.strategies) as pure functions: `fair`
goes by topic count, `balanced` weighs CPU and memory once any broker reports them,
`weighted_load` scores a broker by its dominant dimension when one is above 70 % of the
cluster's maximum; ties go to the lowest broker id; placing many topics one after another
with exact counts spreads them evenly."""

from danube.cluster import strategies


def report(cpu=0.0, mem=0.0, topics=(), throughput=0.0):
    return {"resources_usage": [{"resource": "CPU", "usage": cpu},
                                {"resource": "Memory", "usage": mem}],
            "topics": list(topics), "total_throughput_mbps": throughput}


def test_fair_picks_the_fewest_topics_and_breaks_ties_by_id():
    assert strategies.pick("fair", {"b": 3, "a": 5, "c": 3}, {}) == "b"
    assert strategies.pick("fair", {}, {}) is None


def test_balanced_falls_back_to_counts_without_resource_reports():
    counts = {"a": 4, "b": 2}
    assert strategies.pick("balanced", counts, {}) == "b"
    # With CPU reported, a busy broker loses even with fewer topics.
    reports = {"a": report(cpu=5, mem=5), "b": report(cpu=90, mem=60)}
    assert strategies.pick("balanced", counts, reports) == "a"


def test_weighted_load_follows_the_dominant_dimension():
    counts = {"a": 1, "b": 1, "c": 1}
    reports = {"a": report(cpu=95), "b": report(cpu=10, mem=90), "c": report(cpu=20, mem=20)}
    assert strategies.pick("weighted_load", counts, reports) == "c"
    # Equal reports: the topic count decides.
    same = {b: report(cpu=10, mem=10) for b in "abc"}
    assert strategies.pick("weighted_load", {"a": 7, "b": 2, "c": 5}, same) == "b"


def test_topic_load_weights_connections_and_backlog():
    hot = report(topics=[{"byte_rate_mbps": 10, "producer_count": 5, "consumer_count": 5,
                          "backlog_messages": 20_000}])
    assert strategies.topic_load(1, hot) == 0.2 + 3.0 + 3.0 + 0.4
    assert strategies.topic_load(3, None) == 0.6000000000000001


def test_placing_with_exact_counts_is_even():
    for strategy in strategies.STRATEGIES:
        counts = {"1": 0, "2": 0, "3": 0}
        for _ in range(10_000):
            counts[strategies.pick(strategy, counts, {})] += 1
        assert max(counts.values()) - min(counts.values()) <= 1, (strategy, counts)
        assert strategies.coefficient_of_variation(counts.values()) < 0.001


def test_coefficient_of_variation():
    assert strategies.coefficient_of_variation([5]) == 0.0
    assert strategies.coefficient_of_variation([0, 0]) == 0.0
    assert round(strategies.coefficient_of_variation([2, 4]), 6) == round(1 / 3, 6)
