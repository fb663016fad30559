"""Upstream danube-admin's /ui/v1 JSON API (`danube admin serve --mode ui`), the API of
upstream's admin UI, checked endpoint by endpoint against a live broker and a real
Prometheus scraping it (--prometheus-url): upstream's paths, methods and answer shapes (the
field names and types of danube-admin/src/server/ui/*.rs), values that follow what was
published and consumed, its error statuses, and its CORS for a UI on another origin. A
second console without a reachable Prometheus shows upstream's behaviour then: the admin
API's data with zeros and the query errors listed."""

import asyncio
import json
import time
import urllib.parse
import uuid

import pytest

from admin_serve import AdminServe
from prometheus_broker import broker, broker_id, prometheus  # noqa: F401 - fixtures
from waiting import async_wait_for
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import SchemaRegistry_pb2 as sr


@pytest.fixture(scope="module")
def ui(broker, prometheus):
    s = AdminServe("--broker-endpoint", f"http://{broker.admin_addr}",
                   "--prometheus-url", prometheus.url, "--cache-ttl-ms", "0")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def ui_without_prometheus(broker):
    # port 9 (discard) on loopback: nothing listens, as when no Prometheus runs
    s = AdminServe("--broker-endpoint", f"http://{broker.admin_addr}",
                   "--prometheus-url", "http://127.0.0.1:9", "--cache-ttl-ms", "0")
    yield s
    assert s.stop() == 0


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def enc(topic):
    return urllib.parse.quote(topic, safe="")


async def get(ui, path, **kw):
    return await asyncio.to_thread(ui.get, path, **kw)


async def post(ui, path, body, **kw):
    return await asyncio.to_thread(ui.post, path, body, **kw)


