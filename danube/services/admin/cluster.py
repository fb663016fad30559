"""danube_admin.ClusterAdmin in cluster mode on etcd (reference a.3). Upstream's service
manages the membership of its embedded Raft group; here the metadata's consensus is etcd's,
so ClusterStatus reports etcd's Raft state and members beside the leader broker, and the
membership changes (AddNode, PromoteNode, RemoveNode) answer UNIMPLEMENTED, naming the
etcdctl command that does the job. A standalone broker does not serve ClusterAdmin."""

from danube.proto import DanubeAdmin_pb2 as pb
from danube.rpc import RpcError, StatusCode
from danube.services.admin.codes import ADMIN_CODES
from danube.services.errors import maps_errors

_ETCD_TOOL = {
    "AddNode": "etcdctl member add <name> --peer-urls=<url>",
    "PromoteNode": "etcdctl member promote <member id>",
    "RemoveNode": "etcdctl member remove <member id>",
}


class ClusterAdmin:
    def __init__(self, cluster):
        self.cluster = cluster

    @maps_errors(ADMIN_CODES)
    async def ClusterStatus(self, request, context):
        return pb.ClusterStatusResponse(**await self.cluster.status())

    async def _etcd_only(self, method):
        raise RpcError(StatusCode.UNIMPLEMENTED,
                       f"{method}: this cluster keeps its metadata in etcd, whose members are "
                       f"managed with etcd's own tooling ({_ETCD_TOOL[method]}); brokers join "
                       "and leave by starting and stopping with meta_store.etcd_endpoints")

    async def AddNode(self, request, context):
        await self._etcd_only("AddNode")

    async def PromoteNode(self, request, context):
        await self._etcd_only("PromoteNode")

    async def RemoveNode(self, request, context):
        await self._etcd_only("RemoveNode")


def register(server, cluster):
    server.add_service(pb.DESCRIPTOR.services_by_name["ClusterAdmin"], ClusterAdmin(cluster))
