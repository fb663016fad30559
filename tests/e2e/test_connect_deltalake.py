"""Danube Connect's sink-deltalake against the real broker process, run as `danube connect
run`: JSON records through field mappings into a local Delta table, bad records (invalid
JSON, a wrong type, a missing field) to the dead-letter topic with the reason, columns from
the registry subject, raw columns, three SIGKILLs in the middle of a stream with every row
exactly once (count and checksum), a SIGKILL while a batch's dead letters wait for the
broker's ack (none lost, none twice, no row twice), and the same on S3 (SeaweedFS)."""

import asyncio
import json
import re
import uuid

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from broker_process import BrokerProcess
from connector_process import Collector, ConnectorProcess, runtime_toml
from waiting import async_wait_for
from danube.client import DanubeClient, register_schema
from danube.proto import DanubeAdmin_pb2 as adm

MAPPINGS = '''field_mappings = [
    { json_path = "id", column = "id", data_type = "Int64", nullable = false },
    { json_path = "name", column = "name", data_type = "Utf8", nullable = true },
    { json_path = "detail.amount", column = "amount", data_type = "Float64" },
]'''


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-delta")).start()
    yield b
    b.stop()


def write_config(path, broker, topic, table_uri, *, route_extra=MAPPINGS, delta_extra="",
                 dlq=None, batch_size=200):
    head = runtime_toml("sink-deltalake", f"http://{broker.client_addr}",
                        f"delta-{uuid.uuid4().hex[:8]}", dlq=dlq, batch_size=batch_size,
                        batch_timeout_ms=200)
    path.write_text(f'''{head}
[deltalake]
{delta_extra}

[[deltalake.routes]]
from = "{topic}"
subscription = "delta-sink"
to = "{table_uri}"
{route_extra}
''')
    return path


def row(i):
    return json.dumps({"id": i, "name": f"n{i}", "detail": {"amount": i * 0.5}}).encode()


def table_rows(uri, storage_options=None):
    try:
        return DeltaTable(uri, storage_options=storage_options).to_pyarrow_table()
    except Exception:       # noqa: BLE001 - not created yet
        return None


def count(uri, storage_options=None):
    t = table_rows(uri, storage_options)
    return 0 if t is None else t.num_rows


async def make_topic(client, topic):
    """A reliable producer on ``topic`` (which creates it: a sink waits for its topic)."""
    return await client.create_producer(topic, f"p-{uuid.uuid4().hex[:6]}", reliable=True)


async def test_round_trip_with_dead_letters(tmp_path, broker):
    topic = f"/default/delta_{uuid.uuid4().hex[:8]}"
    dlq = f"/default/dlq_{uuid.uuid4().hex[:8]}"
    uri = str(tmp_path / "table")
    good = [row(i) for i in range(100)]
    bad = [b"{not json", json.dumps({"id": "seven"}).encode(),
           json.dumps({"name": "no id"}).encode()]
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        # The dead-letter topic exists (and is read) before the first dead letter.
        await client.create_producer(dlq, "dlq-maker", reliable=True)
        dead = await client.subscribe(dlq, "d", "s", "exclusive")
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, uri,
                                             dlq=dlq))
        await asyncio.to_thread(conn.start)
        await producer.send_many(good[:50] + bad + good[50:])
        await async_wait_for(lambda: count(uri) == 100, 60, "100 rows")
        letters = [await dead.receive(timeout=30) for _ in range(3)]
    t = table_rows(uri)
    assert sorted(t.column("id").to_pylist()) == list(range(100))
    assert t.column("amount").to_pylist()[:2] == [0.0, 0.5]
    meta = json.loads(t.column("_danube_metadata")[0].as_py())
    assert meta["topic"] == topic and meta["offset"] == 0
    assert [m.payload for m in letters] == bad
    reasons = [m.attributes["dlq.reason"] for m in letters]
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "field 'id' (column 'id', Int64): expected an integer, got str"
    assert reasons[2].startswith("field 'id' (column 'id') is missing")
    assert {m.attributes["dlq.source_topic"] for m in letters} == {topic}
    assert [int(m.attributes["dlq.offset"]) for m in letters] == [50, 51, 52]
    assert conn.metric("danube_connector_messages_dead_lettered_total") == 3
    assert conn.metric("danube_connector_messages_processed_total") == 100
    assert conn.stop() == 0


def checksum(uri, storage_options=None):
    t = table_rows(uri, storage_options)
    ids = t.column("id")
    return t.num_rows, len(pc.unique(ids)), pc.sum(ids).as_py()


async def kill_and_restart(conn, at_least, uri, storage_options=None, timeout=120):
    """SIGKILL the sink once ``at_least`` rows are in, start it again: (the new sink, the
    last offset the table held when it started: the rows' ids are the topic's offsets)."""
    await async_wait_for(lambda: count(uri, storage_options) >= at_least, timeout,
                         f"{at_least} rows before the kill")
    conn.sigkill()
    committed = pc.max(table_rows(uri, storage_options).column("id")).as_py()
    again = ConnectorProcess(conn.config_path, env=conn.env)
    await asyncio.to_thread(again.start)
    return again, committed


