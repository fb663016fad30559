"""The MCP server's resource (upstream's `danube://metrics` catalog) and prompts (upstream's
four workflows: cluster_health_check, prepare_cluster_rebalance, manage_schema_evolution,
secure_cluster_setup, with their arguments). The texts are written here for this broker."""

from typing import Optional

from pydantic import Field

METRICS_URI = "danube://metrics"

CATALOG = """# Danube Prometheus metrics

The names a broker exports on its metrics port (prometheus.metrics_addr), for PromQL with
query_prometheus. Upstream labels every series with `broker` (the broker ID); counters end
in `_total`.

## Broker
- danube_broker_rpc_total (method, code): gRPC calls finished
- danube_broker_topics_owned: topics served by the broker
- danube_leader_election_state: 1 on the cluster leader
- danube_cluster_imbalance_cv: the leader's load imbalance (coefficient of variation)

## Topics
- danube_topic_messages_in_total (topic): messages published
- danube_topic_bytes_in_total (topic): payload bytes published
- danube_topic_message_size_bytes (topic): histogram of message sizes
- danube_topic_active_producers / _consumers / _subscriptions (topic)
- danube_producer_send_total (topic, producer, result, error_code)
- danube_producer_send_latency_ms (topic): send latency

## Consumers and subscriptions
- danube_consumer_messages_out_total, danube_consumer_bytes_out_total (topic, subscription,
  consumer)
- danube_subscription_active_consumers, danube_subscription_lag_messages (topic,
  subscription)
- danube_subscription_redelivery_total, _nack_total, _ack_timeout_total, _dlq_total

## Storage
- danube_wal_append_total, danube_wal_append_bytes_total, danube_wal_flush_total,
  danube_wal_flush_latency_ms
- danube_cloud_upload_bytes_total, danube_cloud_upload_objects_total (result)

## Example queries
- sum(rate(danube_topic_messages_in_total[5m])): messages per second into the cluster
- sum by (topic) (danube_subscription_lag_messages): backlog per topic
- sum by (code) (rate(danube_broker_rpc_total[5m])): calls by status
"""


def _health():
    return """Assess the Danube cluster's health, step by step, and report what you find:

1. health_check: brokers, leader, balance, namespaces.
2. list_brokers: every broker should be `active`; note any draining or drained one.
3. cluster_status: the consensus view (leader, term, voters, learners).
4. get_cluster_balance: the coefficient of variation; above 0.3 is imbalanced.
5. get_cluster_metrics (needs Prometheus): rates in and out, producers and consumers.
6. list_roles and list_bindings with scope "cluster": who can administer the cluster.

Finish with a short summary: healthy or not, each issue with the tool that fixes it
(trigger_rebalance, activate_broker, unload_broker), most urgent first."""


def _rebalance(max_moves=None):
    limit = f" with max_moves={max_moves}" if max_moves else ""
    return f"""Rebalance the cluster's topics safely:

1. get_cluster_balance: record the coefficient of variation and each broker's load.
   Below 0.2 there is nothing to do: say so and stop.
2. list_brokers: every broker that should take topics must be `active`
   (activate_broker otherwise).
3. trigger_rebalance with dry_run=true{limit}: show the proposed moves and ask before
   going on.
4. trigger_rebalance with dry_run=false{limit}.
5. get_cluster_balance again: compare the coefficient of variation with step 1 and report
   the topics that moved."""


def _schema(subject, schema_type=None):
    kind = f" of type {schema_type}" if schema_type else ""
    return f"""Evolve the schema subject '{subject}'{kind} without breaking its producers or
consumers:

1. get_schema and list_schema_versions for '{subject}': the current definition and history.
2. get_schema_compatibility_mode: what changes the mode allows (BACKWARD: new readers read
   old data; FORWARD: old readers read new data; FULL: both; NONE: no check).
3. Draft the new definition, then check_schema_compatibility with it. If incompatible,
   explain each error and revise; do not lower the mode to get past it unless asked.
4. register_schema with the new definition and a description of the change.
5. For each topic using the subject (describe_topic, get_topic_schema_config), say whether
   its validation policy (none, warn, enforce) needs a change."""


def _secure(environment=None):
    env = (environment or "production").lower()
    tls = "skip TLS for development" if env == "development" else \
        "require TLS (auth.mode: tls with certificate, key and CA files)"
    return f"""Secure the Danube cluster for {env}:

1. Broker configuration: {tls}; set auth.jwt.secret_key (at least 32 bytes) and issuer.
2. list_roles: the built-in roles; create_role for each application's needs with the
   fewest permissions (e.g. "Produce,Lookup" for a producer, "Consume,Lookup" for a
   consumer).
3. create_binding for each service account at the narrowest scope (topic, then namespace,
   then cluster); list_bindings to check.
4. create_token for each service account with a TTL that matches your rotation period;
   validate_token to check one.
5. Summarize the principals, their roles and scopes, and how the tokens are rotated."""


def register(mcp):
    @mcp.resource(METRICS_URI, name="danube-metrics", title="Danube Prometheus Metrics Catalog",
                  description="The Prometheus metrics of Danube brokers with their labels, "
                              "for custom PromQL queries.", mime_type="text/plain")
    def metrics_catalog() -> str:
        return CATALOG

    mcp.prompt(name="cluster_health_check", title="Cluster Health Check",
               description="Assess the cluster's health: consensus, load balance, brokers "
                           "and security.")(_health)

    def prepare_cluster_rebalance(max_moves: Optional[str] = Field(
            default=None, description="Most topic moves to make (optional)")) -> str:
        return _rebalance(max_moves)
    mcp.prompt(name="prepare_cluster_rebalance", title="Prepare Cluster Rebalance",
               description="Rebalance the cluster's load with a dry run first and a check "
                           "after.")(prepare_cluster_rebalance)

    def manage_schema_evolution(
            subject: str = Field(description="Schema subject name to evolve"),
            schema_type: Optional[str] = Field(default=None, description=(
                "json_schema, avro, protobuf, string or bytes (optional)"))) -> str:
        return _schema(subject, schema_type)
    mcp.prompt(name="manage_schema_evolution", title="Manage Schema Evolution",
               description="Evolve a schema safely, checking compatibility and the topics "
                           "that use it.")(manage_schema_evolution)

    def secure_cluster_setup(environment: Optional[str] = Field(default=None, description=(
            "'development' (no TLS) or 'production' (full security). Default: production"))
    ) -> str:
        return _secure(environment)
    mcp.prompt(name="secure_cluster_setup", title="Secure Cluster Setup",
               description="Secure a cluster end to end: TLS, JWT tokens, roles and "
                           "bindings.")(secure_cluster_setup)
