"""`danube admin serve --mode mcp`: upstream danube-admin's MCP server, driven by the MCP
Python SDK's own client over standard input/output (upstream's transport) against a live
broker and a real Prometheus scraping it: the tool list and each tool's arguments are
upstream's, the tools act on the broker and answer with upstream's text, the resource and
the prompts are there, arguments out of range are refused, the config file's log access
works, and --mode all serves the HTTP API and the MCP server together."""

import asyncio
import contextlib
import json
import sys
import uuid

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from admin_serve import LISTENING
from prometheus_broker import broker, broker_id, prometheus  # noqa: F401 - fixtures
from waiting import async_wait_for

# upstream's tools (danube-admin/src/mcp/server.rs) and their arguments: (required, optional)
UPSTREAM_TOOLS = {
    "list_brokers": ((), ()), "get_leader": ((), ()), "get_cluster_balance": ((), ()),
    "trigger_rebalance": ((), ("dry_run", "max_moves")),
    "unload_broker": (("broker_id",), ("max_parallel", "dry_run")),
    "list_namespaces": ((), ()),
    "activate_broker": (("broker_id",), ("reason",)),
    "get_namespace_policies": (("namespace",), ()),
    "create_namespace": (("namespace",), ()), "delete_namespace": (("namespace",), ()),
    "cluster_status": ((), ()), "add_cluster_node": (("node_addr",), ()),
    "promote_cluster_node": (("node_id",), ()), "remove_cluster_node": (("node_id",), ()),
    "list_topics": ((), ("namespace", "broker")),
    "describe_topic": (("topic",), ()),
    "create_topic": (("name",), ("partitions", "dispatch_strategy", "schema_subject")),
    "delete_topic": (("topic",), ()), "list_subscriptions": (("topic",), ()),
    "unsubscribe": (("topic", "subscription"), ()), "unload_topic": (("topic",), ()),
    "configure_topic_schema": (("topic", "schema_subject"),
                               ("validation_policy", "enable_payload_validation")),
    "set_topic_validation_policy": (("topic", "policy"), ("enable_payload_validation",)),
    "get_topic_schema_config": (("topic",), ()),
    "register_schema": (("subject", "schema_type", "schema_definition"), ("description",)),
    "get_schema": (("subject",), ()), "list_schema_versions": (("subject",), ()),
    "check_schema_compatibility": (("subject", "schema_type", "schema_definition"), ()),
    "get_schema_compatibility_mode": (("subject",), ()),
    "set_schema_compatibility_mode": (("subject", "mode"), ()),
    "delete_schema_version": (("subject", "version"), ()),
    "list_subjects": ((), ()), "get_schema_by_id": (("schema_id",), ("version",)),
    "set_subscription_failure_policy": (
        ("topic", "subscription", "max_redelivery_count", "ack_timeout_ms",
         "base_redelivery_delay_ms", "max_redelivery_delay_ms", "poison_policy"),
        ("backoff_strategy", "dead_letter_topic")),
    "get_subscription_failure_policy": (("topic", "subscription"), ()),
    "create_role": (("name", "permissions"), ()), "get_role": (("name",), ()),
    "list_roles": ((), ()), "delete_role": (("name",), ()),
    "create_binding": (("id", "principal_type", "principal_name", "roles", "scope"),
                       ("resource",)),
    "get_binding": (("id", "scope"), ("resource",)),
    "list_bindings": (("scope",), ("resource",)),
    "delete_binding": (("id", "scope"), ("resource",)),
    "create_token": (("subject", "secret_key"), ("ttl", "principal_type", "issuer")),
    "validate_token": (("token", "secret_key"), ()),
    "analyze_consumer_lag": (("topic", "subscription"), ()),
    "health_check": ((), ()), "get_recommendations": ((), ()),
    "get_broker_logs": (("broker_id",), ("lines",)),
    "list_configured_brokers": ((), ()), "list_docker_containers": ((), ()),
    "list_k8s_pods": (("namespace",), ()),
    "fetch_container_logs": (("container_name",), ("lines",)),
    "fetch_pod_logs": (("namespace", "pod_name"), ("lines",)),
    "get_cluster_metrics": ((), ()), "get_broker_metrics": (("broker_id",), ()),
    "get_topic_metrics": (("topic",), ()), "query_prometheus": (("query",), ()),
}
UPSTREAM_PROMPTS = {"cluster_health_check": [], "prepare_cluster_rebalance": ["max_moves"],
                    "manage_schema_evolution": ["subject", "schema_type"],
                    "secure_cluster_setup": ["environment"]}


@contextlib.asynccontextmanager
async def mcp_session(*args):
    params = StdioServerParameters(
        command=sys.executable, args=["-P", "-m", "danube", "admin", "serve", *args])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def session_on(broker, prometheus=None, *more):
    prom = prometheus.url if prometheus else "http://127.0.0.1:9"
    return mcp_session("--mode", "mcp", "--broker-endpoint", f"http://{broker.admin_addr}",
                       "--prometheus-url", prom, *more)