def shape(value, expected, where="body"):
    """`value` has exactly the keys of `expected`, each of the type given there (a type, a
    tuple of types, a nested dict, or [item shape] for a list)."""
    if isinstance(expected, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        assert set(value) == set(expected), f"{where}: keys {sorted(value)} != {sorted(expected)}"
        for k, sub in expected.items():
            shape(value[k], sub, f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            shape(item, expected[0], f"{where}[{i}]")
    else:
        assert isinstance(value, expected) and not (
            isinstance(value, bool) and expected in (int, float, (int, float))), \
            f"{where}: {value!r} is not {expected}"


NUM = (int, float)
OPT_STR, OPT_INT = (str, type(None)), (int, type(None))
IDENTITY = {"broker_id": str, "broker_addr": str, "broker_role": str, "broker_status": str}
TOPIC_MINI = {"name": str, "delivery": str, "producers_connected": int,
              "consumers_connected": int, "subscriptions": int}
FAILURE_POLICY = {"max_redelivery_count": int, "ack_timeout_ms": int,
                  "base_redelivery_delay_ms": int, "max_redelivery_delay_ms": int,
                  "backoff_strategy": str, "dead_letter_topic": OPT_STR, "poison_policy": str}
RELIABLE = {"wal_append_total": int, "wal_append_bytes_total": int, "wal_flush_total": int,
            "wal_flush_latency_ms_p50": NUM, "wal_flush_latency_ms_p95": NUM,
            "wal_flush_latency_ms_p99": NUM, "cloud_upload_bytes_total": int,
            "cloud_upload_objects_total": int, "wal_fsync_total": int}
TOPIC_PAGE = {
    "timestamp": str, "errors": [str],
    "topic": {"name": str, "schema_subject": OPT_STR, "schema_id": OPT_INT,
              "schema_version": OPT_INT, "schema_type": OPT_STR, "compatibility_mode": OPT_STR,
              "subscriptions": [{"name": str, "subscription_type": str,
                                 "failure_policy": (dict, type(None))}]},
    "metrics": {"core": {"msg_in_total": int, "msg_out_total": int, "bytes_in_total": int,
                         "bytes_out_total": int},
                "active": {"producers": int, "consumers": int, "subscriptions": int},
                "rates": {"publish_rate_1m": NUM, "dispatch_rate_1m": NUM},
                "quality": {"send_ok_total": int, "send_error_total": int,
                            "send_error_by_code": list},
                "latency_size": {"send_latency_ms_p50": NUM, "send_latency_ms_p95": NUM,
                                 "send_latency_ms_p99": NUM, "msg_size_bytes_avg": NUM},
                "reliable": (dict, type(None))}}


async def test_health(ui):
    status, _, body = await get(ui, "/ui/v1/health")
    assert status == 200
    assert body == {"status": "ok", "leader_reachable": True}


async def test_health_of_an_unreachable_broker():
    s = AdminServe("--broker-endpoint", "http://127.0.0.1:9", "--request-timeout-ms", "2000")
    try:
        status, _, body = await get(s, "/ui/v1/health")
        assert (status, body) == (200, {"status": "ok", "leader_reachable": False})
        status, _, body = await get(s, "/ui/v1/cluster")
        assert status == 502 and body["code"] == "Unavailable", body
    finally:
        assert s.stop() == 0


async def test_cluster_brokers_and_topics_follow_traffic(ui, admin, client, broker_id,
                                                         prometheus):
    name = f"/default/{unique('traffic')}"
    await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
        name=name, dispatch_strategy=adm.Reliable))
    consumer = await client.subscribe(name, "c1", "audit", sub_type="shared")
    producer = await client.create_producer(name, "p1", reliable=True)
    # some before Prometheus first sees the topic and the rest after: a rate needs the
    # counter to move between two scrapes
    for i in range(10):
        await producer.send(b"payload-%02d" % i)
    await async_wait_for(lambda: prometheus.value(
        f'danube_topic_messages_in_total{{topic="{name}"}}') >= 10, timeout=30,
        what="prometheus sees the first publishes")
    for i in range(10, 30):
        await producer.send(b"payload-%02d" % i)
    received = 0
    while received < 30:
        msg = await consumer.receive(timeout=15)
        await consumer.ack(msg)
        received += 1
    # Prometheus has scraped the counters after the traffic
    await async_wait_for(lambda: prometheus.value(
        f'danube_consumer_messages_out_total{{topic="{name}"}}') >= 30, timeout=30,
        what="prometheus sees the deliveries")

    status, _, cluster = await get(ui, "/ui/v1/cluster")
    assert status == 200, cluster
    shape(cluster, {"timestamp": str, "errors": [str],
                    "brokers": [{**IDENTITY, "admin_addr": str, "stats": {
                        "topics_owned": int, "rpc_total": int, "active_connections": int,
                        "errors_5xx_total": int}}],
                    "totals": {"broker_count": int, "topics_total": int, "rpc_total": int,
                               "active_connections": int}})
    assert cluster["errors"] == []
    (b,) = cluster["brokers"]
    assert b["broker_id"] == broker_id and b["broker_role"] == "Cluster_Leader"
    assert b["broker_status"] == "active"
    assert b["stats"]["rpc_total"] > 30          # the sends and acks, through Prometheus
    assert b["stats"]["active_connections"] >= 2  # our producer and consumer
    assert cluster["totals"]["broker_count"] == 1
    assert cluster["totals"]["topics_total"] == b["stats"]["topics_owned"] >= 1

    status, _, topics = await get(ui, "/ui/v1/topics")
    assert status == 200
    shape(topics, {"timestamp": str, "errors": [str],
                   "brokers": [{"broker": IDENTITY, "topics": [TOPIC_MINI]}]})
    row = next(t for t in topics["brokers"][0]["topics"] if t["name"] == name)
    assert row == {"name": name, "delivery": "Reliable", "producers_connected": 1,
                   "consumers_connected": 1, "subscriptions": 1}
    names = [t["name"] for t in topics["brokers"][0]["topics"]]
    assert names == sorted(names)

    status, _, page = await get(ui, f"/ui/v1/brokers/{broker_id}")
    assert status == 200
    shape(page, {"timestamp": str, "errors": [str], "broker": IDENTITY, "topics": [TOPIC_MINI],
                 "metrics": {"rpc_total": int, "topics_owned": int, "inbound_bytes_total": int,
                             "outbound_bytes_total": int, "errors_5xx_total": int}})
    assert page["metrics"]["inbound_bytes_total"] >= 300
    assert page["metrics"]["outbound_bytes_total"] >= 300
    assert any(t["name"] == name for t in page["topics"])

    status, _, page = await get(ui, f"/ui/v1/topics/{enc(name)}")
    assert status == 200, page
    shape(page, TOPIC_PAGE)
    assert page["topic"]["name"] == name
    (sub,) = page["topic"]["subscriptions"]
    assert sub["name"] == "audit" and sub["subscription_type"] == "Shared"
    shape(sub["failure_policy"], FAILURE_POLICY, "failure_policy")
    core = page["metrics"]["core"]
    assert core["msg_in_total"] == 30 and core["msg_out_total"] >= 30
    assert core["bytes_in_total"] == 300
    assert page["metrics"]["active"] == {"producers": 1, "consumers": 1, "subscriptions": 1}

    async def reliable_figures():
        _, _, body = await get(ui, f"/ui/v1/topics/{enc(name)}")
        figures = body["metrics"]["reliable"]
        return figures if figures and figures["wal_append_total"] == 30 else None
    reliable = await async_wait_for(reliable_figures, timeout=30,
                                    what="the WAL figures of the 30 messages")
    shape(reliable, RELIABLE, "reliable")
    # upstream's server names it wal_flush_total, its admin UI reads wal_fsync_total
    assert reliable["wal_fsync_total"] == reliable["wal_flush_total"] > 0

    async def series_with_points():
        # a rate needs two scrapes of the topic's series inside its minute
        now = int(time.time())
        status, _, body = await get(
            ui, f"/ui/v1/topics/{enc(name)}/series?from={now - 300}&to={now}&step=1s")
        assert status == 200, body
        by_name = {s["name"]: s for s in body["series"]}
        points = by_name.get("publish_rate_1m", {}).get("points")
        return body if points and max(v for _, v in points) > 0 else None
    series = await async_wait_for(series_with_points, timeout=30,
                                  what="a publish rate in the series")
    now = int(time.time())
    shape(series, {"series": [{"name": str, "labels": (dict, type(None)),
                               "points": [list]}], "errors": [str]})
    by_name = {s["name"]: s for s in series["series"]}
    assert {"publish_rate_1m", "dispatch_rate_1m", "bytes_in_rate_1m",
            "bytes_out_rate_1m"} <= set(by_name)
    points = by_name["publish_rate_1m"]["points"]
    assert points and all(len(p) == 2 and isinstance(p[0], int) for p in points)
    assert max(v for _, v in points) > 0            # the publishes show as a rate
    assert points[-1][0] <= (now + 1) * 1000        # milliseconds, as upstream

    await producer.close()
    await consumer.close()


