"""Danube Connect's sink-postgres against a real PostgreSQL (its own cluster) and the real
broker process, run as `danube connect run`: JSON records upserted by key, the last of a
key winning, bad records (not JSON, no key, a value PostgreSQL refuses) dead-lettered with
the reason; a SIGKILL mid-stream of 10,000 (every key once, nothing lost); a SIGKILL while a
batch's dead letters wait for the broker's ack (none lost); PostgreSQL down for 30 s
(retries counted, not ready, nothing lost); the table created from the configuration and
change events of source-postgres-cdc replayed into it (a table mirrored, deletes too);
configurations refused with the problem named."""

import asyncio
import json
import time
import uuid

import psycopg
import pytest

from broker_process import BrokerProcess
from connector_process import Collector, ConnectorProcess, runtime_toml
from postgres_process import Postgres, pg, sql  # noqa: F401 - pg: a fixture
from waiting import async_wait_for
from danube.client import DanubeClient
from danube.proto import DanubeAdmin_pb2 as adm


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-pgsink")).start()
    yield b
    b.stop()


def query(pg, statement):
    with psycopg.connect(pg.url, autocommit=True, connect_timeout=2) as c:
        return c.execute(statement).fetchall()


def count(pg, table):
    try:
        return query(pg, f"SELECT count(*) FROM {table}")[0][0]
    except psycopg.OperationalError:
        return -1


def write_config(path, broker, pg, topic, table, *, dlq="", batch_size=200, route_extra=""):
    head = runtime_toml("sink-postgres", f"http://{broker.client_addr}",
                        f"pgs-{uuid.uuid4().hex[:8]}", dlq=dlq, batch_size=batch_size,
                        batch_timeout_ms=100)
    path.write_text(f'''{head}
[postgres]
connection_url = "{pg.url}"

[[postgres.routes]]
from = "{topic}"
subscription = "pg-sink"
to = "{table}"
{route_extra}
''')
    return path


def row(i, version=0):
    return json.dumps({"id": i, "name": f"n{i}", "qty": i * 10 + version,
                       "meta": {"v": version}, "ignored": True}).encode()


async def make_topic(client, topic):
    return await client.create_producer(topic, f"p-{uuid.uuid4().hex[:6]}", reliable=True)


def new_table(pg):
    table = f"items_{uuid.uuid4().hex[:6]}"
    sql(pg, f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text NOT NULL, qty int, "
            f"meta jsonb, created timestamptz DEFAULT now())")
    return table


async def test_upserts_and_dead_letters(tmp_path, broker, pg):
    table = new_table(pg)
    topic = f"/default/{table}"
    dlq = f"/default/dlq_{table}"
    bad = [b"{not json", b"[1, 2]", json.dumps({"name": "no id"}).encode(),
           json.dumps({"id": 7000, "name": "x", "qty": "lots"}).encode(),
           json.dumps({"id": 7001, "qty": 1}).encode()]
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await client.create_producer(dlq, "dlq-maker", reliable=True)
        dead = await client.subscribe(dlq, "d", "s", "exclusive")
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, pg, topic, table,
                                             dlq=dlq))
        await asyncio.to_thread(conn.start)
        # Keys 0-99, then bad records, then keys 0-49 again with version 1: upserts.
        await producer.send_many([row(i) for i in range(100)] + bad +
                                 [row(i, 1) for i in range(50)])
        letters = [await dead.receive(timeout=60) for _ in range(len(bad))]
        await async_wait_for(lambda: conn.metric("danube_connector_messages_processed_total")
                             >= 150, 60, "150 records written")
    rows = query(pg, f"SELECT id, name, qty, meta, created IS NOT NULL FROM {table} "
                     f"ORDER BY id")
    assert [r[0] for r in rows] == list(range(100))
    assert rows[3] == (3, "n3", 31, {"v": 1}, True)
    assert rows[70] == (70, "n70", 700, {"v": 0}, True)
    by_payload = {m.payload: m.attributes["dlq.reason"] for m in letters}
    assert sorted(by_payload) == sorted(bad)
    assert by_payload[bad[0]].startswith("invalid JSON")
    assert by_payload[bad[1]] == "expected a JSON object, not list"
    assert by_payload[bad[2]] == "key column 'id' missing or null"
    assert "PostgreSQL refused the row" in by_payload[bad[3]] and \
        "invalid input syntax for type integer" in by_payload[bad[3]]
    assert "null value in column \"name\"" in by_payload[bad[4]]
    assert {m.attributes["dlq.source_topic"] for m in letters} == {topic}
    assert conn.metric("danube_connector_messages_dead_lettered_total") == len(bad)
    assert conn.stop() == 0