async def text(session, tool, **arguments):
    result = await session.call_tool(tool, arguments)
    assert not result.isError, result.content
    (content,) = result.content
    return content.text


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_upstreams_tools_arguments_prompts_and_resource(broker):
    async with session_on(broker) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert set(tools) == set(UPSTREAM_TOOLS)
        for name, (required, optional) in UPSTREAM_TOOLS.items():
            schema = tools[name].inputSchema
            assert set(schema.get("properties", {})) == set(required) | set(optional), name
            assert set(schema.get("required", [])) == set(required), name
            assert tools[name].description, name
        prompts = {p.name: p for p in (await s.list_prompts()).prompts}
        assert {n: [a.name for a in p.arguments or []] for n, p in prompts.items()} == \
            UPSTREAM_PROMPTS
        assert [a.required for a in prompts["manage_schema_evolution"].arguments] == \
            [True, False]
        got = await s.get_prompt("manage_schema_evolution", {"subject": "orders"})
        assert "orders" in got.messages[0].content.text
        got = await s.get_prompt("prepare_cluster_rebalance", {"max_moves": "3"})
        assert "max_moves=3" in got.messages[0].content.text
        (resource,) = (await s.list_resources()).resources
        assert str(resource.uri) == "danube://metrics" and resource.name == "danube-metrics"
        read = await s.read_resource("danube://metrics")
        assert "danube_topic_messages_in_total" in read.contents[0].text


async def test_tools_operate_the_broker(broker, broker_id, client):
    ns = unique("mcpns")
    name = f"/{ns}/orders"
    async with session_on(broker) as s:
        out = await text(s, "list_brokers")
        assert out.startswith("Found 1 broker(s):") and f"Broker ID: {broker_id}" in out
        assert await text(s, "get_leader") == f"Current leader broker: {broker_id}"
        assert await text(s, "create_namespace", namespace=ns) == \
            f"✓ Successfully created namespace '{ns}'"
        out = await text(s, "list_namespaces")
        assert out.startswith("Found ") and f". {ns}\n" in out
        policies = await text(s, "get_namespace_policies", namespace=ns)
        assert policies.startswith(f"Policies for namespace '{ns}':")
        json.loads(policies.split("\n\n", 1)[1])
        assert await text(s, "create_topic", name=name, dispatch_strategy="reliable") == \
            f"Successfully created topic '{name}' (reliable)"
        out = await text(s, "create_topic", name=f"/{ns}/parts", partitions=2)
        assert out == f"Successfully created partitioned topic '/{ns}/parts' with 2 " \
                      "partitions (non_reliable)"
        out = await text(s, "list_topics", namespace=ns)
        assert out.startswith(f"Found 3 topic(s) in namespace '{ns}':")
        assert f"Topic: {name}\nBroker: {broker_id}\nDelivery: Reliable" in out
        assert await text(s, "list_topics") == \
            "Error: provide either 'namespace' or 'broker' parameter."
        assert name in await text(s, "list_topics", broker=broker_id)

        consumer = await client.subscribe(name, "c1", "audit", sub_type="shared")
        out = await text(s, "describe_topic", topic=name)
        assert out.startswith(f"Topic: {name}\n\nBroker ID: {broker_id}\nDelivery: Reliable")
        assert "Subscriptions (1):\n  1. audit" in out
        assert "  1. audit" in await text(s, "list_subscriptions", topic=name)
        out = await text(s, "set_subscription_failure_policy", topic=name,
                         subscription="audit", max_redelivery_count=4, ack_timeout_ms=20000,
                         base_redelivery_delay_ms=500, max_redelivery_delay_ms=8000,
                         backoff_strategy="exponential", poison_policy="drop")
        assert out == f"✓ Failure policy updated for topic '{name}' subscription 'audit'"
        out = await text(s, "get_subscription_failure_policy", topic=name,
                         subscription="audit")
        assert "Max Redelivery Count: 4" in out and "Backoff Strategy: exponential" in out
        assert "Poison Policy: drop" in out
        out = await text(s, "analyze_consumer_lag", topic=name, subscription="audit")
        assert "Subscriptions: 1" in out and "WARNING" not in out
        await consumer.close()
        assert await text(s, "unsubscribe", topic=name, subscription="audit") == \
            f"✓ Successfully deleted subscription 'audit' from topic '{name}'"

        # a broker's refusal is the tool's text, as upstream
        out = await text(s, "describe_topic", topic=f"/{ns}/missing")
        assert out.startswith("Error describing topic:") and "missing" in out

        assert "Overall Status" in await text(s, "health_check")
        assert "Single Broker - No High Availability" in await text(s, "get_recommendations")
        out = await text(s, "trigger_rebalance", dry_run=True)
        assert out.startswith("DRY RUN - No changes were made")
        assert "Coefficient of Variation" in await text(s, "get_cluster_balance")

        assert await text(s, "delete_topic", topic=name) == \
            f"Successfully deleted topic '{name}'"


