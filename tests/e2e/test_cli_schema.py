"""`danube schema` and the produce/consume schema flags as processes against a real broker:
upstream danube-cli's schema workflow (register, get, versions, check, auto-register via
--schema-file, consume showing the schema) and our working `list` and `delete`."""

import json
import os
import subprocess
import sys

import pytest

from broker_process import BrokerProcess

CLI = [sys.executable, "-P", "-m", "danube"]

V1 = {"type": "object", "properties": {"user_id": {"type": "string"},
                                       "action": {"type": "string"}},
      "required": ["user_id"]}
V2 = {**V1, "properties": {**V1["properties"], "device": {"type": "string"}}}
BAD = {**V1, "required": ["user_id", "action", "when"],
       "properties": {**V1["properties"], "when": {"type": "integer"}}}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("d")).start()
    yield b
    b.stop()


def run(*args, timeout=60):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def schema(broker, *args):
    return run("schema", "-s", f"http://{broker.client_addr}", *args)


@pytest.fixture
def files(tmp_path):
    out = {}
    for name, body in (("v1", V1), ("v2", V2), ("bad", BAD)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(body))
        out[name] = str(path)
    return out


def test_register_get_versions_check(broker, files):
    r = schema(broker, "register", "user-events", "-t", "json_schema", "-f", files["v1"])
    assert r.returncode == 0, r.stderr
    assert "Schema registered successfully" in r.stdout and "Schema ID:" in r.stdout
    r = schema(broker, "get", "user-events")
    assert r.returncode == 0, r.stderr
    assert "user-events" in r.stdout and '"user_id"' in r.stdout and "Version: 1" in r.stdout
    r = schema(broker, "check", "user-events", "-t", "json_schema", "-f", files["v2"])
    assert r.returncode == 0 and "COMPATIBLE" in r.stdout and "NOT" not in r.stdout
    r = schema(broker, "check", "user-events", "-t", "json_schema", "-f", files["bad"])
    assert r.returncode == 1 and "NOT COMPATIBLE" in r.stdout and "when" in r.stdout
    r = schema(broker, "register", "user-events", "-t", "json_schema", "-f", files["v2"])
    assert r.returncode == 0, r.stderr
    r = schema(broker, "versions", "user-events")
    assert "v1" in r.stdout and "v2" in r.stdout
    r = schema(broker, "get", "user-events", "-v", "1", "-o", "json")
    got = json.loads(r.stdout)
    assert got["version"] == 1 and json.loads(got["schema_definition"]) == V1
    r = schema(broker, "register", "user-events", "-t", "json_schema", "-f", files["bad"])
    assert r.returncode == 1 and "FAILED_PRECONDITION" in r.stderr and "when" in r.stderr


def test_list_and_delete_work(broker, files):
    schema(broker, "register", "to-delete", "-t", "json_schema", "-f", files["v1"])
    schema(broker, "register", "to-delete", "-t", "json_schema", "-f", files["v2"])
    listed = json.loads(schema(broker, "list", "-o", "json").stdout)
    row = next(r for r in listed if r["subject"] == "to-delete")
    assert row["latest_version"] == 2 and row["schema_type"] == "json_schema"
    assert "to-delete" in schema(broker, "list").stdout
    r = schema(broker, "delete", "to-delete", "-v", "2")
    assert r.returncode == 0 and "v2" in r.stdout
    assert json.loads(schema(broker, "versions", "to-delete", "-o", "json").stdout)[
        "versions"] == [1]
    r = schema(broker, "delete", "to-delete")
    assert r.returncode == 0, r.stderr
    r = schema(broker, "get", "to-delete")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr


def test_errors_are_clear(broker, files, tmp_path):
    r = schema(broker, "get", "no-such-subject")
    assert r.returncode == 1 and "no-such-subject" in r.stderr
    broken = tmp_path / "broken.avsc"
    broken.write_text('{"type": "record", "name": "X"')
    r = schema(broker, "register", "broken", "-t", "avro", "-f", str(broken))
    assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and "avro" in r.stderr.lower()
    r = schema(broker, "register", "x", "-t", "avro", "-f", str(tmp_path / "missing.avsc"))
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_produce_with_schema_and_consume_pretty_prints(broker, files):
    topic = "/default/cli-schema-auto"
    assert run("produce", "-s", broker.client_addr, "-t", topic, "-m", "init").returncode == 0
    consumer = subprocess.Popen(
        [*CLI, "consume", "-s", broker.client_addr, "-t", topic, "-m", "s", "--count", "2",
         "--timeout", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ))
    assert "Consuming from" in consumer.stderr.readline()
    message = json.dumps({"user_id": "user_123", "action": "login"})
    r = run("produce", "-s", broker.client_addr, "-t", topic, "--schema-file", files["v1"],
            "--schema-type", "json_schema", "-m", message, "-c", "2", "-i", "100")
    assert r.returncode == 0, r.stderr
    assert "Auto-registering schema" in r.stdout and "Schema registered with ID" in r.stdout
    assert "Success: 2" in r.stdout
    expected_subject = topic.lstrip("/").replace("/", "-")
    assert expected_subject in schema(broker, "get", expected_subject).stdout
    out, err = consumer.communicate(timeout=30)
    assert consumer.returncode == 0, err
    assert f"Schema: {expected_subject} v1 (json_schema)" in out
    assert '"user_id": "user_123"' in out            # pretty-printed over lines
    assert "Valid against the schema" in out

    r = run("produce", "-s", broker.client_addr, "-t", topic, "--schema-subject",
            expected_subject, "--schema-version", "1", "-m", message)
    assert r.returncode == 0 and "pinned to version 1" in r.stdout
    r = run("produce", "-s", broker.client_addr, "-t", topic, "--schema-subject",
            expected_subject, "--schema-min-version", "5", "-m", message)
    assert r.returncode == 1 and "minimum" in r.stderr
