"""Danube Connect's sink-iceberg against the real broker process, run as `danube connect
run`, writing through pyiceberg's SQL catalog on SQLite: JSON records through field
mappings into a day-partitioned table on the file system with bad records dead-lettered,
three SIGKILLs mid-stream with every row exactly once (count and checksum), a SIGKILL while
a batch's dead letters wait for the broker's ack (none lost, none twice), columns from an
Avro subject that evolves (a new optional column added to the table), raw columns, and the
round trip with a kill on S3 (SeaweedFS). The REST catalog (issue 52) on SeaweedFS's Iceberg
REST endpoint, its data files on SeaweedFS's S3: the three SIGKILLs with every row exactly
once, another writer's snapshot in between the sink's (a commit conflict), and a refused
credential or token and an unreachable catalog reported with the catalog's URI."""

import asyncio
import datetime
import io
import json
import uuid

import pyarrow.compute as pc
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from broker_process import BrokerProcess
from connector_process import Collector, ConnectorProcess, runtime_toml
from ports import free_port
from waiting import async_wait_for, wait_for
from danube.client import DanubeClient, register_schema
from danube.client.schema import schema_reference
from danube.proto import DanubeAdmin_pb2 as adm

MAPPINGS = '''field_mappings = [
    { json_path = "id", column = "id", data_type = "Int64", nullable = false },
    { json_path = "name", column = "name", data_type = "Utf8", nullable = true },
    { json_path = "detail.amount", column = "amount", data_type = "Float64" },
    { json_path = "ts", column = "ts", data_type = "Timestamp" },
]'''


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-iceberg")).start()
    yield b
    b.stop()


class Lake:
    """The catalog (SQLite) and warehouse a test's sink writes to, read back the same way."""

    def __init__(self, tmp_path, warehouse=None, storage=None):
        self.uri = f"sqlite:///{tmp_path / 'catalog.db'}"
        self.warehouse = warehouse or str(tmp_path / "warehouse")
        self.storage = storage or {}

    def toml(self):
        lines = ['[iceberg.catalog]', f'uri = "{self.uri}"',
                 f'warehouse = "{self.warehouse}"']
        if self.storage:
            lines.append("[iceberg.storage]")
            lines += [f'{k} = "{v}"' for k, v in self.storage.items()
                      if k not in ("access_key", "secret_key")]
        return "\n".join(lines)

    def catalog(self):
        props = {"uri": self.uri, "warehouse": self.warehouse}
        s = self.storage
        if s:
            props.update({"s3.endpoint": s["endpoint"], "s3.region": s["region"],
                          "s3.access-key-id": s["access_key"],
                          "s3.secret-access-key": s["secret_key"]})
        return SqlCatalog("danube_catalog", **props)

    def table(self, ident):
        try:
            return self.catalog().load_table(ident)
        except Exception:       # noqa: BLE001 - not created yet
            return None

    def rows(self, ident):
        t = self.table(ident)
        return None if t is None else t.scan().to_arrow()

    def count(self, ident):
        t = self.rows(ident)
        return 0 if t is None else t.num_rows


class RestLake:
    """A REST catalog (SeaweedFS's Iceberg endpoint) and its table bucket: the sink's
    ``[iceberg.catalog]`` for it (the credential in ICEBERG_CATALOG_CREDENTIAL, the S3 keys
    in AWS_*: ``env``), read back through pyiceberg's RestCatalog with the same properties."""

    def __init__(self, server, **catalog_keys):
        self.server = server
        self.keys = {"uri": server.catalog_uri, "warehouse": server.warehouse,
                     **catalog_keys}
        self.env = {"ICEBERG_CATALOG_CREDENTIAL": server.credential,
                    "AWS_ACCESS_KEY_ID": server.access_key,
                    "AWS_SECRET_ACCESS_KEY": server.secret_key}
        self._catalog = None

    def toml(self):
        lines = ['[iceberg.catalog]', 'type = "rest"']
        lines += [f'{k} = "{v}"' for k, v in self.keys.items()]
        lines += ["[iceberg.storage]", f'endpoint = "{self.server.endpoint}"',
                  f'region = "{self.server.region}"']
        return "\n".join(lines)

    def catalog(self):
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog
            self._catalog = load_catalog("check", **self.server.catalog_properties())
        return self._catalog

    def table(self, ident):
        try:
            return self.catalog().load_table(ident)
        except Exception:       # noqa: BLE001 - not created yet
            return None

    def rows(self, ident):
        t = self.table(ident)
        return None if t is None else t.scan().to_arrow()

    def count(self, ident):
        """The current snapshot's total-records: one metadata read, not a scan."""
        t = self.table(ident)
        snap = t and t.current_snapshot()
        return int(snap.summary["total-records"]) if snap else 0