async def test_schema_tools(broker):
    subject = unique("events")
    v1 = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}})
    v2 = json.dumps({"type": "object", "properties": {"id": {"type": "integer"},
                                                      "at": {"type": "string"}}})
    async with session_on(broker) as s:
        out = await text(s, "register_schema", subject=subject, schema_type="json_schema",
                         schema_definition=v1, description="first")
        assert out.startswith(f"Schema '{subject}' - New version registered\nSchema ID: ")
        assert "Version: 1" in out
        schema_id = int(out.split("Schema ID: ")[1].split("\n")[0])
        out = await text(s, "check_schema_compatibility", subject=subject,
                         schema_type="json_schema", schema_definition=v2)
        assert out == f"✓ Schema is COMPATIBLE with subject '{subject}'"
        await text(s, "register_schema", subject=subject, schema_type="json_schema",
                   schema_definition=v2)
        out = await text(s, "get_schema", subject=subject)
        assert f"Schema Subject: {subject}\nSchema ID: {schema_id}\nVersion: 2" in out
        out = await text(s, "list_schema_versions", subject=subject)
        assert out.startswith(f"Found 2 version(s) for schema '{subject}':")
        assert f"Subject: {subject}" in await text(s, "list_subjects")
        assert "Version: 1" in await text(s, "get_schema_by_id", schema_id=schema_id, version=1)
        out = await text(s, "set_schema_compatibility_mode", subject=subject, mode="full")
        assert out == f"✓ Compatibility mode set for subject '{subject}'\n  Mode: FULL"
        assert (await text(s, "get_schema_compatibility_mode", subject=subject)).endswith(
            "Mode: FULL")
        topic = f"/default/{unique('typed')}"
        await text(s, "create_topic", name=topic)
        out = await text(s, "configure_topic_schema", topic=topic, schema_subject=subject,
                         validation_policy="enforce")
        assert out.startswith(f"✓ Schema configuration set for topic '{topic}'")
        out = await text(s, "get_topic_schema_config", topic=topic)
        assert f"Subject: {subject}" in out and "Policy: ENFORCE" in out
        out = await text(s, "set_topic_validation_policy", topic=topic, policy="warn")
        assert "Policy: WARN" in out
        assert await text(s, "delete_schema_version", subject=subject, version=1) == \
            f"✓ Successfully deleted version 1 of schema '{subject}'"


async def test_security_and_token_tools(broker):
    role = unique("producer")
    async with session_on(broker) as s:
        assert await text(s, "create_role", name=role, permissions="Produce, Lookup") == \
            f"✓ Role '{role}' created successfully"
        assert await text(s, "get_role", name=role) == \
            f"Role: {role}\n  Permissions: Produce, Lookup\n"
        assert f"Role: {role}" in await text(s, "list_roles")
        out = await text(s, "create_binding", id=role + "-b", principal_type="service_account",
                         principal_name="app", roles=role, scope="namespace",
                         resource="default")
        assert out == f"✓ Binding '{role}-b' created successfully"
        out = await text(s, "get_binding", id=role + "-b", scope="namespace",
                         resource="default")
        assert out == (f"Binding: {role}-b\n  Principal: service_account:app\n"
                       f"  Roles: {role}\n  Scope: namespace (default)\n")
        assert role + "-b" in await text(s, "list_bindings", scope="namespace",
                                         resource="default")
        assert await text(s, "delete_binding", id=role + "-b", scope="namespace",
                          resource="default") == f"✓ Binding '{role}-b' deleted successfully"
        assert await text(s, "delete_role", name=role) == \
            f"✓ Role '{role}' deleted successfully"

        secret = "s" * 32
        out = await text(s, "create_token", subject="app", secret_key=secret, ttl="48h")
        assert out.startswith("✓ Token created successfully\nSubject: app\n"
                              "Principal Type: service_account\n")
        token = out.rsplit("\n", 1)[1]
        out = await text(s, "validate_token", token=token, secret_key=secret)
        assert out.startswith("✓ Token is valid\nSubject: app\n")
        assert "Issuer: danube-auth" in out and "Remaining: 1d 23h" in out
        out = await text(s, "validate_token", token=token, secret_key="t" * 32)
        assert out.startswith("✗ Token validation failed:")
        assert (await text(s, "create_token", subject="a", secret_key=secret,
                           ttl="soon")).startswith("Error: invalid TTL")


