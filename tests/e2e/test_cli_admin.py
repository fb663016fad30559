"""`danube admin` (and the `danube-admin` script) against a real broker process: every
subcommand of the brokers, namespaces, topics and schemas groups in text and JSON, upstream's
danube-admin/tests scenarios (namespace and topic lifecycles, schema registry lifecycle and
admin operations), our statistics in `topics describe`, the endpoint's three spellings, and
the errors (one line on stderr, exit 1; argument errors exit 2). Commands run in-process
through danube.cli.admin.main; a few run as real processes to prove the scripts."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from broker_process import BrokerProcess
from tls_broker import start_tls_broker
from danube.cli.admin import main
from danube.client.admin import ENDPOINT_ENV

DESCRIBE_KEYS = ["topic", "broker_id", "delivery", "schema_subject", "schema_id",
                 "schema_version", "schema_type", "compatibility_mode", "subscriptions"]
SCHEMA_V1 = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "AdminTestEvent",
             "type": "object", "required": ["event_id", "action"],
             "properties": {"event_id": {"type": "string"}, "action": {"type": "string"}}}
SCHEMA_V2 = {**SCHEMA_V1, "properties": {**SCHEMA_V1["properties"],
                                         "metadata": {"type": "string"}}}
SCHEMA_BAD = {**SCHEMA_V1, "required": ["event_id", "action", "when"],
              "properties": {**SCHEMA_V1["properties"], "when": {"type": "integer"}}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("admin-cli")).start()
    yield b
    b.stop()


@pytest.fixture
def endpoint(broker, monkeypatch):
    url = f"http://{broker.admin_addr}"
    monkeypatch.setenv(ENDPOINT_ENV, url)
    return url


class Result:
    def __init__(self, status, out, err):
        self.status, self.out, self.err = status, out, err

    def json(self):
        return json.loads(self.out)


@pytest.fixture
def cli(endpoint, capsys):
    """cli("topics", "list", ...) -> Result(status, stdout, stderr), run in-process."""
    def run(*argv):
        capsys.readouterr()
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = exc.code
        out, err = capsys.readouterr()
        return Result(status, out, err)
    return run


def ok(result):
    assert result.status == 0, result.err
    assert result.err == "", result.err
    return result


def failed(result, status=1, *words):
    assert result.status == status, (result.status, result.out, result.err)
    if status == 1:
        lines = result.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("danube admin: error: "), result.err
        assert "Traceback" not in result.err
    for word in words:
        assert word in result.err, result.err
    return result


def unique_ns():
    return f"ns-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def namespace(cli):
    ns = unique_ns()
    ok(cli("namespaces", "create", ns))
    return ns


@pytest.fixture
def schema_files(tmp_path):
    paths = {}
    for name, body in (("v1", SCHEMA_V1), ("v2", SCHEMA_V2), ("bad", SCHEMA_BAD)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(body, indent=2))
    return {name: str(path) for name, path in paths.items()}


class ClientThread:
    """A DanubeClient on its own loop: the in-process CLI runs asyncio.run itself."""

    def __init__(self, url):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = self.run(self._make(url))

    async def _make(self, url):
        from danube.client import DanubeClient
        return DanubeClient(url)

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def client(broker):
    c = ClientThread(f"http://{broker.client_addr}")
    yield c
    c.close()


# -- brokers ---------------------------------------------------------------------------------

def test_brokers_list_leader_and_namespaces(cli, broker):
    listed = ok(cli("brokers", "list", "--output", "json")).json()
    assert len(listed) == 1
    (me,) = listed
    assert list(me) == ["broker_id", "broker_status", "broker_addr", "broker_role",
                        "admin_addr", "metrics_addr"]
    assert me["broker_status"] == "active" and me["broker_role"] == "Cluster_Leader"
    assert me["admin_addr"] == f"http://{broker.admin_addr}"
    text = ok(cli("brokers", "list")).out.splitlines()
    assert text[0].split() == ["BROKER", "ID", "STATUS", "ADDRESS", "ROLE", "ADMIN", "ADDR",
                               "METRICS", "ADDR"]
    assert set(text[1]) == {"-"}
    assert text[2].split()[:4] == [me["broker_id"], "active", me["broker_addr"],
                                   "Cluster_Leader"]
    # every column starts where its header does
    assert text[2].index(me["broker_addr"]) == text[0].index("ADDRESS")
    assert ok(cli("brokers", "leader-broker")).out == f'Leader Broker: "{me["broker_id"]}"\n'
    namespaces = ok(cli("brokers", "namespaces", "--output", "json")).json()
    assert {"default", "system"} <= set(namespaces)
    assert "Namespace: default\n" in ok(cli("brokers", "namespaces")).out


def test_brokers_balance_rebalance_activate_unload(cli):
    me = ok(cli("brokers", "list", "--output", "json")).json()[0]["broker_id"]
    balance = ok(cli("brokers", "balance", "--output", "json")).json()
    assert list(balance) == ["coefficient_of_variation", "mean_load", "max_load", "min_load",
                             "std_deviation", "broker_count", "brokers"]
    assert balance["broker_count"] == 1 and str(balance["brokers"][0]["broker_id"]) == me
    assert list(balance["brokers"][0]) == ["broker_id", "load", "topic_count",
                                           "is_overloaded", "is_underloaded"]
    text = ok(cli("brokers", "balance")).out
    assert "Cluster Balance Report" in text and "Coefficient of Variation:  0.00%" in text
    assert "Broker Count:    1" in text and "Well Balanced" in text
    assert "Dry Run" in ok(cli("brokers", "rebalance", "--dry-run")).out
    assert "Cluster Rebalancing Triggered" in ok(cli("brokers", "rebalance", "--max-moves",
                                                     "3")).out
    assert ok(cli("brokers", "activate", "--broker-id", me)).out == \
        "ActivateBroker success=true\n"
    failed(cli("brokers", "activate", "--broker-id", "12345"), 1,
           "activate broker 12345: NOT_FOUND")
    failed(cli("brokers", "unload", "--broker-id", me, "--dry-run"), 1,
           f"unload broker {me}: FAILED_PRECONDITION")
    failed(cli("brokers", "unload"), 2, "--broker-id")
    failed(cli("brokers", "unload", "--broker-id", me, "--max-parallel", "-1"), 2)


# -- namespaces ------------------------------------------------------------------------------

def test_namespace_lifecycle(cli):
    # upstream's namespace_lifecycle.rs, with every namespaces subcommand
    ns = unique_ns()
    assert ok(cli("namespaces", "create", ns)).out == "Namespace Created: true\n"
    assert ns in ok(cli("brokers", "namespaces", "--output", "json")).json()
    assert ok(cli("namespaces", "topics", ns, "--output", "json")).json() == []
    ok(cli("topics", "create", f"/{ns}/a"))
    assert ok(cli("namespaces", "topics", ns, "--output", "json")).json() == [f"/{ns}/a"]
    assert ok(cli("namespaces", "topics", ns)).out == f"Topic: /{ns}/a\n"
    policies = ok(cli("namespaces", "policies", ns, "--output", "json")).json()
    assert "max_message_size" in policies
    text = ok(cli("namespaces", "policies", ns)).out.splitlines()
    assert text[:2] == ["Policies Configuration:", "-----------------------"]
    assert text[-2] == f"Max message size: {policies['max_message_size']}"
    failed(cli("namespaces", "delete", ns), 1, f"delete namespace {ns}:")   # not empty
    ok(cli("topics", "delete", f"/{ns}/a"))
    assert ok(cli("namespaces", "delete", ns)).out == "Namespace Deleted: true\n"
    assert ns not in ok(cli("brokers", "namespaces", "--output", "json")).json()
    failed(cli("namespaces", "topics", ns), 1, f"list topics of namespace {ns}: NOT_FOUND")
    failed(cli("namespaces", "create", "bad name!"), 1, "INVALID_ARGUMENT")


# -- topics ----------------------------------------------------------------------------------

def names(result):
    return [t["name"] for t in result.json()]


def test_topic_lifecycle_non_partitioned(cli, namespace):
    # upstream's topic_lifecycle_non_partitioned.rs
    topic = f"/{namespace}/cli-e2e"
    r = ok(cli("topics", "create", topic, "--dispatch-strategy", "non_reliable"))
    assert r.out == f"✅ Topic created: {topic}\n"
    listed = ok(cli("topics", "list", "--namespace", namespace, "--output", "json")).json()
    assert listed == [{"name": topic, "broker_id": listed[0]["broker_id"],
                       "delivery": "NonReliable"}]
    assert ok(cli("topics", "list", "--namespace", namespace)).out == \
        f"Topic: {topic} (broker_id: {listed[0]['broker_id']}, delivery: NonReliable)\n"
    described = ok(cli("topics", "describe", topic, "--output", "json"))
    assert '"schema_id"' in described.out
    assert list(described.json())[:9] == DESCRIBE_KEYS
    assert ok(cli("topics", "subscriptions", topic, "--output", "json")).json() == []
    assert ok(cli("topics", "subscriptions", topic)).out == "Subscriptions: []\n"
    assert ok(cli("topics", "delete", topic)).out == "Topic Deleted: true\n"
    assert topic not in names(cli("topics", "list", "--namespace", namespace, "--output",
                                  "json"))


def test_topic_lifecycle_partitioned(cli, namespace):
    # upstream's topic_lifecycle_partitioned.rs
    base = f"/{namespace}/cli-e2e-p"
    r = ok(cli("topics", "create", base, "--partitions", "2", "--dispatch-strategy",
               "reliable"))
    assert r.out == f"✅ Partitioned topic created: {base}\n   Partitions: 2\n"
    listed = ok(cli("topics", "list", "--namespace", namespace, "--output", "json")).json()
    assert sorted(t["name"] for t in listed) == [f"{base}-part-0", f"{base}-part-1"]
    assert {t["delivery"] for t in listed} == {"Reliable"}
    ok(cli("topics", "subscriptions", f"{base}-part-0", "--output", "json"))
    # a partition cannot be deleted on its own (upstream: "Cannot delete individual partition")
    failed(cli("topics", "delete", f"{base}-part-0"), 1, f"delete topic {base}-part-0:",
           "partition")
    stats = ok(cli("topics", "stats", base, "--output", "json")).json()
    assert [s["name"] for s in stats] == [f"{base}-part-0", f"{base}-part-1"]
    assert stats[0]["log"]["durability"] and stats[0]["delivery"] == "Reliable"
    ok(cli("topics", "delete", base))
    assert names(cli("topics", "list", "--namespace", namespace, "--output", "json")) == []


def test_topic_name_forms_and_their_errors(cli, namespace):
    ok(cli("topics", "create", "bare", "--namespace", namespace))
    ok(cli("topics", "create", f"{namespace}/no-slash", "--dispatch-strategy", "reliable"))
    listed = {t["name"]: t["delivery"] for t in
              cli("topics", "list", "--namespace", namespace, "--output", "json").json()}
    assert listed == {f"/{namespace}/bare": "NonReliable",
                      f"/{namespace}/no-slash": "Reliable"}
    assert ok(cli("topics", "describe", "bare", "--namespace", namespace, "--output",
                  "json")).json()["topic"] == f"/{namespace}/bare"
    failed(cli("topics", "describe", "bare"), 1,
           "missing --namespace for topic 'bare' without namespace")
    failed(cli("topics", "describe", "/a/b/c"), 1, "wrong topic format '/a/b/c'",
           "/namespace/topic")
    failed(cli("topics", "create", "/ns/bad name"), 1, "wrong topic format")
    failed(cli("topics", "describe", "a/b/c"), 1, "wrong topic format")
    failed(cli("topics", "describe", f"/{namespace}/missing"), 1,
           f"describe topic /{namespace}/missing: NOT_FOUND")
    failed(cli("topics", "create", f"/{namespace}/bare"), 1,
           f"create topic /{namespace}/bare: ALREADY_EXISTS")
    failed(cli("topics", "list"), 2, "--namespace", "--broker")
    failed(cli("topics", "list", "--namespace", "a", "--broker", "b"), 2, "not allowed")
    failed(cli("topics", "list", "--namespace", namespace, "--output", "yaml"), 2, "json")
    failed(cli("topics", "create", "/ns/t", "--partitions", "x"), 2, "--partitions")


def test_topics_list_by_broker(cli, namespace):
    ok(cli("topics", "create", f"/{namespace}/on-me"))
    me = ok(cli("brokers", "list", "--output", "json")).json()[0]["broker_id"]
    assert f"/{namespace}/on-me" in names(cli("topics", "list", "--broker", me,
                                              "--output", "json"))
    assert f"Topic: /{namespace}/on-me (broker_id: {me}" in \
        ok(cli("topics", "list", "--broker", me)).out


def subscribe_and_leave_unacked(client, topic, count=3):
    async def go():
        consumer = await client.client.subscribe(topic, "c1", "audit", sub_type="exclusive")
        producer = await client.client.create_producer(topic, "p1", reliable=True)
        for i in range(count):
            await producer.send(b"m%d" % i)
        await consumer.receive(timeout=10)
        return consumer
    return client.run(go())


def wait_for(check, timeout=10):
    import time
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_describe_shows_subscriptions_and_statistics(cli, namespace, client):
    topic = f"/{namespace}/watched"
    ok(cli("topics", "create", topic, "--dispatch-strategy", "reliable"))
    subscribe_and_leave_unacked(client, topic)

    def audit():
        out = cli("topics", "describe", topic, "--output", "json").json()
        subs = out["stats"]["subscriptions"]
        # all three are in the consumer's queue, none acknowledged
        return subs and subs[0]["backlog"] == 3 and subs[0]["unacked"] == 3 and out
    wait_for(audit)
    out = audit()
    assert list(out) == DESCRIBE_KEYS + ["stats"]
    assert out["subscriptions"] == ["audit"] and out["delivery"] == "Reliable"
    stats = out["stats"]
    assert stats["name"] == topic and stats["messages_in"] == 3 and stats["producers"] == 1
    assert stats["consumers"] == 1 and stats["log"]["end_offset"] == 3
    (sub,) = stats["subscriptions"]
    assert sub["name"] == "audit" and sub["type"] == "Exclusive" and sub["consumers"] == 1
    assert sub["redelivered"] == 0 and sub["consumer_list"][0]["name"] == "c1"

    text = ok(cli("topics", "describe", topic)).out
    assert text.startswith(f"Topic: {topic}\nBroker ID: ")
    assert "Delivery: Reliable\n\n📋 Schema: None\n\nSubscriptions: [\"audit\"]\n" in text
    assert "📊 Statistics:" in text and "  Published:      3 messages" in text
    assert "WAL:" in text and "Durable tier:   none" in text
    header = next(line for line in text.splitlines() if "SUBSCRIPTION" in line)
    row = next(line for line in text.splitlines() if line.strip().startswith("audit"))
    assert header.split()[:6] == ["SUBSCRIPTION", "TYPE", "CONSUMERS", "BACKLOG", "UNACKED",
                                  "REDELIVERED"]
    assert row.split()[:5] == ["audit", "Exclusive", "1", "3", "3"]
    assert row.index("Exclusive") == header.index("TYPE")

    stats_text = ok(cli("topics", "stats", topic)).out
    assert stats_text.startswith(f"Topic: {topic} (delivery: Reliable")
    ns_stats = ok(cli("namespaces", "stats", namespace, "--output", "json")).json()
    assert [t["name"] for t in ns_stats] == [topic] and ns_stats[0]["messages_in"] == 3
    ns_text = ok(cli("namespaces", "stats", namespace)).out.splitlines()
    assert ns_text[0].split()[:2] == ["TOPIC", "DELIVERY"] and ns_text[2].startswith(topic)

    assert ok(cli("topics", "subscriptions", topic)).out == 'Subscriptions: ["audit"]\n'
    assert ok(cli("topics", "subscriptions", topic, "--output", "json")).json() == ["audit"]
    assert ok(cli("topics", "unload", topic)).out == "Topic Unloaded: true\n"
    assert ok(cli("topics", "unsubscribe", topic, "-s", "audit")).out == "Unsubscribed: true\n"
    assert ok(cli("topics", "subscriptions", topic, "--output", "json")).json() == []
    failed(cli("topics", "unsubscribe", topic, "--subscription", "audit"), 1,
           f"unsubscribe audit from {topic}: NOT_FOUND")


def test_failure_policy_set_and_get(cli, namespace, client):
    topic = f"/{namespace}/policed"
    ok(cli("topics", "create", topic, "--dispatch-strategy", "reliable"))
    subscribe_and_leave_unacked(client, topic, count=1)
    r = ok(cli("topics", "set-failure-policy", topic, "-s", "audit",
               "--max-redelivery-count", "4", "--ack-timeout-ms", "30000",
               "--base-redelivery-delay-ms", "100", "--max-redelivery-delay-ms", "5000",
               "--backoff-strategy", "exponential", "--poison-policy", "dead-letter",
               "--dead-letter-topic", f"/{namespace}/dlq"))
    assert r.out == f"✅ Failure policy updated for topic '{topic}' subscription 'audit'\n"
    got = ok(cli("topics", "get-failure-policy", topic, "-s", "audit", "--output",
                 "json")).json()
    assert got == {"topic": topic, "subscription": "audit", "max_redelivery_count": 4,
                   "ack_timeout_ms": 30000, "base_redelivery_delay_ms": 100,
                   "max_redelivery_delay_ms": 5000, "backoff_strategy": "exponential",
                   "dead_letter_topic": f"/{namespace}/dlq", "poison_policy": "dead_letter"}
    ok(cli("topics", "set-failure-policy", "policed", "--namespace", namespace,
           "--subscription", "audit", "--max-redelivery-count", "2", "--ack-timeout-ms", "1000",
           "--base-redelivery-delay-ms", "0", "--max-redelivery-delay-ms", "0",
           "--poison-policy", "drop"))
    text = ok(cli("topics", "get-failure-policy", topic, "-s", "audit")).out.splitlines()
    assert text == [f"Topic: {topic}", "Subscription: audit", "Max Redelivery Count: 2",
                    "Ack Timeout Ms: 1000", "Base Redelivery Delay Ms: 0",
                    "Max Redelivery Delay Ms: 0", "Backoff Strategy: fixed",
                    "Poison Policy: drop"]
    failed(cli("topics", "set-failure-policy", topic, "-s", "audit",
               "--max-redelivery-count", "2", "--ack-timeout-ms", "1",
               "--base-redelivery-delay-ms", "0", "--max-redelivery-delay-ms", "0",
               "--poison-policy", "explode"), 2, "--poison-policy")
    failed(cli("topics", "get-failure-policy", topic, "-s", "nobody"), 1,
           f"get the failure policy of {topic} subscription nobody: NOT_FOUND")


def test_describe_on_a_broker_without_statistics(cli, namespace, monkeypatch):
    # upstream's broker has no danube_ext.TopicStatsService: it answers UNIMPLEMENTED
    from danube.client import errors
    from danube.client.admin import AdminClient

    real = AdminClient.call

    async def upstream_broker(self, service, method, request=None, what=None):
        if service == "TopicStatsService":
            raise errors.Unimplemented(f"{what}: UNIMPLEMENTED: unknown service")
        return await real(self, service, method, request, what)

    topic = f"/{namespace}/plain"
    ok(cli("topics", "create", topic))
    monkeypatch.setattr(AdminClient, "call", upstream_broker)
    assert list(ok(cli("topics", "describe", topic, "--output", "json")).json()) == \
        DESCRIBE_KEYS
    text = ok(cli("topics", "describe", topic)).out
    assert text.endswith("Subscriptions: []\n") and "Statistics" not in text
    failed(cli("topics", "stats", topic), 1, "UNIMPLEMENTED")


# -- schemas ---------------------------------------------------------------------------------

def test_schema_registry_lifecycle(cli, namespace, schema_files):
    # upstream's schema_registry_lifecycle.rs
    subject = f"events-{namespace}"
    r = ok(cli("schemas", "register", subject, "--schema-type", "json_schema", "--file",
               schema_files["v1"]))
    lines = r.out.splitlines()
    assert lines[0] == "✅ Registered new schema version" and "Version: 1" in lines
    schema_id = int(next(x for x in lines if x.startswith("Schema ID:")).split(":")[1])
    got = ok(cli("schemas", "get", "--subject", subject, "--output", "json"))
    assert f'"schema_id": {schema_id}' in got.out and subject in got.out
    assert list(got.json()) == ["schema_id", "version", "subject", "schema_type",
                                "schema_definition", "description", "created_at",
                                "created_by", "tags", "fingerprint", "compatibility_mode"]
    versions = ok(cli("schemas", "versions", subject, "--output", "json"))
    assert '"version": 1' in versions.out
    assert list(versions.json()[0]) == ["version", "schema_id", "created_at", "created_by",
                                        "description", "fingerprint"]
    text = ok(cli("schemas", "versions", subject)).out
    assert text.startswith(f"Versions for subject '{subject}':\n  Version 1: "
                           f"schema_id={schema_id}, fingerprint=sha256:")

    topic = f"/{namespace}/events"
    r = ok(cli("topics", "create", topic, "--schema-subject", subject))
    assert r.out == f"✅ Topic created: {topic}\n   Schema subject: {subject}\n"
    info = ok(cli("topics", "describe", topic, "--output", "json")).json()
    assert info["schema_subject"] == subject and info["schema_id"] == schema_id
    assert info["schema_version"] == 1 and info["schema_type"] == "json_schema"
    # upstream's broker sends BACKWARD here (uppercase); the mode is what matters
    assert info["compatibility_mode"].upper() == "BACKWARD"
    text = ok(cli("topics", "describe", topic)).out
    assert f"\n📋 Schema Registry:\n  Subject: {subject}\n  Schema ID: {schema_id}\n" \
           f"  Version: 1\n  Type: json_schema\n" in text

    plain = f"/{namespace}/logs"
    ok(cli("topics", "create", plain))
    info = ok(cli("topics", "describe", plain, "--output", "json")).json()
    assert info["schema_subject"] is None and info["schema_id"] is None
    assert info["schema_version"] is None

    r = ok(cli("schemas", "check", subject, "--file", schema_files["v1"], "--schema-type",
               "json_schema"))
    assert r.out == f"✅ Schema is compatible with subject '{subject}'\n"
    ok(cli("topics", "delete", topic))
    ok(cli("topics", "delete", plain))


def test_schema_admin_operations(cli, namespace, schema_files):
    # upstream's schema_admin_operations.rs
    subject = f"admin-events-{namespace}"
    ok(cli("schemas", "register", subject, "--schema-type", "json_schema", "--file",
           schema_files["v1"]))
    got = ok(cli("schemas", "get-compatibility", subject, "--output", "json")).json()
    assert got == {"subject": subject, "compatibility_mode": "BACKWARD"}
    r = ok(cli("schemas", "set-compatibility", subject, "--mode", "full"))
    assert r.out == f"✅ Compatibility mode set for subject '{subject}'\nMode: FULL\n"
    assert ok(cli("schemas", "get-compatibility", subject)).out == \
        f"Subject: {subject}\nCompatibility Mode: FULL\n"

    topic = f"/{namespace}/admin-test-events"
    ok(cli("topics", "create", topic))
    r = ok(cli("topics", "configure-schema", topic, "--subject", subject,
               "--validation-policy", "enforce", "--enable-payload-validation"))
    assert r.out == (f"✅ Schema configuration set for topic '{topic}'\n"
                     f"   Schema Subject: {subject}\n   Validation Policy: ENFORCE\n"
                     f"   Payload Validation: ENABLED\n")
    config = ok(cli("topics", "get-schema-config", topic, "--output", "json")).json()
    assert list(config) == ["topic", "schema_subject", "validation_policy",
                            "enable_payload_validation", "schema_id"]
    assert config["schema_subject"] == subject and config["validation_policy"] == "ENFORCE"
    assert config["enable_payload_validation"] is True
    r = ok(cli("topics", "set-validation-policy", topic, "--policy", "warn",
               "--enable-payload-validation"))
    assert "Validation policy updated" in r.out and "   Policy: WARN\n" in r.out
    config = ok(cli("topics", "get-schema-config", topic, "--output", "json")).json()
    assert config["validation_policy"] == "WARN"
    text = ok(cli("topics", "get-schema-config", topic)).out
    assert text.startswith(f"Topic: {topic}\nSchema Subject: {subject}\n"
                           "Validation Policy: WARN\nPayload Validation: ENABLED\n")

    topic2 = f"/{namespace}/admin-test-events-2"
    ok(cli("topics", "create", topic2))
    assert ok(cli("topics", "get-schema-config", topic2)).out == \
        f"Topic: {topic2}\nNo schema configured for this topic\n"
    r = ok(cli("topics", "configure-schema", topic2, "--subject", subject,
               "--validation-policy", "none"))
    assert "Payload Validation: DISABLED" in r.out

    r = ok(cli("schemas", "register", subject, "--schema-type", "json_schema", "--file",
               schema_files["v2"]))
    assert "Version: 2" in r.out
    r = ok(cli("schemas", "delete", subject, "--version", "2", "--confirm"))
    assert r.out == f"✅ Deleted version 2 of subject '{subject}'\n"
    failed(cli("schemas", "delete", subject, "--version", "1"), 1, "--confirm")
    assert ok(cli("schemas", "versions", subject, "--output", "json")).json()[0]["version"] == 1
    ok(cli("topics", "delete", topic))
    ok(cli("topics", "delete", topic2))


def test_schemas_inline_by_id_check_list_and_errors(cli, schema_files):
    subject = f"inline-{uuid.uuid4().hex[:8]}"
    r = ok(cli("schemas", "register", subject, "--schema-type", "json_schema", "--schema",
               json.dumps(SCHEMA_V1), "--description", "first", "--tags", "a", "b",
               "--tags", "c", "--output", "json")).json()
    assert list(r) == ["subject", "schema_id", "version", "is_new_version", "fingerprint"]
    assert r["is_new_version"] is True and r["version"] == 1
    again = ok(cli("schemas", "register", subject, "--schema-type", "json_schema", "--file",
                   schema_files["v1"]))
    assert again.out.startswith("✅ Schema already exists\n")
    got = ok(cli("schemas", "get", "--id", str(r["schema_id"]), "--version", "1", "--output",
                 "json")).json()
    assert got["subject"] == subject and got["tags"] == ["a", "b", "c"]
    assert got["description"] == "first" and got["compatibility_mode"] == "BACKWARD"
    # as upstream: the registry's stored form (reference a.2), the raw schema inside
    stored = json.loads(got["schema_definition"])
    assert json.loads(stored["JsonSchema"]["raw_schema"]) == SCHEMA_V1
    text = ok(cli("schemas", "get", "--id", str(r["schema_id"]))).out
    assert f"Subject: {subject}\nType: json_schema\nCompatibility Mode: BACKWARD\n" in text
    assert "Description: first\nTags: a, b, c\n\nSchema Definition:\n" in text
    bad = ok(cli("schemas", "check", subject, "--schema-type", "json_schema", "--file",
                 schema_files["bad"]))
    assert bad.out.startswith(f"❌ Schema is NOT compatible with subject '{subject}'\n")
    assert "Compatibility errors:" in bad.out
    assert "✅" in ok(cli("schemas", "check", subject, "--schema-type", "json_schema",
                          "--file", schema_files["bad"], "--mode", "none")).out
    subjects = ok(cli("schemas", "list-subjects", "--output", "json")).json()
    mine = next(s for s in subjects if s["subject"] == subject)
    assert list(mine) == ["subject", "schema_type", "latest_version", "schema_id",
                          "compatibility_mode", "tags"]
    assert f"Subject: {subject}\n  Type: json_schema\n  Latest Version: 1\n" in \
        ok(cli("schemas", "list-subjects")).out
    failed(cli("schemas", "get", "--subject", "no-such-subject"), 1,
           "get schema no-such-subject: NOT_FOUND")
    failed(cli("schemas", "get"), 1, "either --id or --subject")
    failed(cli("schemas", "get", "--version", "1"), 2, "--version requires --id")
    failed(cli("schemas", "get", "--id", "1", "--subject", "x"), 2, "not allowed")
    failed(cli("schemas", "register", subject, "--schema-type", "json_schema"), 1,
           "either --file or --schema")
    failed(cli("schemas", "register", subject, "--schema-type", "json_schema", "--file",
               "/nonexistent/s.json"), 1, "cannot read /nonexistent/s.json")
    failed(cli("schemas", "register", subject, "--schema-type", "xml", "--schema", "x"), 2)
    failed(cli("schemas", "set-compatibility", subject, "--mode", "sideways"), 2, "--mode")


# -- endpoint and errors ---------------------------------------------------------------------

def test_endpoint_from_env_flag_before_or_after(cli, endpoint, monkeypatch):
    unreachable = "http://127.0.0.1:9"
    monkeypatch.setenv(ENDPOINT_ENV, unreachable)
    r = failed(cli("brokers", "list"), 1, "list brokers: UNAVAILABLE", "127.0.0.1:9")
    assert r.out == ""
    for argv in (("--endpoint", endpoint, "brokers", "list", "--output", "json"),
                 ("brokers", "--endpoint", endpoint, "list", "--output", "json"),
                 ("brokers", "list", "--output", "json", "--endpoint", endpoint)):
        assert ok(cli(*argv)).json()[0]["broker_status"] == "active"
    # the innermost --endpoint wins, as one clap global flag given twice
    ok(cli("--endpoint", unreachable, "brokers", "list", "--endpoint", endpoint))
    failed(cli("brokers", "list", "--endpoint", "ftp://nowhere"), 1, "ftp://nowhere")


def test_scripts_run_as_processes(broker, tmp_path):
    env = dict(os.environ, **{ENDPOINT_ENV: f"http://{broker.admin_addr}"})
    script = Path(sys.executable).parent / "danube-admin"
    r = subprocess.run([str(script), "brokers", "list", "--output", "json"],
                       capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["admin_addr"] == f"http://{broker.admin_addr}"
    r = subprocess.run([sys.executable, "-P", "-m", "danube", "admin", "topics", "describe",
                        "/default/absent-topic"], capture_output=True, text=True, env=env,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("danube admin: error: describe topic /default/absent-topic: "
                               "NOT_FOUND: ") and r.stderr.count("\n") == 1
    r = subprocess.run([str(script), "topics", "list"], capture_output=True, text=True,
                       env=env, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "one of the arguments --namespace --broker" in r.stderr


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    b = start_tls_broker(tmp_path_factory.mktemp("admin-tls"))
    yield b
    b.stop()


def test_tls_settings_from_upstreams_environment(cli, tls_broker, monkeypatch):
    https = f"https://{tls_broker.admin_addr}"
    failed(cli("brokers", "leader-broker", "--endpoint", https), 1,
           "UNAVAILABLE", "certificate verify failed")          # the CA is not trusted yet
    monkeypatch.setenv("DANUBE_ADMIN_CA", tls_broker.ca_file)
    monkeypatch.setenv("DANUBE_ADMIN_TOKEN", "not-checked-by-this-build")
    assert ok(cli("brokers", "leader-broker", "--endpoint", https)).out.startswith(
        "Leader Broker: ")
    # DANUBE_ADMIN_TLS=true turns TLS on for a URL without https://, as upstream
    monkeypatch.setenv("DANUBE_ADMIN_TLS", "true")
    plain = tls_broker.admin_addr
    ok(cli("brokers", "leader-broker", "--endpoint", plain))
    monkeypatch.setenv("DANUBE_ADMIN_DOMAIN", "elsewhere.example")
    failed(cli("brokers", "leader-broker", "--endpoint", plain), 1, "elsewhere.example")
    monkeypatch.setenv("DANUBE_ADMIN_CA", "/nonexistent/ca.pem")
    failed(cli("brokers", "leader-broker", "--endpoint", https), 1,
           "DANUBE_ADMIN_CA: no such file: /nonexistent/ca.pem")