async def test_sigkill_mid_stream_every_key_once(tmp_path, broker, pg):
    table = new_table(pg)
    topic = f"/default/{table}"
    total = 10000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, pg, topic, table,
                                             batch_size=250))
        await asyncio.to_thread(conn.start)
        feeding = asyncio.ensure_future(producer.send_many([row(i) for i in range(total)]))
        await async_wait_for(lambda: count(pg, table) >= 2000, 120, "2,000 rows")
        conn.sigkill()
        assert count(pg, table) < total, "the stream was written before the kill"
        conn = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn.start)
        await feeding
        await async_wait_for(lambda: count(pg, table) >= total, 180, "every row")
    assert conn.stop() == 0
    assert query(pg, f"SELECT count(*), count(DISTINCT id), sum(id), sum(qty) FROM "
                     f"{table}")[0] == (total, total, total * (total - 1) // 2,
                                        10 * total * (total - 1) // 2)


def refused(i):
    """A record the sink refuses, told apart by ``i``: without its key (refused when
    parsed), or with a quantity PostgreSQL refuses (found in the transaction)."""
    if i % 100 == 25:
        return json.dumps({"name": f"no id {i}"}).encode()
    return json.dumps({"id": 100000 + i, "name": f"n{i}", "qty": f"lots-{i}"}).encode()


async def test_sigkill_before_the_dead_letters_are_acknowledged(tmp_path, broker, pg, admin):
    """Issue 51: the sink is killed while the broker has not acknowledged a batch's dead
    letters (the dead-letter topic's namespace does not exist yet: the broker answers
    UNAVAILABLE and the sink retries the publish). sink-postgres is at least once: its
    progress is the subscription's, acknowledged only after the dead letters, so the
    restarted sink gets the batch again and upserts it again. Every good key once, every
    refused record in the dead-letter topic."""
    ns = f"dlq_{uuid.uuid4().hex[:8]}"
    dlq = f"/{ns}/dead"
    table = new_table(pg)
    topic = f"/default/{table}"
    total = 1000
    bad = [i for i in range(total) if i % 50 == 25]
    payloads = [refused(i) if i in bad else row(i) for i in range(total)]
    good = total - len(bad)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, pg, topic, table,
                                             dlq=dlq, batch_size=100))
        await asyncio.to_thread(conn.start)
        await producer.send_many(payloads)
        await async_wait_for(
            lambda: any(r.get("msg", "").startswith("dead-letter publish failed")
                        for r in conn.records()), 120,
            "the sink retrying its dead-letter publish")
        conn.sigkill()
        await admin.call("NamespaceAdmin", "CreateNamespace", adm.NamespaceRequest(name=ns))
        dead = await Collector(client, dlq, create_topic=True).start()
        conn = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn.start)
        await async_wait_for(lambda: count(pg, table) >= good, 120, "every good row")
        await async_wait_for(lambda: len(dead.messages) >= len(bad), 60, "every dead letter")
        await async_wait_for(lambda: conn.metric(
            "danube_connector_messages_processed_total") >= good, 60, "every record written")
        await dead.stop()
    assert sorted(int(m.attributes["dlq.offset"]) for m in dead.messages) == bad
    assert sorted(m.payload for m in dead.messages) == sorted(refused(i) for i in bad)
    ids = [i for i in range(total) if i not in bad]
    assert query(pg, f"SELECT count(*), count(DISTINCT id), sum(id) FROM {table}")[0] == \
        (good, good, sum(ids))
    assert conn.stop() == 0


async def test_postgres_down_30s(tmp_path, broker):
    pg = Postgres().start()
    try:
        table = new_table(pg)
        topic = f"/default/{table}"
        async with DanubeClient(f"http://{broker.client_addr}") as client:
            producer = await make_topic(client, topic)
            conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, pg, topic,
                                                 table))
            await asyncio.to_thread(conn.start)
            await producer.send_many([row(i) for i in range(100)])
            await async_wait_for(lambda: count(pg, table) == 100, 60, "the first 100")
            await asyncio.to_thread(pg.stop)
            down_since = time.monotonic()
            await producer.send_many([row(i) for i in range(100, 300)])
            await async_wait_for(lambda: conn.metric(
                "danube_connector_messages_retried_total", target="external") >= 2, 60,
                "retries counted")
            await async_wait_for(lambda: not conn.ready(), 60, "not ready while down")
            await asyncio.sleep(max(0.0, 30 - (time.monotonic() - down_since)))
            await asyncio.to_thread(pg.start)
            await async_wait_for(lambda: count(pg, table) == 300, 90, "every row after")
            await async_wait_for(conn.ready, 60, "ready again")
        assert conn.metric("danube_connector_health") == 1
        assert conn.metric("danube_connector_messages_processed_total") == 300
        assert conn.stop() == 0
    finally:
        pg.close()