async def test_three_sigkills_exactly_once(tmp_path, broker):
    """Each batch is one Delta commit carrying the partition's offset as an application
    transaction: killed three times mid-stream, the table ends with every row once, and
    each restarted sink resumes from the offset the table holds (read back from the
    transaction, not left to the broker's redelivery: a kill between a commit and its
    acknowledgement would otherwise write rows twice, which only some runs see)."""
    topic = f"/default/delta_kill_{uuid.uuid4().hex[:8]}"
    uri = str(tmp_path / "table")
    total = 20000
    restarts = []               # (the restarted sink, the offset committed when it started)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, uri,
                                             batch_size=250))
        try:
            await asyncio.to_thread(conn.start)
            # A quarter of the rows before each kill (the sink writes them faster than a
            # whole stream is sent, so the rows after a kill are sent after it): every
            # restarted sink has rows to write after the offset it resumes from.
            quarter = total // 4
            for k, at_least in enumerate((2000, 7000, 12000)):
                feeding = asyncio.ensure_future(producer.send_many(
                    [row(i) for i in range(k * quarter, (k + 1) * quarter)]))
                conn, committed = await kill_and_restart(conn, at_least, uri)
                restarts.append((conn, committed))
                await feeding
            await producer.send_many([row(i) for i in range(3 * quarter, total)])
            await async_wait_for(lambda: count(uri) >= total, 180, "every row")
            assert checksum(uri) == (total, total, total * (total - 1) // 2)
            # The last sink wrote exactly the rows after the offset it resumed from: none
            # again, none skipped.
            last = restarts[-1][1]
            assert conn.metric("danube_connector_messages_processed_total") == total - last - 1
            assert conn.stop() == 0
        finally:
            conn.stop()         # a failure above must not leave the sink running
    assert checksum(uri) == (total, total, total * (total - 1) // 2)
    for n, (sink, committed) in enumerate(restarts):
        resumed = [r for r in sink.records()
                   if r.get("msg", "").startswith("resuming after")]
        assert [r.get("offsets") for r in resumed] == [str({topic: committed})], \
            f"restart {n + 1} did not resume from the committed offset {committed}: {resumed}"
        # What it acknowledged without writing (delivered again: committed, not yet
        # acknowledged when the kill came) was at or below that offset.
        skipped = sum(int(re.match(r"acknowledged (\d+) records", r["msg"]).group(1))
                      for r in sink.records() if "written before" in r.get("msg", ""))
        assert skipped <= committed + 1, (n, skipped, committed)


def refused(i):
    """A record the sink refuses (``id`` is not an integer), told apart by ``i``."""
    return json.dumps({"id": f"bad-{i}", "name": f"n{i}"}).encode()


def retrying_dead_letters(conn):
    return any(r.get("msg", "").startswith("dead-letter publish failed")
               for r in conn.records())


async def test_sigkill_before_the_dead_letters_are_acknowledged(tmp_path, broker, admin):
    """Issue 51: the sink is killed while the broker has not acknowledged a batch's dead
    letters (the dead-letter topic's namespace does not exist yet: the broker answers
    UNAVAILABLE and the sink retries the publish). The batch's Delta commit, which carries
    its last offset, waits for that ack: restarted once the namespace exists, the sink
    writes the batch again. Every good row once, every refused record in the dead-letter
    topic once (1 in 50 refused, as the issue's report had 1 in 100)."""
    ns = f"dlq_{uuid.uuid4().hex[:8]}"
    dlq = f"/{ns}/dead"
    topic = f"/default/delta_dlq_{uuid.uuid4().hex[:8]}"
    uri = str(tmp_path / "table")
    total = 1000
    bad = [i for i in range(total) if i % 50 == 25]
    payloads = [refused(i) if i in bad else row(i) for i in range(total)]
    good = total - len(bad)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, uri,
                                             dlq=dlq, batch_size=100))
        await asyncio.to_thread(conn.start)
        await producer.send_many(payloads)
        await async_wait_for(lambda: retrying_dead_letters(conn), 120,
                             "the sink retrying its dead-letter publish")
        conn.sigkill()
        # Nothing at or past a refused record whose dead letter is not acknowledged is
        # committed (the offsets are the ids: the topic's offsets start at 0).
        t = table_rows(uri)
        written = [] if t is None else t.column("id").to_pylist()
        assert all(i < bad[0] for i in written), \
            f"committed up to id {max(written)} before the dead letter of {bad[0]} was acked"
        await admin.call("NamespaceAdmin", "CreateNamespace", adm.NamespaceRequest(name=ns))
        dead = await Collector(client, dlq, create_topic=True).start()
        conn = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn.start)
        await async_wait_for(lambda: count(uri) >= good, 120, "every good row")
        # Each batch's dead letters are acknowledged before its commit: all of them are in
        # the topic once the last row is in the table.
        assert conn.metric("danube_connector_messages_dead_lettered_total") == len(bad)
        await async_wait_for(lambda: len(dead.messages) >= len(bad), 60, "every dead letter")
        await dead.stop()
    assert sorted(int(m.attributes["dlq.offset"]) for m in dead.messages) == bad
    assert sorted(m.payload for m in dead.messages) == sorted(refused(i) for i in bad)
    ids = [i for i in range(total) if i not in bad]
    assert checksum(uri) == (good, good, sum(ids))
    assert conn.stop() == 0