async def test_a_topic_travels_as_one_encoded_segment(ui, admin):
    # /default/series is a topic; /ui/v1/topics/%2Fdefault/series is /default's series
    name = f"/default/series-{uuid.uuid4().hex[:6]}"
    await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(name=name))
    status, _, page = await get(ui, f"/ui/v1/topics/{enc(name)}")
    assert status == 200 and page["topic"]["name"] == name
    status, _, body = await get(ui, f"/ui/v1/topics/{enc('/default/nothing-here')}")
    assert status == 404 and body["code"] == "NotFound", body
    status, _, body = await get(ui, f"/ui/v1/topics/{enc(name)}/series?from=0&to=1")
    assert status == 400 and "step" in body["error"]


async def test_namespaces_with_topics_and_policies(ui, admin):
    ns = unique("uins")
    await admin.call("NamespaceAdmin", "CreateNamespace", adm.NamespaceRequest(name=ns))
    await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(name=f"/{ns}/one"))
    status, _, body = await get(ui, "/ui/v1/namespaces")
    assert status == 200
    shape(body, {"timestamp": str, "errors": [str],
                 "namespaces": [{"name": str, "topics": [str], "policies": str}]})
    entry = next(n for n in body["namespaces"] if n["name"] == ns)
    assert entry["topics"] == [f"/{ns}/one"]
    assert isinstance(json.loads(entry["policies"]), dict)
    assert [n["name"] for n in body["namespaces"]] == sorted(n["name"]
                                                              for n in body["namespaces"])


