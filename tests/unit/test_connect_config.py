"""danube.connect's pure parts: declared configuration (every bad key named), the backoff's
bounds, and the table sinks' record -> row conversion."""

import json
import re

import pytest

from danube.connect import ConfigError, InvalidRecord, SinkRecord
from danube.connect.config import load
from danube.connect.retry import Backoff
from danube.connect.settings import Field, Table, Tables, topic_name

OWN = {"thing": Table({"host": Field(str, env="THING_HOST"), "port": Field(int, 1, min=1),
                       "on": Field(bool, False, env="THING_ON"),
                       "routes": Tables({"to": Field(str, check=topic_name)}, min_items=1)})}
BASE = {"connector": "x", "connector_name": "n",
        "thing": {"host": "h", "routes": [{"to": "/a/b"}]}}


def with_(**changes):
    raw = json.loads(json.dumps(BASE))
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = raw
        for p in parents:
            node = node[p] if not p.isdigit() else node[int(p)]
        node[last] = value
    return raw


def test_a_good_file_and_its_defaults():
    core, own = load(BASE, OWN, env={})
    assert core.danube_service_url == "http://localhost:6650"
    assert core.retry.max_retries == 3 and core.processing.batch_size == 1000
    assert core.dead_letter_topic is None
    assert own.thing.host == "h" and own.thing.port == 1 and own.thing.routes[0].to == "/a/b"


@pytest.mark.parametrize("raw,needle", [
    (with_(thing__hots="x"), "unknown key thing.hots"),
    (with_(retry={"max_retries": 101}), "retry.max_retries: 101 is above the maximum 100"),
    (with_(processing={"batch_size": 0}), "processing.batch_size: 0 is below the minimum 1"),
    (with_(thing__port="80"), "thing.port: expected an integer, not str"),
    (with_(thing__port=True), "thing.port: expected an integer, not bool"),
    (with_(thing__routes=[{"to": "/a/b/c"}]), "thing.routes[0].to: '/a/b/c' is not a Danube"),
    (with_(thing__routes=[]), "thing.routes: at least 1 needed"),
    (with_(danube_service_url="localhost:6650"), "danube_service_url: 'localhost:6650'"),
    (with_(connector_name="a b"), "connector_name: 'a b'"),
    (with_(dead_letter_topic="dlq"), "dead_letter_topic: 'dlq' is not a Danube topic"),
    (with_(retry={"retry_backoff_ms": 500, "max_backoff_ms": 100}), "retry.max_backoff_ms"),
])
def test_bad_keys_are_named(raw, needle):
    with pytest.raises(ConfigError) as info:
        load(raw, OWN, env={})
    assert needle in str(info.value)


def test_missing_keys_and_environment():
    raw = with_()
    del raw["thing"]["host"]
    with pytest.raises(ConfigError, match="missing key thing.host or set THING_HOST"):
        load(raw, OWN, env={})
    _, own = load(raw, OWN, env={"THING_HOST": "from-env", "THING_ON": "yes"})
    assert own.thing.host == "from-env" and own.thing.on is True
    with pytest.raises(ConfigError, match="THING_ON: expected true or false"):
        load(raw, OWN, env={"THING_HOST": "h", "THING_ON": "maybe"})
    with pytest.raises(ConfigError, match="CONNECTOR_METRICS_PORT: expected an integer"):
        load(BASE, OWN, env={"CONNECTOR_METRICS_PORT": "ninety"})


def test_backoff_doubles_within_its_cap_and_jitters():
    low = Backoff(100, 1000, 5, rng=lambda: 0.0)
    high = Backoff(100, 1000, 5, rng=lambda: 1.0)
    assert [low.delay(a) for a in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    assert [high.delay(a) for a in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert high.delay(10_000) == 1.0


def record(payload, offset=0):
    return SinkRecord("/d/t", "/d/t", offset, payload, {}, None, 0, "p")


def test_rows_and_the_reasons_of_bad_records():
    pytest.importorskip("pyarrow")
    from danube.connectors.columns import Columns
    cols = Columns([("a.b", "ab", "Int32", False), ("t", "t", "Timestamp", True),
                    ("j", "j", "Json", True)], include_metadata=True)
    row = cols.row(record(b'{"a": {"b": 7}, "t": "2026-01-02T03:04:05Z", "j": [1]}', 9))
    assert row["ab"] == 7 and row["t"].year == 2026 and row["j"] == "[1]"
    assert json.loads(row["_danube_metadata"])["offset"] == 9
    for payload, reason in [(b"{", "invalid JSON"),
                            (b'{"a": {"b": 2147483648}}', "out of range for Int32"),
                            (b'{"a": {}}', "field 'a.b' (column 'ab') is missing"),
                            (b'{"a": {"b": 1}, "t": true}', "expected an ISO 8601")]:
        with pytest.raises(InvalidRecord, match=re.escape(reason)):
            cols.row(record(payload))
    with pytest.raises(ConfigError, match="data_type 'Int128'"):
        Columns([("x", "x", "Int128", True)], False)


def test_upstream_subscription_type_takes_any_case_and_names_the_choices():
    from danube.connect.settings import upstream_subscription_type

    for value in ("Exclusive", "shared", "FailOver", "FAILOVER"):
        assert upstream_subscription_type(value) is None
    assert upstream_subscription_type("KeyShared") == \
        "'KeyShared' is not one of Exclusive, Shared, FailOver"