async def test_columns_from_the_registry_subject(tmp_path, broker):
    topic = f"/default/delta_schema_{uuid.uuid4().hex[:8]}"
    subject = f"orders-{uuid.uuid4().hex[:6]}"
    uri = str(tmp_path / "table")
    schema = {"type": "object", "required": ["order_id", "price"], "properties": {
        "order_id": {"type": "integer"}, "price": {"type": "number"},
        "item": {"type": "string"}, "paid": {"type": "boolean"},
        "tags": {"type": "array"}}}
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await register_schema(client, subject, "json_schema", json.dumps(schema).encode())
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(
            tmp_path / "c.toml", broker, topic, uri,
            route_extra=f'expected_schema_subject = "{subject}"\n'
                        'include_danube_metadata = false'))
        await asyncio.to_thread(conn.start)
        docs = [{"order_id": 1, "price": 9.5, "item": "pen", "paid": True, "tags": ["a"]},
                {"order_id": 2, "price": 3}]
        await producer.send_many([json.dumps(d).encode() for d in docs]
                                 + [json.dumps({"order_id": 3}).encode()])
        await async_wait_for(lambda: count(uri) == 2, 60, "two rows")
        await async_wait_for(
            lambda: conn.metric("danube_connector_messages_failed_total") == 1, 30,
            "the record without a price counted as failed")
    t = table_rows(uri)
    assert t.schema.names == ["order_id", "price", "item", "paid", "tags"]
    assert str(t.schema.field("order_id").type) == "int64"
    assert not t.schema.field("price").nullable
    assert t.to_pylist() == [
        {"order_id": 1, "price": 9.5, "item": "pen", "paid": True, "tags": '["a"]'},
        {"order_id": 2, "price": 3.0, "item": None, "paid": None, "tags": None}]
    assert conn.stop() == 0


async def test_raw_columns(tmp_path, broker):
    topic = f"/default/delta_raw_{uuid.uuid4().hex[:8]}"
    uri = str(tmp_path / "table")
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, uri,
                                             route_extra=""))
        await asyncio.to_thread(conn.start)
        await producer.send(b"\x00\xffbinary", {"k": "v"}, key="key1")
        await async_wait_for(lambda: count(uri) == 1, 60, "one row")
    [r] = table_rows(uri).to_pylist()
    assert r["payload"] == b"\x00\xffbinary" and r["key"] == "key1"
    assert json.loads(r["attributes"]) == {"k": "v"}
    assert conn.stop() == 0


@pytest.fixture
def own_seaweedfs(tmp_path_factory):
    """A SeaweedFS of this test's own: it is stopped for 30 s in the middle."""
    from objstore_fixtures import serve
    from objstore_servers import SeaweedFS
    server = serve(SeaweedFS, tmp_path_factory)
    yield server
    server.close()


async def test_s3_exactly_once_across_a_kill_and_a_30s_outage(tmp_path, broker,
                                                              own_seaweedfs):
    s3 = own_seaweedfs
    topic = f"/default/delta_s3_{uuid.uuid4().hex[:8]}"
    uri = f"s3://{s3.bucket}/tables/{uuid.uuid4().hex[:8]}"
    options = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": s3.region,
               "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
               "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    total = 6000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        path = write_config(tmp_path / "c.toml", broker, topic, uri, batch_size=250,
                            delta_extra=f'storage_backend = "s3"\ns3_region = "{s3.region}"\n'
                                        f's3_endpoint = "{s3.endpoint}"\ns3_allow_http = true')
        conn = ConnectorProcess(path, env=env)
        await asyncio.to_thread(conn.start)
        await producer.send_many([row(i) for i in range(total // 2)])
        conn, _ = await kill_and_restart(conn, 1000, uri, options)
        await async_wait_for(lambda: count(uri, options) >= total // 2, 120, "half the rows")
        await asyncio.to_thread(s3.stop)
        await producer.send_many([row(i) for i in range(total // 2, total)])
        await async_wait_for(lambda: not conn.ready(), 60, "not ready while S3 is down")
        await async_wait_for(
            lambda: conn.metric("danube_connector_messages_retried_total",
                                target="external") >= 3, 60, "retries counted")
        await asyncio.sleep(30)
        await asyncio.to_thread(s3.start)
        await async_wait_for(lambda: count(uri, options) >= total, 180, "every row")
        await async_wait_for(conn.ready, 60, "ready again")
    assert checksum(uri, options) == (total, total, total * (total - 1) // 2)
    assert conn.stop() == 0