async def test_a_dropped_table_stops_the_connector_with_nothing_acknowledged(tmp_path,
                                                                             broker, pg):
    """An error no retry fixes (the table dropped) stops the connector (exit 1) instead of
    dead-lettering every record: once the table is back, a restart writes them."""
    table = new_table(pg)
    topic = f"/default/{table}"
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, pg, topic, table,
                                             dlq=f"/default/dlq_{table}"))
        await asyncio.to_thread(conn.start)
        await producer.send_many([row(i) for i in range(10)])
        await async_wait_for(lambda: count(pg, table) == 10, 60, "the first 10")
        sql(pg, f"DROP TABLE {table}")
        await producer.send_many([row(i) for i in range(10, 20)])
        await async_wait_for(lambda: conn.proc.poll() is not None, 60, "the connector to stop")
        assert conn.proc.returncode == 1
        assert "does not exist" in conn.log()
        sql(pg, f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text NOT NULL, qty int, "
                f"meta jsonb, created timestamptz DEFAULT now())")
        conn = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn.start)
        await async_wait_for(lambda: count(pg, table) == 10, 60, "the 10 sent meanwhile")
    assert [r[0] for r in query(pg, f"SELECT id FROM {table} ORDER BY id")] == \
        list(range(10, 20))
    assert conn.metric("danube_connector_messages_dead_lettered_total") == 0
    assert conn.stop() == 0


async def test_created_table_mirrors_a_cdc_stream(tmp_path, broker, pg):
    """source-postgres-cdc -> topic -> sink-postgres (format "cdc") into a table it
    creates: inserts, updates and deletes arrive as in the source table."""
    source = f"src_{uuid.uuid4().hex[:6]}"
    mirror = f"mirror_{source}"
    topic = f"/default/{source}"
    sql(pg, f"CREATE TABLE {source} (id int PRIMARY KEY, name text, tags jsonb)")
    name = f"cdc-{uuid.uuid4().hex[:8]}"
    slot = name.replace("-", "_")
    (tmp_path / "cdc.toml").write_text(f'''
connector = "source-postgres-cdc"
danube_service_url = "http://{broker.client_addr}"
connector_name = "{name}"
[processing]
metrics_port = 0
metrics_host = "127.0.0.1"
poll_interval_ms = 20
[postgres]
connection_url = "{pg.url}"
slot_name = "{slot}"
publication_name = "{slot}"
[[postgres.routes]]
table = "{source}"
to = "{topic}"
''')
    columns = ('columns = [{ name = "id", type = "int" }, { name = "name", type = "text" }, '
               '{ name = "tags", type = "jsonb" }]\ncreate_table = true\nformat = "cdc"')
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await make_topic(client, topic)
        sink = ConnectorProcess(write_config(tmp_path / "sink.toml", broker, pg, topic,
                                             mirror, route_extra=columns))
        await asyncio.to_thread(sink.start)
        cdc = ConnectorProcess(tmp_path / "cdc.toml")
        await asyncio.to_thread(cdc.start)
        sql(pg, f"INSERT INTO {source} SELECT g, 'n' || g, '[1]' FROM generate_series(1, 50) g",
            f"UPDATE {source} SET name = 'changed' WHERE id <= 10",
            f"DELETE FROM {source} WHERE id > 40",
            f"UPDATE {source} SET id = 100 WHERE id = 20")      # the key moves
        want = query(pg, f"SELECT id, name, tags FROM {source} ORDER BY id")
        await async_wait_for(lambda: query(pg, f"SELECT id, name, tags FROM {mirror} "
                                               f"ORDER BY id") == want, 60, "the mirror")
    assert len(want) == 40 and want[0] == (1, "changed", [1]) and want[-1][0] == 100
    assert cdc.stop() == 0
    assert sink.stop() == 0


@pytest.mark.parametrize("setup,extra,needle", [
    ([], "", "postgres.routes[0].to: no table public.t_missing"),
    (["CREATE TABLE t_nokey (a int, b int)"], "", "has no primary key"),
    (["CREATE TABLE t_nouniq (a int PRIMARY KEY, b int)"], 'key_columns = ["b"]',
     "no unique index of public.t_nouniq on (b)"),
    ([], 'create_table = true', "create_table needs the columns"),
    ([], 'create_table = true\ncolumns = [{ name = "id", type = "no_such_type" }]',
     "columns[0].type: 'no_such_type'"),
])
def test_bad_configuration_names_the_problem(tmp_path, broker, pg, setup, extra, needle):
    if setup:
        sql(pg, *setup)
    table = {"has no primary key": "t_nokey", "no unique index": "t_nouniq"}
    name = next((t for k, t in table.items() if k in needle), "t_missing")
    path = write_config(tmp_path / "bad.toml", broker, pg, "/default/x", name,
                        route_extra=extra)
    result = ConnectorProcess(path).run_to_exit()
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