def write_config(path, broker, topic, lake, *, route_extra=MAPPINGS, dlq=None,
                 batch_size=200):
    head = runtime_toml("sink-iceberg", f"http://{broker.client_addr}",
                        f"ice-{uuid.uuid4().hex[:8]}", dlq=dlq, batch_size=batch_size,
                        batch_timeout_ms=200)
    path.write_text(f'''{head}
{lake.toml()}

[[iceberg.routes]]
from = "{topic}"
subscription = "iceberg-sink"
{route_extra}
''')
    return path


def row(i):
    return json.dumps({"id": i, "name": f"n{i}", "detail": {"amount": i * 0.5},
                       "ts": f"2026-11-{1 + i % 3:02d}T10:00:00Z"}).encode()


async def make_topic(client, topic, **kwargs):
    """A reliable producer on ``topic`` (which creates it: a sink waits for its topic)."""
    return await client.create_producer(topic, f"p-{uuid.uuid4().hex[:6]}", reliable=True,
                                        **kwargs)


def checksum(lake, ident):
    t = lake.rows(ident)
    ids = t.column("id")
    return t.num_rows, len(pc.unique(ids)), pc.sum(ids).as_py()


async def test_round_trip_partitioned_with_dead_letters(tmp_path, broker):
    name = f"ice_{uuid.uuid4().hex[:8]}"
    topic, ident = f"/default/{name}", ("default", name)
    dlq = f"/default/dlq_{uuid.uuid4().hex[:8]}"
    lake = Lake(tmp_path)
    good = [row(i) for i in range(90)]
    bad = [b"{not json", json.dumps({"id": "seven"}).encode(),
           json.dumps({"name": "no id"}).encode()]
    spec = 'partition_spec = [{ column = "ts", transform = "day" }]'
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await client.create_producer(dlq, "dlq-maker", reliable=True)
        dead = await client.subscribe(dlq, "d", "s", "exclusive")
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, lake,
                                             route_extra=MAPPINGS + "\n" + spec, dlq=dlq))
        await asyncio.to_thread(conn.start)
        await producer.send_many(good[:45] + bad + good[45:])
        await async_wait_for(lambda: lake.count(ident) == 90, 60, "90 rows")
        letters = [await dead.receive(timeout=30) for _ in range(3)]
    table = lake.table(ident)
    t = table.scan().to_arrow()
    assert sorted(t.column("id").to_pylist()) == list(range(90))
    assert sorted(set(t.column("amount").to_pylist()))[:2] == [0.0, 0.5]
    assert [f.name for f in table.schema().fields] == [
        "id", "name", "amount", "ts", "_danube_metadata"]
    assert table.schema().find_field("id").required
    [part] = table.spec().fields
    assert (part.name, str(part.transform)) == ("ts_day", "day")
    # Three days: the rows are in (at least) three data files, one per partition.
    files = table.inspect.files()
    assert {p["ts_day"] for p in files.column("partition").to_pylist()} == {
        datetime.date(2026, 11, d) for d in (1, 2, 3)}
    meta = json.loads(t.filter(pc.equal(t.column("id"), 0)).column(
        "_danube_metadata")[0].as_py())
    assert meta["topic"] == topic and meta["offset"] == 0
    assert [m.payload for m in letters] == bad
    reasons = [m.attributes["dlq.reason"] for m in letters]
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "field 'id' (column 'id', Int64): expected an integer, got str"
    assert reasons[2].startswith("field 'id' (column 'id') is missing")
    assert [int(m.attributes["dlq.offset"]) for m in letters] == [45, 46, 47]
    assert conn.metric("danube_connector_messages_dead_lettered_total") == 3
    assert conn.metric("danube_connector_messages_processed_total") == 90
    # The offsets the sink resumes from are in the snapshot's summary.
    summary = table.current_snapshot().summary.additional_properties
    [offsets] = [json.loads(v) for k, v in summary.items() if k.startswith("danube.offsets.")]
    assert offsets == {topic: 92}
    assert conn.stop() == 0


