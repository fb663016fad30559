"""The part of the admin API (danube_admin.*, admin port) the broker core supports so far:
namespaces and topic lifecycle. The remaining admin methods answer UNIMPLEMENTED until the
admin issue adds them."""

from danube.broker import errors as e
from danube.broker.topic import NON_RELIABLE, RELIABLE
from danube.proto import DanubeAdmin_pb2 as pb
from danube.rpc import StatusCode
from danube.services import checks
from danube.services.errors import maps_errors

# Upstream wraps admin topic failures as NOT_FOUND ("Unable to create the topic ... due to"),
# except an existing topic, which is ALREADY_EXISTS.
_ADMIN_CODES = {e.InvalidTopicName: StatusCode.INVALID_ARGUMENT,
                e.NamespaceNotFound: StatusCode.NOT_FOUND,
                e.NamespaceNotEmpty: StatusCode.FAILED_PRECONDITION}


def _delivery(value):
    return NON_RELIABLE if checks.admin_dispatch(value) == pb.NonReliable else RELIABLE


class TopicAdmin:
    def __init__(self, core):
        self.core = core

    @maps_errors(_ADMIN_CODES)
    async def CreateTopic(self, request, context):
        checks.new_topic_request(request)
        subject = await self._schema_subject(request)
        await self.core.create_topic(request.name, _delivery(request.dispatch_strategy))
        if subject:
            await self.core.configure_topic_schema(request.name, subject, "none", False)
        return pb.TopicResponse(success=True)

    async def _schema_subject(self, request):
        # Checked before the topic is created, so a bad subject creates nothing.
        subject = request.schema_subject if request.HasField("schema_subject") else ""
        if subject:
            await self.core.schemas.subject(subject, "schema_subject")   # else NOT_FOUND
        return subject

    @maps_errors(_ADMIN_CODES)
    async def CreatePartitionedTopic(self, request, context):
        checks.partitioned_topic_request(request)
        subject = await self._schema_subject(request)
        await self.core.create_partitioned_topic(request.base_name, request.partitions,
                                                 _delivery(request.dispatch_strategy))
        if subject:
            await self.core.configure_topic_schema(request.base_name, subject, "none", False)
        return pb.TopicResponse(success=True)

    @maps_errors(_ADMIN_CODES)
    async def DeleteTopic(self, request, context):
        checks.topic_request(request)
        await self.core.delete_topic(request.name)
        return pb.TopicResponse(success=True)

    @maps_errors(_ADMIN_CODES)
    async def ListNamespaceTopics(self, request, context):
        checks.namespace_request(request)
        topics = await self.core.namespace_topics(request.name)
        return pb.TopicInfoListResponse(topics=[
            pb.TopicInfo(name=t, broker_id=str(self.core.broker_id),
                         delivery=self.core.topics[t].delivery_name if t in self.core.topics
                         else "NonReliable")
            for t in topics])


class NamespaceAdmin:
    def __init__(self, core):
        self.core = core

    @maps_errors(_ADMIN_CODES)
    async def GetNamespaceTopics(self, request, context):
        checks.namespace_request(request)
        return pb.TopicListResponse(topics=await self.core.namespace_topics(request.name))

    @maps_errors({**_ADMIN_CODES, e.TopicAlreadyExists: StatusCode.ALREADY_EXISTS})
    async def CreateNamespace(self, request, context):
        checks.namespace_request(request)
        await self.core.create_namespace(request.name)
        return pb.NamespaceResponse(success=True)

    @maps_errors(_ADMIN_CODES)
    async def DeleteNamespace(self, request, context):
        checks.namespace_request(request)
        await self.core.delete_namespace(request.name)
        return pb.NamespaceResponse(success=True)


class BrokerAdmin:
    def __init__(self, core):
        self.core = core

    async def ListNamespaces(self, request, context):
        return pb.NamespaceListResponse(namespaces=await self.core.list_namespaces())


def register(server, core):
    services = pb.DESCRIPTOR.services_by_name
    server.add_service(services["TopicAdmin"], TopicAdmin(core))
    server.add_service(services["NamespaceAdmin"], NamespaceAdmin(core))
    server.add_service(services["BrokerAdmin"], BrokerAdmin(core))