async def test_arguments_are_checked(broker):
    async with session_on(broker) as s:
        for tool, args in (("unload_broker", {"broker_id": "b", "max_parallel": -1}),
                           ("describe_topic", {}),
                           ("delete_schema_version", {"subject": "s", "version": 2 ** 32}),
                           ("get_broker_logs", {"broker_id": "b", "lines": -1})):
            result = await s.call_tool(tool, args)
            assert result.isError, (tool, result.content)


async def test_metrics_tools_read_prometheus(broker, broker_id, prometheus, client):
    name = f"/default/{unique('measured')}"
    producer = await client.create_producer(name, "p1")
    for i in range(5):
        await producer.send(b"x" * 10)
    await async_wait_for(lambda: prometheus.value(
        f'danube_topic_messages_in_total{{topic="{name}"}}') >= 5, timeout=30,
        what="prometheus sees the publishes")
    async with session_on(broker, prometheus) as s:
        out = await text(s, "get_topic_metrics", topic=name)
        assert out.startswith(f"=== Topic {name} Metrics ===")
        assert "Messages In:    5\n" in out and "Bytes In:       50 bytes" in out
        assert "Producers:      1\n" in out
        out = await text(s, "get_broker_metrics", broker_id=broker_id)
        assert out.startswith(f"=== Broker {broker_id} Metrics ===")
        rpc = int(out.split("RPC Total:")[1].split("\n")[0])
        assert rpc > 0 and "--- Errors ---" not in out
        out = await text(s, "get_cluster_metrics")
        assert "Topics:" in out and "--- Errors ---" not in out
        out = await text(s, "query_prometheus",
                         query=f'danube_topic_messages_in_total{{topic="{name}"}}')
        assert out.startswith("Query: ") and f'topic="{name}"' in out and "=> 5" in out
    await producer.close()
    async with session_on(broker) as s:           # nothing listens on its Prometheus URL
        out = await text(s, "get_topic_metrics", topic=name)
        assert "Messages In:    0\n" in out and "--- Errors ---" in out
        assert (await text(s, "query_prometheus", query="up")).startswith("Query failed:")


async def test_config_file_gives_log_access(broker, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "broker1.log").write_text("".join(f"line {i}\n" for i in range(12000)))
    config = tmp_path / "mcp-config.yml"
    config.write_text(f"broker_endpoint: http://{broker.admin_addr}\n"
                      "prometheus_url: http://127.0.0.1:9\n"
                      "deployment:\n  type: local\n  local:\n"
                      f"    log_dir: {logs}\n    brokers:\n"
                      "      - id: broker1\n        log_file: broker1.log\n")
    async with mcp_session("--mode", "mcp", "--config", str(config)) as s:
        assert "  - broker1 → broker1.log" in await text(s, "list_configured_brokers")
        out = await text(s, "get_broker_logs", broker_id="broker1", lines=3)
        assert out == "line 11997\nline 11998\nline 11999"
        # upstream's "implementation may cap": at most 10,000 lines
        out = await text(s, "get_broker_logs", broker_id="broker1", lines=50000)
        assert out.count("\n") == 9999 and out.startswith("line 2000\n")
        out = await text(s, "get_broker_logs", broker_id="broker9")
        assert out.startswith("Error: Broker 'broker9' not found in configuration.")
        assert "Found 1 broker(s)" in await text(s, "list_brokers")   # the file's endpoint
    async with session_on(broker) as s:
        assert (await text(s, "get_broker_logs", broker_id="broker1")).startswith(
            "Error: No deployment configuration provided.")


async def test_a_bad_config_file_is_refused_at_start(tmp_path):
    config = tmp_path / "bad.yml"
    config.write_text("broker_endpoint: http://127.0.0.1:1\ndeployment:\n  type: docker\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "danube", "admin", "serve", "--mode", "mcp", "--config",
        str(config), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and out == b""
    assert b"requires 'docker' configuration" in err


async def test_mode_all_serves_http_and_mcp(broker):
    async with mcp_session("--mode", "all", "--listen", "127.0.0.1:0", "--broker-endpoint",
                           f"http://{broker.admin_addr}") as s:
        assert "Found 1 broker(s)" in await text(s, "list_brokers")
    # the HTTP side's address goes to stderr (stdout is the protocol): start it again to read
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "danube", "admin", "serve", "--mode", "all", "--listen",
        "127.0.0.1:0", "--broker-endpoint", f"http://{broker.admin_addr}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        while not LISTENING.search(line.decode()):
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
        url = LISTENING.search(line.decode()).group(1)

        def health():
            import urllib.request
            with urllib.request.urlopen(url + "ui/v1/health", timeout=10) as r:
                return json.load(r)
        assert await asyncio.to_thread(health) == {"status": "ok", "leader_reachable": True}
    finally:
        proc.send_signal(2)
        await asyncio.wait_for(proc.wait(), 30)