async def test_topic_actions(ui, admin):
    short = unique("made")
    status, _, body = await post(ui, "/ui/v1/topics/actions", {
        "action": "create", "topic": short, "namespace": "default",
        "dispatch_strategy": "reliable", "schema_type": "String"})
    assert (status, body) == (200, {"success": True, "message": "ok"})
    d = await admin.call("TopicAdmin", "DescribeTopic",
                         adm.DescribeTopicRequest(name=f"/default/{short}"))
    assert d.delivery == "Reliable"
    status, _, body = await post(ui, "/ui/v1/topics/actions", {
        "action": "create", "topic": f"default/{short}-p", "partitions": 2})
    assert (status, body) == (200, {"success": True, "message": "ok"})
    # what upstream's admin UI sends: schema_type names a subject only when it is registered
    ui_form = {"action": "create", "topic": f"{short}-ui", "namespace": "default",
               "schema_type": "Json", "schema_data": "{}", "dispatch_strategy": "non_reliable"}
    status, _, body = await post(ui, "/ui/v1/topics/actions", ui_form)
    assert (status, body) == (200, {"success": True, "message": "ok"})
    d = await admin.call("TopicAdmin", "DescribeTopic",
                         adm.DescribeTopicRequest(name=f"/default/{short}-ui"))
    assert not d.HasField("schema_subject")
    subject = unique("Json")
    await admin.call("SchemaRegistry", "RegisterSchema", sr.RegisterSchemaRequest(
        subject=subject, schema_type="json_schema", schema_definition=b'{"type": "object"}'))
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {**ui_form, "topic": f"{short}-ui2", "schema_type": subject})
    assert (status, body) == (200, {"success": True, "message": "ok"})
    d = await admin.call("TopicAdmin", "DescribeTopic",
                         adm.DescribeTopicRequest(name=f"/default/{short}-ui2"))
    assert d.schema_subject == subject
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "unload", "topic": f"/default/{short}"})
    assert status == 200 and body["success"] is True
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "delete", "topic": f"/default/{short}"})
    assert (status, body) == (200, {"success": True, "message": "ok"})
    listed = await admin.call("TopicAdmin", "ListNamespaceTopics",
                              adm.NamespaceRequest(name="default"))
    assert f"/default/{short}" not in [t.name for t in listed.topics]

    # refused before any call, as upstream
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "create", "topic": "no-namespace"})
    assert status == 400 and body == {
        "success": False, "message": "missing namespace for topic without namespace"}
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "create", "topic": "/a/b/c"})
    assert status == 400 and "should be /namespace/topic" in body["message"]
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "explode", "topic": "/default/x"})
    assert status == 502 and body == {"success": False, "message": "unsupported action"}
    # the broker's refusal is a 502 with its message
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "delete", "topic": "/default/never-made"})
    assert status == 502 and body["success"] is False and "never-made" in body["message"]


async def test_request_bodies_are_checked(ui):
    status, _, body = await post(ui, "/ui/v1/topics/actions", {"action": "create"})
    assert status == 422 and "`topic`" in body["error"]
    status, _, body = await post(ui, "/ui/v1/topics/actions",
                                 {"action": "create", "topic": "/default/x", "partitions": "2"})
    assert status == 422 and "`partitions`" in body["error"]
    status, _, body = await asyncio.to_thread(
        ui.request, "POST", "/ui/v1/topics/actions", raw=b"{not json",
        headers={"Content-Type": "application/json"})
    assert status == 400
    status, _, body = await asyncio.to_thread(
        ui.request, "POST", "/ui/v1/topics/actions", raw=b"{}",
        headers={"Content-Type": "text/plain"})
    assert status == 415
    # the body's bound
    status, _, body = await asyncio.to_thread(
        ui.request, "POST", "/ui/v1/topics/actions",
        raw=b'{"action": "create", "topic": "' + b"x" * (70 * 1024) + b'"}',
        headers={"Content-Type": "application/json"})
    assert status == 413 and "larger than" in body["error"]
    status, headers, body = await get(ui, "/ui/v1/topics/actions")
    assert status == 405 and headers["Allow"] == "POST"
    status, _, body = await get(ui, "/ui/v1/nothing")
    assert status == 404


