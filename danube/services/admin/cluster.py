"""danube_admin.ClusterAdmin (reference a.3). Upstream's service shows and changes the
membership of the Raft group its brokers embed for their metadata. Here the metadata's
consensus is its store's, so ClusterStatus reports that store's facts in upstream's shape
(docs/compatibility.md, "ClusterAdmin"):

- on etcd: etcd's own Raft group. Every id is an etcd member id, so upstream's invariants
  hold (the leader is one of the voters, this node is a voter or a learner): leader_id is
  etcd's leader, self_node_id the member this broker's store talks to, raft_addr that
  member's peer URLs (its Raft transport), current_term and last_applied etcd's Raft term
  and applied index. The leader broker is BrokerAdmin.GetLeaderBroker's answer.
- on the embedded store (standalone, or cluster mode without etcd endpoints): one voter,
  this broker, which leads it; term 1 (nobody else ever stands), last_applied the store's
  revision (one per committed metadata change); raft_addr empty (no Raft transport).

The membership changes (AddNode, PromoteNode, RemoveNode) answer UNIMPLEMENTED naming what
does the job: etcdctl for etcd's members, etcd itself for an embedded store that cannot
take a second node."""

from danube.proto import DanubeAdmin_pb2 as pb
from danube.rpc import RpcError, StatusCode
from danube.services.admin.codes import ADMIN_CODES
from danube.services.errors import maps_errors

_ETCD_TOOL = {
    "AddNode": "etcdctl member add <name> --peer-urls=<url>",
    "PromoteNode": "etcdctl member promote <member id>",
    "RemoveNode": "etcdctl member remove <member id>",
}


class EtcdStatus:
    """ClusterStatus from the etcd cluster behind the broker's metadata store.
    `unavailable`: the store's exception for "cannot answer now" (this layer does not
    import the store), answered UNAVAILABLE: etcd down is a state of the cluster, not a
    fault of the broker."""

    def __init__(self, store, unavailable):
        self.store = store
        self.unavailable = unavailable

    async def __call__(self) -> dict:
        try:
            etcd = await self.store.cluster_status()
        except self.unavailable as exc:
            raise RpcError(StatusCode.UNAVAILABLE,
                           f"etcd did not answer the cluster status: {exc}") from None
        return {"leader_id": etcd["leader"], "current_term": etcd["raft_term"],
                "last_applied": etcd["raft_applied_index"], "voters": etcd["voters"],
                "learners": etcd["learners"], "self_node_id": etcd["self"],
                "raft_addr": ",".join(etcd["self_peer_urls"])}

    def membership_refusal(self, method: str) -> str:
        return (f"{method}: this cluster keeps its metadata in etcd, whose members are "
                f"managed with etcd's own tooling ({_ETCD_TOOL[method]}); brokers join "
                "and leave by starting and stopping with meta_store.etcd_endpoints")


class EmbeddedStatus:
    """ClusterStatus of a broker on its embedded store: a group of one."""

    def __init__(self, store, broker_id):
        self.store = store
        self.broker_id = int(broker_id)

    async def __call__(self) -> dict:
        return {"leader_id": self.broker_id, "current_term": 1,
                "last_applied": self.store.revision, "voters": [self.broker_id],
                "learners": [], "self_node_id": self.broker_id, "raft_addr": ""}

    def membership_refusal(self, method: str) -> str:
        return (f"{method}: this broker keeps its metadata in its embedded store, a group "
                "of one that takes no other node; a cluster keeps its metadata in etcd "
                "(meta_store.etcd_endpoints), whose members are managed with etcdctl")


class ClusterAdmin:
    def __init__(self, status):
        self.status = status

    @maps_errors(ADMIN_CODES)
    async def ClusterStatus(self, request, context):
        return pb.ClusterStatusResponse(**await self.status())

    def _refuse(self, method):
        raise RpcError(StatusCode.UNIMPLEMENTED, self.status.membership_refusal(method))

    async def AddNode(self, request, context):
        self._refuse("AddNode")

    async def PromoteNode(self, request, context):
        self._refuse("PromoteNode")

    async def RemoveNode(self, request, context):
        self._refuse("RemoveNode")


def register(server, status):
    """`status`: an EtcdStatus or an EmbeddedStatus."""
    server.add_service(pb.DESCRIPTOR.services_by_name["ClusterAdmin"], ClusterAdmin(status))
