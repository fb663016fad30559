"""danube_admin.NamespaceAdmin (reference a.3)."""

import json

from danube.proto import DanubeAdmin_pb2 as pb
from danube.services import checks
from danube.services.admin.codes import ADMIN_CODES
from danube.services.errors import maps_errors


class NamespaceAdmin:
    def __init__(self, core):
        self.core = core

    @maps_errors(ADMIN_CODES)
    async def GetNamespaceTopics(self, request, context):
        checks.namespace_request(request)
        topics = await self.core.namespaces.namespace_topics(request.name)
        return pb.TopicListResponse(topics=topics)

    @maps_errors(ADMIN_CODES)
    async def GetNamespacePolicies(self, request, context):
        checks.namespace_request(request)
        # Upstream's serde_json of its Policies struct: the seven fields, compact.
        policies = await self.core.namespaces.namespace_policies(request.name)
        return pb.PolicyResponse(policies=json.dumps(policies, separators=(",", ":")))

    @maps_errors(ADMIN_CODES)
    async def CreateNamespace(self, request, context):
        checks.namespace_request(request)
        await self.core.namespaces.create_namespace(request.name)
        return pb.NamespaceResponse(success=True)

    @maps_errors(ADMIN_CODES)
    async def DeleteNamespace(self, request, context):
        checks.namespace_request(request)
        await self.core.namespaces.delete_namespace(request.name)
        return pb.NamespaceResponse(success=True)