async def test_schemas_and_schema_actions(ui, admin):
    subject = unique("orders")
    for props in ({"id": {"type": "integer"}},
                  {"id": {"type": "integer"}, "note": {"type": "string"}}):
        await admin.call("SchemaRegistry", "RegisterSchema", sr.RegisterSchemaRequest(
            subject=subject, schema_type="json_schema", description="orders",
            schema_definition=json.dumps({"type": "object", "properties": props}).encode()))
    status, _, body = await get(ui, "/ui/v1/schemas")
    assert status == 200
    shape(body, {"timestamp": str, "subjects": [{
        "subject": str, "schema_type": str, "latest_version": int, "compatibility_mode": str,
        "schema_id": int, "tags": [str]}]})
    entry = next(s for s in body["subjects"] if s["subject"] == subject)
    assert entry["latest_version"] == 2 and entry["schema_type"] == "json_schema"
    ids = [s["schema_id"] for s in body["subjects"]]
    assert ids == sorted(ids)

    status, _, body = await get(ui, f"/ui/v1/schemas/{subject}")
    assert status == 200
    version = {"version": int, "created_at": int, "created_by": str, "description": str,
               "fingerprint": str, "schema_id": int}
    shape(body, {"timestamp": str, "subject": str, "schema_type": str,
                 "compatibility_mode": str, "versions": [version], "latest": {
                     "schema_id": int, "version": int, "subject": str, "schema_type": str,
                     "schema_definition": str, "description": str, "created_at": int,
                     "created_by": str, "tags": [str], "fingerprint": str,
                     "compatibility_mode": str}})
    # the definition as the registry answers it (upstream's stored form, passed through)
    assert body["latest"]["version"] == 2 and "note" in body["latest"]["schema_definition"]
    assert [v["version"] for v in body["versions"]] == [1, 2]

    status, _, body = await post(ui, "/ui/v1/schemas/actions", {
        "action": "set_compatibility", "subject": subject, "compatibility_mode": "FULL"})
    assert (status, body) == (200, {"success": True, "message": "ok"})
    status, _, body = await get(ui, f"/ui/v1/schemas/{subject}")
    assert body["compatibility_mode"].upper() == "FULL"
    status, _, body = await post(ui, "/ui/v1/schemas/actions",
                                 {"action": "set_compatibility", "subject": subject})
    assert status == 400 and body["success"] is False
    status, _, body = await post(ui, "/ui/v1/schemas/actions",
                                 {"action": "delete_version", "subject": subject, "version": 1})
    assert (status, body) == (200, {"success": True, "message": "ok"})
    status, _, body = await get(ui, f"/ui/v1/schemas/{subject}")
    assert [v["version"] for v in body["versions"]] == [2]
    status, _, body = await get(ui, f"/ui/v1/schemas/{unique('none')}")
    assert status == 404 and body["code"] == "NotFound"


async def test_cluster_balance_rebalance_and_actions(ui, broker_id):
    status, _, body = await get(ui, "/ui/v1/cluster/balance")
    assert status == 200
    shape(body, {"coefficient_of_variation": NUM, "mean_load": NUM, "max_load": NUM,
                 "min_load": NUM, "std_deviation": NUM, "broker_count": int,
                 "assignment_strategy": str, "brokers": [{
                     "broker_id": str, "load": NUM, "topic_count": int,
                     "is_overloaded": bool, "is_underloaded": bool}]})
    assert body["broker_count"] == 1
    status, _, body = await post(ui, "/ui/v1/cluster/rebalance", {"dry_run": True})
    shape(body, {"success": bool, "moves_executed": int, "error_message": str,
                 "proposed_moves": [{"topic_name": str, "from_broker": str, "to_broker": str,
                                     "estimated_load": NUM, "reason": str}]})
    assert body["moves_executed"] == 0
    status, _, body = await post(ui, "/ui/v1/cluster/actions",
                                 {"action": "activate", "broker_id": broker_id})
    assert (status, body) == (200, {"success": True, "message": "success=true"})
    status, _, body = await post(ui, "/ui/v1/cluster/actions",
                                 {"action": "unload", "broker_id": broker_id, "dry_run": True})
    shape(body, {"success": bool, "message": str})
    if status == 200:
        assert body["message"].startswith("started=")
    status, _, body = await post(ui, "/ui/v1/cluster/actions",
                                 {"action": "unload", "broker_id": "  "})
    assert (status, body) == (400, {"success": False, "message": "missing broker_id"})
    status, _, body = await get(ui, "/ui/v1/brokers/no-such-broker")
    assert status == 404 and body == {"error": "unknown broker"}


