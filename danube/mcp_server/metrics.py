"""Metrics tools (upstream's tools/metrics.rs): cluster, broker and topic summaries from
Prometheus, and a raw PromQL query."""

from typing import Annotated

from pydantic import Field

from danube.mcp_server.context import text_tool


def _errors(errors):
    if not errors:
        return ""
    return "\n--- Errors ---\n" + "".join(f"  - {e}\n" for e in errors)


def register(mcp, ctx):
    q = ctx.queries

    @text_tool(mcp)
    async def get_cluster_metrics() -> str:
        """Cluster-wide figures from Prometheus: brokers, topics, producers, consumers,
        subscriptions, message and byte rates (1 minute), imbalance CV."""
        m, errors = await q.cluster_metrics()
        return ("=== Cluster Metrics ===\n\n"
                f"Brokers:        {m['broker_count']}\nTopics:         {m['topics_total']}\n"
                f"Producers:      {m['producers_total']}\n"
                f"Consumers:      {m['consumers_total']}\n"
                f"Subscriptions:  {m['subscriptions_total']}\n"
                "\n--- Throughput (1m avg) ---\n"
                f"Messages In:    {m['messages_in_rate']:.2f} msg/s\n"
                f"Messages Out:   {m['messages_out_rate']:.2f} msg/s\n"
                f"Bytes In:       {m['bytes_in_rate']:.2f} B/s\n"
                f"Bytes Out:      {m['bytes_out_rate']:.2f} B/s\n"
                "\n--- Balance ---\n"
                f"Imbalance CV:   {m['imbalance_cv']:.4f} (lower is better, 0 = perfect)\n"
                + _errors(errors))

    @text_tool(mcp)
    async def get_broker_metrics(broker_id: Annotated[str, Field(description=(
            "Broker ID, as the `broker` label of the metrics; list_brokers shows them."))]
    ) -> str:
        """One broker's figures from Prometheus: topics owned, RPCs, producers, consumers,
        bytes in and out."""
        m, errors = await q.broker_metrics(broker_id)
        return (f"=== Broker {broker_id} Metrics ===\n\n"
                f"Topics Owned:   {m['topics_owned']}\nRPC Total:      {m['rpc_total']}\n"
                f"Producers:      {m['producers']}\nConsumers:      {m['consumers']}\n"
                f"Bytes In:       {m['bytes_in_total']} bytes\n"
                f"Bytes Out:      {m['bytes_out_total']} bytes\n" + _errors(errors))

    @text_tool(mcp)
    async def get_topic_metrics(topic: Annotated[str, Field(description=(
            "Full topic name, \"/namespace/topic\", as the `topic` label."))]) -> str:
        """One topic's figures from Prometheus: messages and bytes in and out, producers,
        consumers, subscriptions, rates, lag and send latency percentiles."""
        m, errors = await q.topic_metrics(topic)
        return (f"=== Topic {topic} Metrics ===\n\n--- Counters ---\n"
                f"Messages In:    {m['messages_in_total']}\n"
                f"Messages Out:   {m['messages_out_total']}\n"
                f"Bytes In:       {m['bytes_in_total']} bytes\n"
                f"Bytes Out:      {m['bytes_out_total']} bytes\n"
                "\n--- Active Entities ---\n"
                f"Producers:      {m['producers']}\nConsumers:      {m['consumers']}\n"
                f"Subscriptions:  {m['subscriptions']}\n"
                "\n--- Rates (1m avg) ---\n"
                f"Publish Rate:   {m['publish_rate_1m']:.2f} msg/s\n"
                f"Dispatch Rate:  {m['dispatch_rate_1m']:.2f} msg/s\n"
                "\n--- Consumer Lag ---\n"
                f"Total Lag:      {m['subscription_lag']} messages\n"
                "\n--- Latency (p50/p95/p99) ---\n"
                f"Send Latency:   {m['latency_p50_ms']:.2f} / {m['latency_p95_ms']:.2f} / "
                f"{m['latency_p99_ms']:.2f} ms\n" + _errors(errors))

    @text_tool(mcp)
    async def query_prometheus(query: Annotated[str, Field(description=(
            "A PromQL query. Example: \"sum(rate(danube_topic_messages_in_total[5m]))\""))]
    ) -> str:
        """Run any PromQL query against Prometheus and show each sample."""
        try:
            return await q.raw(query)
        except Exception as exc:
            return f"Query failed: {exc}"