async def kill_and_restart(conn, at_least, lake, ident, timeout=120):
    await async_wait_for(lambda: lake.count(ident) >= at_least, timeout,
                         f"{at_least} rows before the kill")
    conn.sigkill()
    again = ConnectorProcess(conn.config_path, env=conn.env)
    await asyncio.to_thread(again.start, timeout=max(60, timeout // 2))
    return again


@pytest.fixture(scope="module")
def seaweed_iceberg(tmp_path_factory):
    """SeaweedFS with its Iceberg REST catalog (tests/support/iceberg_rest.py)."""
    from iceberg_rest import SeaweedIceberg
    from objstore_fixtures import serve
    server = serve(SeaweedIceberg, tmp_path_factory)
    yield server
    server.close()


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("catalog", ["sql", "rest"])
async def test_three_sigkills_exactly_once(tmp_path, broker, catalog, request):
    """Each batch is one snapshot carrying the partition's offset in its summary: killed
    three times mid-stream, the table ends with every row once. ``rest``: the catalog is
    SeaweedFS's Iceberg REST endpoint (the summary goes through its commit API and back),
    the data files are on its S3."""
    name = f"ice_kill_{uuid.uuid4().hex[:8]}"
    topic, ident = f"/default/{name}", ("default", name)
    env = None
    if catalog == "rest":
        lake = RestLake(request.getfixturevalue("seaweed_iceberg"))
        env = lake.env
    else:
        lake = Lake(tmp_path)
    total = 8000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, lake,
                                             batch_size=250), env=env)
        try:
            await asyncio.to_thread(conn.start, timeout=120)
            feeding = asyncio.ensure_future(
                producer.send_many([row(i) for i in range(total)]))
            for at_least in (1000, 3000, 5000):
                conn = await kill_and_restart(conn, at_least, lake, ident, timeout=300)
            await feeding
            await async_wait_for(lambda: lake.count(ident) >= total, 600, "every row")
            assert checksum(lake, ident) == (total, total, total * (total - 1) // 2)
            # The last restart resumed from the offsets in the table (not from nothing).
            assert any(r.get("msg", "").startswith("resuming after")
                       for r in conn.records())
            assert conn.metric("danube_connector_messages_processed_total") < total
            assert conn.stop() == 0
        finally:
            conn.stop()         # a failure above must not leave the sink running
    assert checksum(lake, ident) == (total, total, total * (total - 1) // 2)
    table = lake.table(ident)
    summary = table.current_snapshot().summary.additional_properties
    [offsets] = [json.loads(v) for k, v in summary.items() if k.startswith("danube.offsets.")]
    assert offsets == {topic: total - 1}
    if catalog == "rest":
        files = table.inspect.files().column("file_path").to_pylist()
        assert files and all(f.startswith(f"{lake.server.warehouse}/") for f in files)


def refused(i):
    """A record the sink refuses (``id`` is not an integer), told apart by ``i``."""
    return json.dumps({"id": f"bad-{i}", "name": f"n{i}"}).encode()


def retrying_dead_letters(conn):
    return any(r.get("msg", "").startswith("dead-letter publish failed")
               for r in conn.records())


async def test_sigkill_before_the_dead_letters_are_acknowledged(tmp_path, broker, admin):
    """Issue 51: the sink is killed while the broker has not acknowledged a batch's dead
    letters (the dead-letter topic's namespace does not exist yet: the broker answers
    UNAVAILABLE and the sink retries the publish). The batch's snapshot, whose summary
    carries its last offset, waits for that ack: restarted once the namespace exists, the
    sink writes the batch again. Every good row once, every refused record in the
    dead-letter topic once."""
    ns = f"dlq_{uuid.uuid4().hex[:8]}"
    dlq = f"/{ns}/dead"
    name = f"ice_dlq_{uuid.uuid4().hex[:8]}"
    topic, ident = f"/default/{name}", ("default", name)
    lake = Lake(tmp_path)
    total = 1000
    bad = [i for i in range(total) if i % 50 == 25]
    payloads = [refused(i) if i in bad else row(i) for i in range(total)]
    good = total - len(bad)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, lake,
                                             dlq=dlq, batch_size=100))
        await asyncio.to_thread(conn.start)
        await producer.send_many(payloads)
        await async_wait_for(lambda: retrying_dead_letters(conn), 120,
                             "the sink retrying its dead-letter publish")
        conn.sigkill()
        # Nothing at or past a refused record whose dead letter is not acknowledged is
        # committed (the offsets are the ids: the topic's offsets start at 0).
        t = lake.rows(ident)
        written = [] if t is None else t.column("id").to_pylist()
        assert all(i < bad[0] for i in written), \
            f"committed up to id {max(written)} before the dead letter of {bad[0]} was acked"
        await admin.call("NamespaceAdmin", "CreateNamespace", adm.NamespaceRequest(name=ns))
        dead = await Collector(client, dlq, create_topic=True).start()
        conn = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn.start)
        await async_wait_for(lambda: lake.count(ident) >= good, 120, "every good row")
        # Each batch's dead letters are acknowledged before its snapshot: all of them are
        # in the topic once the last row is in the table.
        assert conn.metric("danube_connector_messages_dead_lettered_total") == len(bad)
        await async_wait_for(lambda: len(dead.messages) >= len(bad), 60, "every dead letter")
        await dead.stop()
    assert sorted(int(m.attributes["dlq.offset"]) for m in dead.messages) == bad
    assert sorted(m.payload for m in dead.messages) == sorted(refused(i) for i in bad)
    ids = [i for i in range(total) if i not in bad]
    assert checksum(lake, ident) == (good, good, sum(ids))
    assert conn.stop() == 0


