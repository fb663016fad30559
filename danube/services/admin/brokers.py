"""danube_admin.BrokerAdmin (reference a.3). A standalone broker is a cluster of one: it
lists itself as Cluster_Leader, reports a balanced cluster, has nothing to rebalance, and
refuses to unload itself (there is no other broker to take its topics). The answers come from
the core's placement (danube.broker.placement; in cluster mode danube.cluster's)."""

from danube.proto import DanubeAdmin_pb2 as pb
from danube.services import checks
from danube.services.admin.codes import ADMIN_CODES
from danube.services.errors import maps_errors


class BrokerAdmin:
    def __init__(self, core):
        self.core = core

    @maps_errors(ADMIN_CODES)
    async def ListBrokers(self, request, context):
        return pb.BrokerListResponse(brokers=[pb.BrokerInfo(**b)
                                              for b in await self.core.admin.list_brokers()])

    async def GetLeaderBroker(self, request, context):
        return pb.BrokerResponse(leader=self.core.admin.leader_id)

    @maps_errors(ADMIN_CODES)
    async def ListNamespaces(self, request, context):
        return pb.NamespaceListResponse(namespaces=await self.core.namespaces.list_namespaces())

    @maps_errors(ADMIN_CODES)
    async def UnloadBroker(self, request, context):
        checks.broker_id(request.broker_id)
        result = await self.core.admin.unload_broker(
            request.broker_id, dry_run=request.dry_run,
            include=tuple(request.namespaces_include), exclude=tuple(request.namespaces_exclude),
            max_parallel=request.max_parallel or 1,
            timeout=float(request.timeout_seconds or 60))
        return pb.UnloadBrokerResponse(**result)

    @maps_errors(ADMIN_CODES)
    async def ActivateBroker(self, request, context):
        checks.broker_id(request.broker_id)
        await self.core.admin.activate_broker(request.broker_id, request.reason)
        return pb.ActivateBrokerResponse(success=True)

    @maps_errors(ADMIN_CODES)
    async def GetClusterBalance(self, request, context):
        balance = self.core.admin.balance()
        brokers = [pb.BrokerLoadInfo(**b) for b in balance.pop("brokers")]
        return pb.ClusterBalanceResponse(brokers=brokers, **balance)

    @maps_errors(ADMIN_CODES)
    async def TriggerRebalance(self, request, context):
        result = await self.core.admin.rebalance(
            request.dry_run, request.max_moves if request.HasField("max_moves") else None)
        moves = [pb.ProposedMove(**m) for m in result.pop("proposed_moves")]
        return pb.RebalanceResponse(proposed_moves=moves, **result)