async def test_raft_and_security_endpoints_answer_upstreams_shapes(ui, broker_id):
    # a standalone broker's metadata is a group of one: it is the voter and the leader
    status, _, body = await get(ui, "/ui/v1/cluster/raft")
    assert status == 200
    shape(body, {"leader_id": str, "current_term": int, "last_applied": int,
                 "voters": [str], "learners": [str], "self_node_id": str, "raft_addr": str})
    assert (body["leader_id"], body["self_node_id"], body["voters"], body["learners"]) == \
        (broker_id, broker_id, [broker_id], [])
    assert body["last_applied"] > 0
    status, _, body = await post(ui, "/ui/v1/cluster/raft/actions",
                                 {"action": "promote_node", "node_id": "x1"})
    assert (status, body) == (400, {"success": False, "message": "Invalid node_id format"})

    status, _, body = await get(ui, "/ui/v1/security/roles")
    assert status == 200
    shape(body, {"roles": [{"name": str, "permissions": [str], "system": bool}]})
    role = unique("reader")
    status, _, body = await post(ui, "/ui/v1/security/roles/actions", {
        "action": "create", "name": role, "permissions": ["Lookup", "Consume"]})
    assert (status, body) == (200, {"success": True})
    status, _, body = await get(ui, "/ui/v1/security/roles")
    assert {"name": role, "permissions": ["Lookup", "Consume"], "system": False} in body["roles"]
    status, _, body = await post(ui, "/ui/v1/security/bindings/actions", {
        "action": "create", "id": role + "-b", "principal_type": "service_account",
        "principal_name": "app", "roles": [role], "scope": "cluster"})
    assert (status, body) == (200, {"success": True})
    status, _, body = await get(ui, "/ui/v1/security/bindings")
    shape(body, {"bindings": [{"id": str, "principal_type": str, "principal_name": str,
                               "role_names": [str], "scope": str, "resource_name": str}]})
    assert any(b["id"] == role + "-b" and b["role_names"] == [role] for b in body["bindings"])
    status, _, body = await post(ui, "/ui/v1/security/bindings/actions",
                                 {"action": "delete", "id": role + "-b", "scope": "cluster"})
    assert (status, body) == (200, {"success": True})
    status, _, body = await post(ui, "/ui/v1/security/roles/actions",
                                 {"action": "delete", "name": role})
    assert (status, body) == (200, {"success": True})
    status, _, body = await post(ui, "/ui/v1/security/roles/actions",
                                 {"action": "rename", "name": role})
    assert (status, body) == (400, {"error": "invalid action"})


async def test_cors_for_a_ui_on_another_local_origin(ui):
    origin = "http://localhost:5173"         # upstream's admin UI in development
    status, headers, _ = await asyncio.to_thread(
        ui.request, "OPTIONS", "/ui/v1/topics/actions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == origin
    status, headers, _ = await get(ui, "/ui/v1/health", headers={"Origin": origin})
    assert headers["Access-Control-Allow-Origin"] == origin
    # a page on some other site may not drive the API from a browser
    status, headers, _ = await asyncio.to_thread(
        ui.request, "OPTIONS", "/ui/v1/topics/actions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert status == 400 and "Access-Control-Allow-Origin" not in headers


async def test_cors_allow_origin_names_the_ui(broker):
    s = AdminServe("--broker-endpoint", f"http://{broker.admin_addr}",
                   "--cors-allow-origin", "https://ui.example.com")
    try:
        _, headers, _ = await get(s, "/ui/v1/health",
                                  headers={"Origin": "https://ui.example.com"})
        assert headers["Access-Control-Allow-Origin"] == "https://ui.example.com"
        _, headers, _ = await get(s, "/ui/v1/health", headers={"Origin": "http://localhost:5173"})
        assert "Access-Control-Allow-Origin" not in headers
    finally:
        assert s.stop() == 0


async def test_without_prometheus_the_admin_data_stands(ui_without_prometheus, admin):
    ui = ui_without_prometheus
    name = f"/default/{unique('noprom')}"
    await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(name=name))
    status, _, body = await get(ui, "/ui/v1/cluster")
    assert status == 200 and body["brokers"]
    assert body["errors"] and "metrics scrape failed" in body["errors"][0]
    assert body["brokers"][0]["stats"]["rpc_total"] == 0
    status, _, body = await get(ui, "/ui/v1/topics")
    assert status == 200 and body["errors"]
    assert any(t["name"] == name and t["producers_connected"] == 0
               for t in body["brokers"][0]["topics"])
    status, _, body = await get(ui, f"/ui/v1/topics/{enc(name)}")
    assert status == 200 and body["topic"]["name"] == name and body["errors"]
    assert body["metrics"]["core"]["msg_in_total"] == 0 and body["metrics"]["reliable"] is None
    now = int(time.time())
    status, _, body = await get(
        ui, f"/ui/v1/topics/{enc(name)}/series?from={now - 60}&to={now}&step=15s")
    assert status == 200 and body["series"] == [] and len(body["errors"]) == 5


async def test_the_console_still_serves_beside_the_api(ui):
    status, _, body = await get(ui, "/api/overview")
    assert status == 200 and "brokers" in body
