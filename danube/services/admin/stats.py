"""danube_ext.TopicStatsService: topic and subscription statistics on the admin port
(protocol/DanubeExt.proto; the values come from danube.broker.stats)."""

from danube.broker import names
from danube.proto import DanubeExt_pb2 as ext
from danube.services import checks
from danube.services.admin.codes import ADMIN_CODES
from danube.services.admin.forward import forwarded
from danube.services.errors import maps_errors


def _topic(values):
    values = dict(values)
    log = values.pop("log", None)
    subs = values.pop("subscriptions", ())
    message = ext.TopicStats(**values)
    if log is not None:
        message.log.CopyFrom(ext.LogStats(**log))
    for sub in subs:
        sub = dict(sub)
        consumers = sub.pop("consumer_list", ())
        message.subscriptions.add(
            consumer_list=[ext.ConsumerStats(**c) for c in consumers], **sub)
    return message


class TopicStatsService:
    def __init__(self, core):
        self.core = core

    @maps_errors(ADMIN_CODES)
    @forwarded(ext.TopicStatsResponse)
    async def GetTopicStats(self, request, context):
        checks.topic_request(request)
        return ext.TopicStatsResponse(topics=[_topic(t) for t in
                                              await self.core.admin.topic_stats(request.name)])

    @maps_errors(ADMIN_CODES)
    async def ListTopicStats(self, request, context):
        if request.namespace:
            names.validate_namespace(request.namespace, "namespace")
        found = await self.core.admin.namespace_stats(request.namespace)
        return ext.TopicStatsResponse(topics=[_topic(t) for t in found])