def avro_datum(schema, doc):
    import fastavro
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), doc)
    return buf.getvalue()


async def test_avro_subject_and_schema_evolution(tmp_path, broker):
    """Columns from an Avro subject's latest version; a record stamped with a newer version
    (a new optional field) makes the sink add the column to the table; the old rows have
    none. A column of the wrong type for the table stops the sink with the column named."""
    name = f"ice_avro_{uuid.uuid4().hex[:8]}"
    topic, ident = f"/default/{name}", ("default", name)
    subject = f"orders-{uuid.uuid4().hex[:6]}"
    lake = Lake(tmp_path)
    v1 = {"type": "record", "name": "Order", "fields": [
        {"name": "order_id", "type": "long"}, {"name": "price", "type": "double"},
        {"name": "paid", "type": ["null", "boolean"], "default": None}]}
    v2 = dict(v1, fields=v1["fields"] + [
        {"name": "item", "type": ["null", "string"], "default": None}])
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await register_schema(client, subject, "avro", json.dumps(v1).encode())
        producer = await make_topic(client, topic, schema=schema_reference(subject))
        conn = ConnectorProcess(write_config(
            tmp_path / "c.toml", broker, topic, lake,
            route_extra=f'expected_schema_subject = "{subject}"\n'
                        'include_danube_metadata = false'))
        await asyncio.to_thread(conn.start)
        await producer.send(avro_datum(v1, {"order_id": 1, "price": 9.5, "paid": True}))
        await async_wait_for(lambda: lake.count(ident) == 1, 60, "the first row")
        assert lake.table(ident).schema().column_names == ["order_id", "price", "paid"]
        await register_schema(client, subject, "avro", json.dumps(v2).encode())
        p2 = await make_topic(client, topic, schema=schema_reference(subject))
        await p2.send(avro_datum(v2, {"order_id": 2, "price": 3.0, "paid": None,
                                      "item": "pen"}))
        await async_wait_for(lambda: lake.count(ident) == 2, 60, "the second row")
    table = lake.table(ident)
    assert table.schema().column_names == ["order_id", "price", "paid", "item"]
    assert not table.schema().find_field("item").required
    assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["order_id"]) == [
        {"order_id": 1, "price": 9.5, "paid": True, "item": None},
        {"order_id": 2, "price": 3.0, "paid": None, "item": "pen"}]
    assert conn.stop() == 0

    # The same table, now with a mapping that makes order_id text: Iceberg cannot change
    # long to string, so the sink stops at start naming the column.
    bad = ConnectorProcess(write_config(
        tmp_path / "bad.toml", broker, topic, lake,
        route_extra='include_danube_metadata = false\nfield_mappings = [\n'
                    '  { json_path = "order_id", column = "order_id", data_type = "Utf8" },\n'
                    '  { json_path = "price", column = "price", data_type = "Float64" },\n]'))
    with pytest.raises(AssertionError, match="cannot evolve so.*order_id"):
        await asyncio.to_thread(bad.start)
    assert bad.proc.wait(30) == 1


