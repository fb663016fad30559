"""The key helpers spell upstream's layout (reference d.2) exactly, and their prefixes select
a topic's keys without catching a sibling whose name merely starts the same way."""

import pytest

from danube.metadata import MemoryStore
from danube.metadata import keys as k


def test_layout_matches_upstream():
    t = "/default/orders"
    assert k.cluster("c1") == "/cluster/c1"
    assert k.cluster_register(42) == "/cluster/register/42"
    assert k.cluster_broker_state("42") == "/cluster/brokers/42/state"
    assert k.cluster_broker_topic(42, t) == "/cluster/brokers/42/default/orders"
    assert k.cluster_unassigned(t) == "/cluster/unassigned/default/orders"
    assert k.cluster_load(42) == "/cluster/load/42"
    assert k.CLUSTER_LEADER == "/cluster/leader"
    assert k.namespace_policy("default") == "/namespaces/default/policy"
    assert k.namespace_topic(t) == "/namespaces/default/topics/default/orders"
    assert k.topic_root(t) == "/topics/default/orders"
    assert k.topic_delivery(t) == "/topics/default/orders/delivery"
    assert k.topic_policy(t) == "/topics/default/orders/policy"
    assert k.topic_schema_subject(t) == "/topics/default/orders/schema_subject"
    assert k.topic_schema_config(t) == "/topics/default/orders/schema_config"
    assert k.topic_producer(t, 7) == "/topics/default/orders/producers/7"
    assert k.topic_subscription(t, "s") == "/topics/default/orders/subscriptions/s"
    assert k.subscription_cursor(t, "s") == "/topics/default/orders/subscriptions/s/cursor"
    assert k.subscription_failure_policy(t, "s").endswith("/subscriptions/s/failure_policy")
    assert k.subscription_dispatch_config(t, "s").endswith("/subscriptions/s/dispatch_config")
    assert k.schema_metadata("default-orders") == "/schemas/default-orders/metadata"
    assert k.schema_version("default-orders", 3) == "/schemas/default-orders/versions/3"
    assert k.schema_compatibility("x") == "/schemas/x/compatibility"
    assert k.SCHEMA_NEXT_ID == "/schemas/_global/next_schema_id"
    assert k.schema_by_id(9) == "/schemas/_index/by_id/9"
    assert k.auth_role("admin") == "/auth/roles/admin"
    assert (k.storage_segment(t, 1000)
            == "/danube/storage/topics/default/orders/segments/00000000000000001000")
    assert k.storage_segments_cur(t) == "/danube/storage/topics/default/orders/segments/cur"
    assert k.storage_topic_state(t, "/p") == "/p/storage/topics/default/orders/state"


@pytest.mark.parametrize("bad", ["default/orders", "/default", "/a/b/c", "x/ns/t", "", None])
def test_bad_topic_names(bad):
    with pytest.raises(ValueError):
        k.topic_root(bad)


def test_bad_segments():
    with pytest.raises(ValueError):
        k.namespace_policy("a/b")
    with pytest.raises(ValueError):
        k.topic_subscription("/ns/t", "s/x")
    with pytest.raises(ValueError):
        k.storage_segment("/ns/t", -1)


async def test_topic_prefix_excludes_sibling_topics():
    async with MemoryStore() as store:
        for topic in ("/ns/foo", "/ns/foobar", "/ns/foo-1"):
            await store.put(k.topic_delivery(topic), "Reliable")
            await store.put(k.subscription_cursor(topic, "s"), 5)
            await store.put(k.namespace_topic(topic), None)
        assert await store.keys(k.topic_root("/ns/foo")) == [
            "/topics/ns/foo/delivery", "/topics/ns/foo/subscriptions/s/cursor"]
        assert await store.delete_prefix(k.topic_root("/ns/foo")) == 2
        assert len(await store.keys(k.namespace_topics_prefix("ns"))) == 3
        assert len(await store.keys(k.TOPICS)) == 4
