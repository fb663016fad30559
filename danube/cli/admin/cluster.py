"""`danube admin cluster`: upstream danube-admin's cluster group. `status` prints upstream's
lines (a cluster on etcd reports etcd's Raft group: its members, leader, term and index; a
broker on its embedded store a group of one); the membership commands call the broker,
which answers that etcd's members are managed with etcdctl."""

from danube.cli.admin.common import add_command, add_group
from danube.proto import DanubeAdmin_pb2 as adm


def add_parser(groups):
    cmds = add_group(groups, "cluster", "cluster membership and status",
                     "  danube admin cluster status")
    add_command(cmds, "status", _status, "show the cluster's metadata consensus and leader")
    p = add_command(cmds, "add-node", _add, "add a metadata node (upstream's Raft; etcdctl "
                    "here)")
    p.add_argument("--node-addr", required=True, help="admin URL of the new node")
    p = add_command(cmds, "promote-node", _promote, "promote a learner to voter (upstream's "
                    "Raft; etcdctl here)")
    p.add_argument("--node-id", required=True, type=int, help="node id")
    p = add_command(cmds, "remove-node", _remove, "remove a metadata node (upstream's Raft; "
                    "etcdctl here)")
    p.add_argument("--node-id", required=True, type=int, help="node id")


async def _status(admin, args):
    s = await admin.call("ClusterAdmin", "ClusterStatus", what="get the cluster status")
    print("Raft Cluster Status:")
    print(f"  Self Node ID:  {s.self_node_id}")
    print(f"  Raft Address:  {s.raft_addr}")
    print(f"  Leader:        {s.leader_id or 'none'}")
    print(f"  Term:          {s.current_term}")
    print(f"  Last Applied:  {s.last_applied}")
    print(f"  Voters:        [{', '.join(str(v) for v in s.voters)}]")
    if s.learners:
        print(f"  Learners:      [{', '.join(str(v) for v in s.learners)}]")


async def _membership(admin, method, request):
    r = await admin.call("ClusterAdmin", method, request, what=method)
    print(f"{'Success' if r.success else 'Failed'}: {r.message}")


async def _add(admin, args):
    await _membership(admin, "AddNode", adm.AddNodeRequest(addr=args.node_addr))


async def _promote(admin, args):
    await _membership(admin, "PromoteNode", adm.PromoteNodeRequest(node_id=args.node_id))


async def _remove(admin, args):
    await _membership(admin, "RemoveNode", adm.RemoveNodeRequest(node_id=args.node_id))