async def test_raw_columns(tmp_path, broker):
    name = f"ice_raw_{uuid.uuid4().hex[:8]}"
    topic = f"/default/{name}"
    lake = Lake(tmp_path)
    ident = ("lake", "raw_events")
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(
            tmp_path / "c.toml", broker, topic, lake,
            route_extra='namespace = "lake"\ntable_name = "raw_events"'))
        await asyncio.to_thread(conn.start)
        await producer.send(b"\x00\xffbinary", {"k": "v"}, key="key1")
        await async_wait_for(lambda: lake.count(ident) == 1, 60, "one row")
    [r] = lake.rows(ident).to_pylist()
    assert r["payload"] == b"\x00\xffbinary" and r["key"] == "key1"
    assert json.loads(r["attributes"]) == {"k": "v"}
    assert conn.stop() == 0


def test_config_errors_name_the_key(tmp_path, broker):
    lake = Lake(tmp_path)
    cases = [
        ('partition_spec = [{ column = "ts", transform = "weekly" }]',
         "partition_spec: [0].transform: 'weekly' is not one of"),
        (MAPPINGS + '\npartition_spec = [{ column = "nope", transform = "identity" }]',
         "partition_spec column 'nope' is not a column"),
        ('table_name = "bad name"', "iceberg.routes[0].table_name: 'bad name'"),
        ('field_mappings = [{ json_path = "n", column = "n", data_type = "UInt64" }]',
         "UInt64 has no Iceberg type"),
    ]
    for extra, message in cases:
        done = ConnectorProcess(write_config(tmp_path / "c.toml", broker, "/default/x",
                                             lake, route_extra=extra)).run_to_exit()
        assert done.returncode == 2, done.stderr
        assert message in done.stderr, done.stderr


@pytest.fixture
def own_seaweedfs(tmp_path_factory):
    from objstore_fixtures import serve
    from objstore_servers import SeaweedFS
    server = serve(SeaweedFS, tmp_path_factory)
    yield server
    server.close()


@pytest.mark.timeout(600)
async def test_s3_round_trip_exactly_once_across_a_kill(tmp_path, broker, own_seaweedfs):
    s3 = own_seaweedfs
    name = f"ice_s3_{uuid.uuid4().hex[:8]}"
    topic, ident = f"/default/{name}", ("default", name)
    lake = Lake(tmp_path, warehouse=f"s3://{s3.bucket}/warehouse",
                storage={"endpoint": s3.endpoint, "region": s3.region,
                         "access_key": s3.access_key, "secret_key": s3.secret_key})
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    total = 3000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, lake,
                                             batch_size=250), env=env)
        await asyncio.to_thread(conn.start)
        await producer.send_many([row(i) for i in range(total)])
        conn = await kill_and_restart(conn, 1000, lake, ident)
        await async_wait_for(lambda: lake.count(ident) >= total, 180, "every row")
    assert checksum(lake, ident) == (total, total, total * (total - 1) // 2)
    files = lake.table(ident).inspect.files().column("file_path").to_pylist()
    assert files and all(f.startswith(f"s3://{s3.bucket}/warehouse/") for f in files)
    assert conn.stop() == 0


def conflicted(conn):
    """The sink's commit was refused for another writer's snapshot and made again (by
    pyiceberg's own retry on the table refreshed, or the sink's on the table reloaded)."""
    return any(r.get("msg", "").startswith(("Commit failed due to a concurrent update",
                                            "Iceberg commit conflict"))
               for r in conn.records())


@pytest.mark.timeout(900)
async def test_rest_commit_conflict_with_another_writer(tmp_path, broker, seaweed_iceberg):
    """Another writer appends a snapshot (no offsets in its summary) while the sink holds
    the table: the sink's next commit is refused by the catalog (409, its snapshot's parent
    is no longer the table's) and made again; a restart then finds the sink's offsets
    below the other writer's snapshot. Every row once, the other writer's too."""
    import pyarrow as pa
    name = f"ice_conflict_{uuid.uuid4().hex[:8]}"
    topic, ident = f"/default/{name}", ("default", name)
    lake = RestLake(seaweed_iceberg)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, lake,
                                             batch_size=100), env=lake.env)
        await asyncio.to_thread(conn.start, timeout=120)
        await producer.send_many([row(i) for i in range(300)])
        await async_wait_for(lambda: lake.count(ident) >= 300, 300, "the first 300 rows")
        table = lake.table(ident)
        other = pa.Table.from_pylist(
            [{"id": -i, "name": "other", "amount": None, "ts": None,
              "_danube_metadata": "{}"} for i in range(1, 6)],
            schema=table.schema().as_arrow())
        table.append(other)
        await producer.send_many([row(i) for i in range(300, 600)])
        await async_wait_for(lambda: lake.count(ident) >= 605, 300, "every row")
        assert conflicted(conn), conn.log()
        conn.sigkill()
        # Restarted above the other writer's snapshot: resumes from the sink's offsets.
        conn = ConnectorProcess(conn.config_path, env=lake.env)
        await asyncio.to_thread(conn.start, timeout=120)
        await producer.send_many([row(i) for i in range(600, 700)])
        await async_wait_for(lambda: lake.count(ident) >= 705, 300, "the last rows")
    ids = sorted(lake.rows(ident).column("id").to_pylist())
    assert ids == [-5, -4, -3, -2, -1] + list(range(700))
    assert any(r.get("msg", "").startswith("resuming after") for r in conn.records())
    assert conn.stop() == 0


