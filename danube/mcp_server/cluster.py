"""Cluster tools (upstream's tools/cluster.rs): brokers, leader, balance, rebalance, unload,
activate, namespaces and the Raft membership calls, with upstream's text answers."""

from typing import Annotated, Optional

from pydantic import Field

from danube.proto import DanubeAdmin_pb2 as adm

from danube.mcp_server.context import Failed, ToolContext, text_tool

BROKER_ID = Field(description="Broker ID; list_brokers shows them. Example: "
                              "\"4541396853251852833\"")
NAMESPACE = Field(description="Namespace name; list_namespaces shows them. The \"default\" "
                              "namespace is always present. Example: \"production\"")


def balance_status(cv):
    if cv < 0.2:
        return "✓ Well Balanced"
    if cv < 0.3:
        return "✓ Balanced"
    if cv < 0.4:
        return "⚠ Imbalanced"
    return "✗ Severely Imbalanced"


def register(mcp, ctx):
    call = ctx.call

    @text_tool(mcp)
    async def list_brokers() -> str:
        """List all brokers in the cluster: ID, status (active/draining/drained), role
        (leader/follower) and the broker, admin and metrics addresses. Use it first to find
        the broker IDs other tools take."""
        resp = await call("BrokerAdmin", "ListBrokers", doing="listing brokers")
        if not resp.brokers:
            return "No brokers found in the cluster."
        out = f"Found {len(resp.brokers)} broker(s):\n\n"
        for b in resp.brokers:
            out += (f"Broker ID: {b.broker_id}\nStatus: {b.broker_status}\n"
                    f"Role: {b.broker_role}\nAddress: {b.broker_addr}\n"
                    f"Admin: {b.admin_addr}\nMetrics: {b.metrics_addr}\n\n")
        return out

    @text_tool(mcp)
    async def get_leader() -> str:
        """Get the broker that leads the cluster (coordination, metadata, load balancing).
        For the consensus details use cluster_status."""
        resp = await call("BrokerAdmin", "GetLeaderBroker", doing="getting leader")
        return f"Current leader broker: {resp.leader}"

    @text_tool(mcp)
    async def get_cluster_balance() -> str:
        """Get the cluster's load balance: coefficient of variation (CV), mean/max/min load
        and each broker's topic count. CV below 20% is well balanced, above 40% severely
        imbalanced. Run before and after trigger_rebalance."""
        r = await call("BrokerAdmin", "GetClusterBalance", adm.ClusterBalanceRequest(),
                       doing="getting cluster balance")
        cv = r.coefficient_of_variation
        out = ("Cluster Balance Metrics:\n\n"
               f"Status: {balance_status(cv)}\nCoefficient of Variation: {cv:.4f}\n"
               f"Assignment Strategy: {r.assignment_strategy}\nMean Load: {r.mean_load:.2f}\n"
               f"Max Load: {r.max_load:.2f}\nMin Load: {r.min_load:.2f}\n"
               f"Std Deviation: {r.std_deviation:.2f}\nActive Brokers: {r.broker_count}\n\n")
        if r.brokers:
            out += "Broker Load Distribution:\n"
            for b in r.brokers:
                state = "⚠ OVERLOADED" if b.is_overloaded else \
                    "↓ UNDERLOADED" if b.is_underloaded else "✓ OK"
                out += (f"  Broker {b.broker_id}: {b.load:.2f} load ({b.topic_count} topics) "
                        f"- {state}\n")
        if cv >= 0.3:
            out += "\nRecommendation: Consider running 'trigger_rebalance' to improve balance.\n"
        return out

    @text_tool(mcp)
    async def trigger_rebalance(
            dry_run: Annotated[bool, Field(description="Preview the moves without making "
                                                       "them. Default: false")] = False,
            max_moves: Annotated[Optional[int], Field(ge=0, le=2 ** 32 - 1, description=(
                "Most topic moves to make this time; all needed moves when unset. "
                "Example: 10"))] = None) -> str:
        """Move topics between brokers to even the load (gracefully: no message loss).
        Use dry_run=true first to preview which topics would move; run when
        get_cluster_balance shows CV above 30%."""
        req = adm.RebalanceRequest(dry_run=dry_run)
        if max_moves is not None:
            req.max_moves = max_moves
        r = await call("BrokerAdmin", "TriggerRebalance", req, doing="triggering rebalance")
        if not r.success:
            return f"Rebalancing failed: {r.error_message}"
        if dry_run:
            out = "DRY RUN - No changes were made\n\n"
        elif len(r.proposed_moves) > 1:
            out = ("Rebalancing started in background!\n"
                   "First move initiated, remaining moves will execute automatically.\n\n")
        elif r.moves_executed > 0:
            out = "Rebalancing completed!\n\n"
        else:
            out = "Cluster is already balanced.\n\n"
        out += f"Moves initiated: {r.moves_executed}\nTotal proposed: {len(r.proposed_moves)}\n\n"
        if r.proposed_moves:
            out += "Topic movements:\n"
            for i, m in enumerate(r.proposed_moves, 1):
                out += (f"  {i}. {m.topic_name} (broker {m.from_broker} -> broker "
                        f"{m.to_broker})\n     Reason: {m.reason}\n"
                        f"     Est. load: {m.estimated_load:.2f}\n")
        return out

    @text_tool(mcp)
    async def unload_broker(
            broker_id: Annotated[str, BROKER_ID],
            max_parallel: Annotated[int, Field(ge=0, le=2 ** 32 - 1, description=(
                "Topics unloaded at once. Default: 1"))] = 1,
            dry_run: Annotated[bool, Field(description="Preview the topics that would be "
                                                       "unloaded. Default: false")] = False
    ) -> str:
        """Unload every topic of a broker (before maintenance or removal): its topics move to
        other brokers and it owns none afterwards. Use dry_run=true first."""
        r = await call("BrokerAdmin", "UnloadBroker", adm.UnloadBrokerRequest(
            broker_id=broker_id, max_parallel=max_parallel, dry_run=dry_run,
            timeout_seconds=60), doing="unloading broker")
        out = "DRY RUN - No topics were actually unloaded\n\n" if dry_run else ""
        out += (f"Unload Results for Broker {broker_id}:\nTotal topics: {r.total}\n"
                f"Succeeded: {r.succeeded}\nFailed: {r.failed}\nPending: {r.pending}\n")
        if r.failed_topics:
            out += "\nFailed topics:\n" + "".join(f"  - {t}\n" for t in r.failed_topics)
        return out

    @text_tool(mcp)
    async def list_namespaces() -> str:
        """List every namespace of the cluster (the 'default' namespace is always there)."""
        r = await call("BrokerAdmin", "ListNamespaces", doing="listing namespaces")
        if not r.namespaces:
            return "No namespaces found."
        return f"Found {len(r.namespaces)} namespace(s):\n\n" + "".join(
            f"  {i}. {ns}\n" for i, ns in enumerate(r.namespaces, 1))

    @text_tool(mcp)
    async def activate_broker(
            broker_id: Annotated[str, BROKER_ID],
            reason: Annotated[str, Field(description="Why, for the audit trail. Default: "
                                                     "\"admin_activate\"")] = "admin_activate"
    ) -> str:
        """Bring a drained broker back into service, so it gets topics again."""
        r = await call("BrokerAdmin", "ActivateBroker", adm.ActivateBrokerRequest(
            broker_id=broker_id, reason=reason), doing="activating broker")
        return (f"✓ Successfully activated broker '{broker_id}'" if r.success
                else f"✗ Failed to activate broker '{broker_id}'")

    @text_tool(mcp)
    async def get_namespace_policies(namespace: Annotated[str, NAMESPACE]) -> str:
        """Get a namespace's policies (producer/consumer limits, rates, message size)."""
        r = await call("NamespaceAdmin", "GetNamespacePolicies",
                       adm.NamespaceRequest(name=namespace),
                       doing="getting namespace policies")
        return f"Policies for namespace '{namespace}':\n\n{r.policies}"

    @text_tool(mcp)
    async def create_namespace(namespace: Annotated[str, NAMESPACE]) -> str:
        """Create a namespace, to keep topics and their policies apart."""
        r = await call("NamespaceAdmin", "CreateNamespace", adm.NamespaceRequest(name=namespace),
                       doing="creating namespace")
        return (f"✓ Successfully created namespace '{namespace}'" if r.success
                else f"✗ Failed to create namespace '{namespace}'")

    @text_tool(mcp)
    async def delete_namespace(namespace: Annotated[str, NAMESPACE]) -> str:
        """Delete an empty namespace (it must hold no topics)."""
        r = await call("NamespaceAdmin", "DeleteNamespace", adm.NamespaceRequest(name=namespace),
                       doing="deleting namespace")
        return (f"✓ Successfully deleted namespace '{namespace}'" if r.success else
                f"✗ Failed to delete namespace '{namespace}'. Note: namespace must be empty "
                "(no topics).")

    @text_tool(mcp)
    async def cluster_status() -> str:
        """Get the cluster's consensus state: leader node, term, last applied index, voters
        and learners."""
        s = await call("ClusterAdmin", "ClusterStatus", doing="getting cluster status")
        voters = ", ".join(str(v) for v in s.voters)
        learners = ", ".join(str(v) for v in s.learners) or "none"
        leader = str(s.leader_id) if s.leader_id else "none (election in progress)"
        return ("Raft Cluster Status:\n\n"
                f"Self Node ID:  {s.self_node_id}\nRaft Address:  {s.raft_addr}\n"
                f"Leader:        {leader}\nTerm:          {s.current_term}\n"
                f"Last Applied:  {s.last_applied}\n"
                f"Voters:        [{voters}] ({len(s.voters)} node(s))\n"
                f"Learners:      [{learners}]")

    @text_tool(mcp)
    async def add_cluster_node(node_addr: Annotated[str, Field(description=(
            "Admin endpoint of the new broker. Example: \"http://new-broker:50054\""))]) -> str:
        """Add a running broker to the cluster as a non-voting learner (then
        promote_cluster_node, activate_broker, trigger_rebalance)."""
        from danube.client.admin import AdminClient
        try:
            probe = AdminClient(node_addr, timeout=5.0)
        except Exception as exc:
            raise Failed(f"Error connecting to new node at {node_addr}: {exc}") from None
        try:
            status = await ToolContext(probe, None, None).call(
                "ClusterAdmin", "ClusterStatus",
                doing=f"discovering node identity at {node_addr}")
        finally:
            await probe.close()
        r = await call("ClusterAdmin", "AddNode", adm.AddNodeRequest(
            addr=status.raft_addr, node_id=status.self_node_id), doing="adding node")
        if not r.success:
            return f"✗ Failed to add node: {r.message}"
        return ("✓ Node added as Raft learner\n\n"
                f"Node ID:     {status.self_node_id}\nRaft Addr:   {status.raft_addr}\n"
                f"Source:      {node_addr}\n\nNext step: Use promote_cluster_node with "
                f"node_id={status.self_node_id} to make it a voter.")

    @text_tool(mcp)
    async def promote_cluster_node(node_id: Annotated[int, Field(ge=0, le=2 ** 64 - 1,
                                                                 description=(
            "Node ID of the learner; cluster_status shows them."))]) -> str:
        """Promote a learner to a voting member (changes the quorum size)."""
        r = await call("ClusterAdmin", "PromoteNode", adm.PromoteNodeRequest(node_id=node_id),
                       doing="promoting node")
        return (f"✓ Node {node_id} promoted to voter\n\n{r.message}" if r.success
                else f"✗ Failed to promote node: {r.message}")

    @text_tool(mcp)
    async def remove_cluster_node(node_id: Annotated[int, Field(ge=0, le=2 ** 64 - 1,
                                                                description=(
            "Node ID to remove; cluster_status shows them."))]) -> str:
        """Remove a node from the cluster's membership (destructive; unload_broker first)."""
        r = await call("ClusterAdmin", "RemoveNode", adm.RemoveNodeRequest(node_id=node_id),
                       doing="removing node")
        return (f"✓ Node {node_id} removed from cluster\n\n{r.message}" if r.success
                else f"✗ Failed to remove node: {r.message}")
