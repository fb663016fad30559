"""Diagnostic tools (upstream's tools/diagnostics.rs): consumer lag facts, a health check
and recommendations, each from the admin API's answers."""

from typing import Annotated

from pydantic import Field

from danube.client import errors as client_errors
from danube.proto import DanubeAdmin_pb2 as adm

from danube.mcp_server.cluster import balance_status
from danube.mcp_server.context import text_tool


def register(mcp, ctx):
    admin = ctx.admin

    async def attempt(service, method, request=None):
        try:
            return await admin.call(service, method, request), None
        except client_errors.DanubeError as exc:
            return None, exc

    @text_tool(mcp)
    async def analyze_consumer_lag(
            topic: Annotated[str, Field(description="Full topic name, \"/namespace/topic\".")],
            subscription: Annotated[str, Field(description="The subscription to look at.")]
    ) -> str:
        """Gather the facts behind a subscription's lag: the topic's broker and delivery,
        whether the subscription exists, the cluster's balance."""
        out = f"Consumer Lag Analysis:\nTopic: {topic}\nSubscription: {subscription}\n\n"
        info, err = await attempt("TopicAdmin", "DescribeTopic",
                                  adm.DescribeTopicRequest(name=topic))
        if err:
            out += f"✗ Error getting topic info: {err}\n\n"
        else:
            out += (f"Topic Info:\n- Broker: {info.broker_id}\n- Delivery: {info.delivery}\n"
                    f"- Subscriptions: {len(info.subscriptions)}\n\n")
            if subscription not in info.subscriptions:
                out += ("⚠ WARNING: Subscription not found on this topic!\n"
                        "This could explain why no messages are being consumed.\n\n")
        bal, err = await attempt("BrokerAdmin", "GetClusterBalance", adm.ClusterBalanceRequest())
        if err:
            out += f"✗ Error checking cluster balance: {err}\n\n"
        else:
            cv = bal.coefficient_of_variation
            status = "Severely Imbalanced" if cv > 0.4 else "Imbalanced" if cv > 0.3 else \
                "Slightly Imbalanced" if cv > 0.2 else "Well Balanced"
            out += f"Cluster Balance:\n- Coefficient of Variation: {cv:.4f}\n- Status: {status}\n\n"
        return out

    @text_tool(mcp)
    async def health_check() -> str:
        """Check the cluster's health: brokers and their status, the leader, the balance
        and the namespaces, with the issues found."""
        out, issues = "Danube Cluster Health Check:\n\n", []
        brokers, err = await attempt("BrokerAdmin", "ListBrokers")
        if err:
            out += "✗ Brokers: UNREACHABLE\n"
            issues.append(f"Cannot connect to cluster: {err}")
        else:
            out += f"✓ Brokers: {len(brokers.brokers)} active\n"
            if not brokers.brokers:
                issues.append("No brokers found - cluster is DOWN")
            issues += [f"Broker {b.broker_id} is not active: {b.broker_status}"
                       for b in brokers.brokers if b.broker_status != "active"]
        leader, err = await attempt("BrokerAdmin", "GetLeaderBroker")
        if err:
            out += "✗ Leader: UNKNOWN\n"
            issues.append("No leader elected - cluster may be in election")
        else:
            out += f"✓ Leader: {leader.leader}\n"
        bal, err = await attempt("BrokerAdmin", "GetClusterBalance", adm.ClusterBalanceRequest())
        if err:
            out += f"⚠ Balance: Unable to check - {err}\n"
        else:
            cv = bal.coefficient_of_variation
            out += f"{balance_status(cv)} (CoV: {cv:.4f})\n"
            if cv > 0.4:
                issues.append("Cluster is severely imbalanced - rebalancing recommended")
            elif cv > 0.3:
                issues.append("Cluster is imbalanced - consider rebalancing")
        ns, err = await attempt("BrokerAdmin", "ListNamespaces")
        out += "⚠ Namespaces: Unable to list\n" if err else \
            f"✓ Namespaces: {len(ns.namespaces)}\n"
        out += "\n"
        if not issues:
            return out + "Overall Status: ✓ HEALTHY\n"
        return out + "Overall Status: ⚠ ISSUES DETECTED\n\nIssues:\n" + "".join(
            f"  {i}. {issue}\n" for i, issue in enumerate(issues, 1))

    @text_tool(mcp)
    async def get_recommendations() -> str:
        """Suggest what to do about the cluster's state (imbalance, overloaded brokers,
        too few brokers for high availability), naming the tools to use."""
        recs = []
        bal, err = await attempt("BrokerAdmin", "GetClusterBalance", adm.ClusterBalanceRequest())
        if not err:
            cv = bal.coefficient_of_variation
            if cv > 0.3:
                recs.append(("High Priority", "Cluster Load Imbalance",
                             f"Coefficient of variation is {cv:.2f}. Run 'trigger_rebalance' "
                             "with dry_run=true to preview rebalancing."))
            recs += [("High Priority", f"Broker {b.broker_id} Overloaded",
                      f"Broker has load of {b.load:.2f} with {b.topic_count} topics. Consider "
                      "unloading some topics or adding more brokers.")
                     for b in bal.brokers if b.is_overloaded]
        brokers, err = await attempt("BrokerAdmin", "ListBrokers")
        if not err:
            active = sum(1 for b in brokers.brokers if b.broker_status == "active")
            if active == 1:
                recs.append(("High Priority", "Single Broker - No High Availability",
                             "Only 1 active broker. Cluster has no fault tolerance. Any broker "
                             "failure will cause downtime."))
            elif active == 2:
                recs.append(("Medium Priority", "Low Broker Count",
                             "Only 2 active brokers. For production use with proper HA, "
                             "consider running at least 3 brokers."))
        out = "Cluster Optimization Recommendations:\n\n"
        if not recs:
            return out + ("✓ No optimization recommendations at this time.\n"
                          "Your cluster appears to be running optimally.\n")
        return out + "".join(f"{i}. [{p}] {c}\n   {r}\n\n"
                             for i, (p, c, r) in enumerate(recs, 1))