def test_rest_catalog_errors_name_the_uri(tmp_path, broker, seaweed_iceberg):
    """A refused credential or token stops the sink (exit 1) naming the catalog's URI; an
    unreachable catalog is waited for (not ready, retried) with its URI in the log, and a
    SIGTERM then stops it cleanly; REST keys on the sql catalog are configuration errors."""
    s = seaweed_iceberg
    uri = s.catalog_uri
    wrong = RestLake(s)
    wrong.env["ICEBERG_CATALOG_CREDENTIAL"] = f"{s.access_key}:not-the-secret"
    done = ConnectorProcess(write_config(tmp_path / "wrong.toml", broker, "/default/x",
                                         wrong), env=wrong.env).run_to_exit(timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"Iceberg REST catalog {uri} refused the credential" in out, out

    token = RestLake(s, token="not-a-token")
    token.env.pop("ICEBERG_CATALOG_CREDENTIAL")
    done = ConnectorProcess(write_config(tmp_path / "token.toml", broker, "/default/x",
                                         token), env=token.env).run_to_exit(timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"Iceberg REST catalog {uri} refused the token" in out, out

    nowhere = f"http://127.0.0.1:{free_port()}"
    gone = RestLake(s, uri=nowhere)
    conn = ConnectorProcess(write_config(tmp_path / "gone.toml", broker, "/default/x", gone),
                            env=gone.env).start(ready=False, timeout=120)
    try:
        wait_for(lambda: any(f"Iceberg REST catalog {nowhere} unreachable" in
                             r.get("msg", "") + str(r.get("error", ""))
                             for r in conn.records()) or conn._died(), 300,
                 "the sink reporting the unreachable catalog")
        assert not conn.ready()
    finally:
        assert conn.stop(timeout=300) == 0, conn.log()

    for lake, message in [
            (RestLake(s, uri="sqlite:////tmp/catalog.db"),
             "iceberg.catalog.uri: 'sqlite:////tmp/catalog.db': a REST catalog's URI is its "
             "http:// or https:// base URL"),
            (RestLake(s, token="t"), "iceberg.catalog: credential and token are two ways"),
    ]:
        done = ConnectorProcess(write_config(tmp_path / "bad.toml", broker, "/default/x",
                                             lake), env=lake.env).run_to_exit(timeout=300)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr, done.stderr
    sql = Lake(tmp_path)
    (tmp_path / "sql.toml").write_text(
        write_config(tmp_path / "sql.toml", broker, "/default/x", sql).read_text().replace(
            "[iceberg.catalog]", '[iceberg.catalog]\ntoken = "t"'))
    done = ConnectorProcess(tmp_path / "sql.toml").run_to_exit(timeout=300)
    assert done.returncode == 2, done.stderr
    assert "iceberg.catalog.token: a REST catalog key" in done.stderr, done.stderr
