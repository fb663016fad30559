"""A topic's statistics from the admin port's TopicStatsService, as the tests read them."""

from danube.proto import DanubeExt_pb2 as ext


async def topic_stats(admin, name):
    """The TopicStats of ``name`` (one, or one per partition), through an AdminClient."""
    resp = await admin.call("TopicStatsService", "GetTopicStats",
                            ext.TopicStatsRequest(name=name))
    return resp.topics


async def subscription_stats(admin, name, sub):
    """The SubscriptionStats of ``sub`` on the (non-partitioned) topic ``name``, or None."""
    (topic,) = await topic_stats(admin, name)
    return next((s for s in topic.subscriptions if s.name == sub), None)
