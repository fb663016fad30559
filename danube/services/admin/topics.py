"""danube_admin.TopicAdmin: topics' lifecycle, description and subscriptions (reference a.3)."""

from danube import failure_policy as fp
from danube.broker.errors import InvalidArgument
from danube.broker.topic import NON_RELIABLE, RELIABLE
from danube.proto import DanubeAdmin_pb2 as pb
from danube.services import checks
from danube.services.admin.codes import ADMIN_CODES
from danube.services.admin.forward import forwarded
from danube.services.errors import maps_errors

_BACKOFF = {pb.Fixed: fp.FIXED, pb.Exponential: fp.EXPONENTIAL}
_POISON = {pb.DeadLetter: fp.DEAD_LETTER, pb.Block: fp.BLOCK, pb.Drop: fp.DROP}
_BACKOFF_PB = {v: k for k, v in _BACKOFF.items()}
_POISON_PB = {v: k for k, v in _POISON.items()}


def _delivery(value):
    return NON_RELIABLE if checks.admin_dispatch(value) == pb.NonReliable else RELIABLE


def policy_from_pb(message):
    policy = fp.FailurePolicy(
        max_redelivery_count=message.max_redelivery_count,
        ack_timeout_ms=message.ack_timeout_ms,
        base_redelivery_delay_ms=message.base_redelivery_delay_ms,
        max_redelivery_delay_ms=message.max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF[message.backoff_strategy],
        poison_policy=_POISON[message.poison_policy],
        dead_letter_topic=message.dead_letter_topic if message.HasField("dead_letter_topic")
        and message.dead_letter_topic else None)
    try:
        return policy.validate()
    except fp.InvalidFailurePolicy as exc:
        raise InvalidArgument(f"failure_policy: {exc}") from None


def policy_to_pb(policy):
    message = pb.SubscriptionFailurePolicy(
        max_redelivery_count=policy.max_redelivery_count, ack_timeout_ms=policy.ack_timeout_ms,
        base_redelivery_delay_ms=policy.base_redelivery_delay_ms,
        max_redelivery_delay_ms=policy.max_redelivery_delay_ms,
        backoff_strategy=_BACKOFF_PB[policy.backoff_strategy],
        poison_policy=_POISON_PB[policy.poison_policy])
    if policy.dead_letter_topic:
        message.dead_letter_topic = policy.dead_letter_topic
    return message


class TopicAdmin:
    def __init__(self, core):
        self.core = core

    async def _topic_infos(self, names):
        return pb.TopicInfoListResponse(topics=[pb.TopicInfo(**info) for info in
                                                await self.core.admin.topic_infos(names)])

    @maps_errors(ADMIN_CODES)
    async def ListNamespaceTopics(self, request, context):
        checks.namespace_request(request)
        return await self._topic_infos(await self.core.namespaces.namespace_topics(request.name))

    @maps_errors(ADMIN_CODES)
    async def ListBrokerTopics(self, request, context):
        checks.broker_id(request.broker_id)
        return await self._topic_infos(await self.core.admin.broker_topics(request.broker_id))

    @maps_errors(ADMIN_CODES)
    async def CreateTopic(self, request, context):
        checks.new_topic_request(request)
        subject = await self._schema_subject(request)
        await self.core.topic_table.create_topic(request.name, _delivery(request.dispatch_strategy))
        if subject:
            await self.core.topic_schemas.configure_topic_schema(request.name, subject, "none",
                                                                 False)
        return pb.TopicResponse(success=True)

    async def _schema_subject(self, request):
        # Checked before the topic is created, so a bad subject creates nothing.
        subject = request.schema_subject if request.HasField("schema_subject") else ""
        if subject:
            await self.core.schemas.subject(subject, "schema_subject")   # else NOT_FOUND
        return subject

    @maps_errors(ADMIN_CODES)
    async def CreatePartitionedTopic(self, request, context):
        checks.partitioned_topic_request(request)
        subject = await self._schema_subject(request)
        await self.core.topic_table.create_partitioned_topic(
            request.base_name, request.partitions, _delivery(request.dispatch_strategy))
        if subject:
            await self.core.topic_schemas.configure_topic_schema(request.base_name, subject,
                                                                 "none", False)
        return pb.TopicResponse(success=True)

    @maps_errors(ADMIN_CODES)
    async def DeleteTopic(self, request, context):
        checks.topic_request(request)
        await self.core.topic_table.delete_topic(request.name)
        return pb.TopicResponse(success=True)

    @maps_errors(ADMIN_CODES)
    async def UnloadTopic(self, request, context):
        checks.topic_request(request)
        await self.core.admin.unload_topic(request.name)
        return pb.TopicResponse(success=True)

    @maps_errors(ADMIN_CODES)
    @forwarded(pb.SubscriptionListResponse)
    async def ListSubscriptions(self, request, context):
        checks.topic_request(request)
        return pb.SubscriptionListResponse(
            subscriptions=await self.core.admin.subscription_names(request.name))

    @maps_errors(ADMIN_CODES)
    async def DescribeTopic(self, request, context):
        checks.topic_request(request)
        return pb.DescribeTopicResponse(**await self.core.admin.describe_topic(request.name))

    @maps_errors(ADMIN_CODES)
    @forwarded(pb.SubscriptionResponse)
    async def Unsubscribe(self, request, context):
        checks.subscription_request(request)
        await self.core.admin.unsubscribe(request.topic, request.subscription)
        return pb.SubscriptionResponse(success=True)

    @maps_errors(ADMIN_CODES)
    @forwarded(pb.SubscriptionResponse)
    async def SetSubscriptionFailurePolicy(self, request, context):
        checks.failure_policy_request(request)
        await self.core.admin.set_failure_policy(request.topic, request.subscription,
                                           policy_from_pb(request.failure_policy))
        return pb.SubscriptionResponse(success=True)

    @maps_errors(ADMIN_CODES)
    @forwarded(pb.GetSubscriptionFailurePolicyResponse)
    async def GetSubscriptionFailurePolicy(self, request, context):
        checks.subscription_request(request)
        policy, sub_type = await self.core.admin.failure_policy(request.topic, request.subscription)
        response = pb.GetSubscriptionFailurePolicyResponse(subscription_type=sub_type)
        if policy is not None:
            response.failure_policy.CopyFrom(policy_to_pb(policy))
        return response

    @maps_errors(ADMIN_CODES)
    @forwarded(pb.SubscriptionResponse)
    async def SetSubscriptionDispatchConfig(self, request, context):
        checks.dispatch_config_request(request)
        await self.core.admin.set_dispatch_config(request.topic, request.subscription,
                                            request.dispatch_config.max_unacked_messages)
        return pb.SubscriptionResponse(success=True)

    @maps_errors(ADMIN_CODES)
    @forwarded(pb.GetSubscriptionDispatchConfigResponse)
    async def GetSubscriptionDispatchConfig(self, request, context):
        checks.subscription_request(request)
        value = await self.core.admin.dispatch_config(request.topic, request.subscription)
        response = pb.GetSubscriptionDispatchConfigResponse()
        if value is not None:
            response.dispatch_config.max_unacked_messages = value
        return response
