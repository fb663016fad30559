"""Danube Connect's sink-surrealdb against the real broker process, run as `danube connect
run`, writing to SurrealDB's embedded engine (the `surrealdb` SDK's, on disk, in the sink's
process: the test reads the database back once the sink stopped): documents with their
record ids (the `record_id` attribute, the document's `id`, else [partition, offset]),
TimeSeries' `_timestamp` and the Danube metadata; records SurrealDB refuses (a SCHEMAFULL
table's field of the wrong type) and records that are not JSON objects in the dead-letter
topic with the reason; three SIGKILLs in the middle of a stream with every record there once
(count and ids); and the sink's rate against the SDK writing the same records itself."""

import asyncio
import json
import uuid

import pytest
from surrealdb import AsyncSurreal

from broker_process import BrokerProcess
from connector_process import ConnectorProcess, runtime_toml
from topic_stats import subscription_stats
from waiting import async_wait_for
from danube.client import DanubeClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-surrealdb")).start()
    yield b
    b.stop()


def write_config(path, broker, topic, store, *, dlq=None, batch_size=200, route_extra=""):
    head = runtime_toml("sink-surrealdb", f"http://{broker.client_addr}",
                        f"surreal-{uuid.uuid4().hex[:8]}", dlq=dlq, batch_size=batch_size,
                        batch_timeout_ms=200)
    path.write_text(f'''{head}
[surrealdb]
url = "file://{store}"
namespace = "danube"
database = "events"

[[surrealdb.routes]]
from = "{topic}"
subscription = "surreal-sink"
subscription_type = "Exclusive"
to = "events"
{route_extra}
''')
    return path


async def query(store, statement, variables=None):
    """``statement``'s result on the database at ``store`` (the sink must have stopped)."""
    db = AsyncSurreal(f"file://{store}")
    await db.connect()
    try:
        await db.use("danube", "events")
        return await db.query(statement, variables or {})
    finally:
        await db.close()


async def make_topic(client, topic):
    return await client.create_producer(topic, f"p-{uuid.uuid4().hex[:6]}", reliable=True)


async def acked_through(admin, topic, offset):
    sub = await subscription_stats(admin, topic, "surreal-sink")
    return sub is not None and sub.cursor >= offset


def doc(i):
    return json.dumps({"n": i, "kind": "click", "user": {"id": i % 7}}).encode()


async def test_round_trip_with_dead_letters(tmp_path, broker, admin):
    topic = f"/default/sr_{uuid.uuid4().hex[:8]}"
    dlq = f"/default/dlq_{uuid.uuid4().hex[:8]}"
    store = tmp_path / "surreal"
    # A table that refuses some documents: `n` must be an integer.
    await query(store, "DEFINE TABLE events SCHEMALESS; DEFINE FIELD n ON events TYPE int;")
    bad = [b"{not json", b"[1, 2]", json.dumps({"n": "lots"}).encode()]
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await client.create_producer(dlq, "dlq-maker", reliable=True)
        dead = await client.subscribe(dlq, "d", "s", "exclusive")
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, store,
                                             dlq=dlq,
                                             route_extra='storage_mode = "TimeSeries"'))
        await asyncio.to_thread(conn.start)
        await producer.send_many([doc(i) for i in range(20)] + bad)              # 0-22
        await producer.send(json.dumps({"n": 100}).encode(), {"record_id": "evt-100"})
        await producer.send(json.dumps({"id": "own-101", "n": 101}).encode())   # 24
        await producer.send_many([doc(i) for i in range(20, 40)])               # 25-44
        await async_wait_for(lambda: acked_through(admin, topic, 44), 60,
                             "every record acknowledged")
        letters = [await dead.receive(timeout=30) for _ in range(3)]
        assert conn.metric("danube_connector_messages_dead_lettered_total") == 3
        assert conn.metric("danube_connector_messages_processed_total") == 42
        assert conn.stop() == 0
    rows = await query(store, "SELECT * FROM events")
    assert len(rows) == 42
    by_id = {r["id"].id if isinstance(r["id"].id, str) else tuple(r["id"].id): r
             for r in rows}
    offsets = list(range(20)) + list(range(25, 45))
    for i, offset in enumerate(offsets):
        r = by_id[(topic, offset)]
        assert r["n"] == i and r["user"] == {"id": i % 7} and r["kind"] == "click"
        meta = r["_danube_metadata"]
        assert meta["danube_topic"] == topic and meta["danube_offset"] == offset
        assert r["_timestamp"].endswith("+00:00")
    assert by_id["evt-100"]["n"] == 100
    assert by_id["own-101"]["n"] == 101
    assert [m.payload for m in letters] == bad
    reasons = [m.attributes["dlq.reason"] for m in letters]
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "expected a JSON object, got list"
    assert reasons[2].startswith("SurrealDB refused the record: ") and "'lots'" in reasons[2]
    assert [int(m.attributes["dlq.offset"]) for m in letters] == [20, 21, 22]


async def test_three_sigkills_every_record_once(tmp_path, broker, admin):
    """Record ids come from the partition and offset and each is UPSERTed: killed three
    times mid-stream, the batches written again replace the same records."""
    topic = f"/default/sr_kill_{uuid.uuid4().hex[:8]}"
    store = tmp_path / "surreal"
    total = 6000
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        producer = await make_topic(client, topic)
        conn = ConnectorProcess(write_config(tmp_path / "c.toml", broker, topic, store,
                                             batch_size=250))
        await asyncio.to_thread(conn.start)
        feeding = asyncio.ensure_future(producer.send_many([doc(i) for i in range(total)]))
        for at in (600, 2500, 4000):
            await async_wait_for(lambda: acked_through(admin, topic, at), 180,
                                 f"offset {at} acknowledged before the kill")
            conn.sigkill()
            conn = ConnectorProcess(conn.config_path)
            await asyncio.to_thread(conn.start)
        await feeding
        await async_wait_for(lambda: acked_through(admin, topic, total - 1), 180,
                             "every record acknowledged")
        assert conn.stop() == 0
    [count] = await query(store, "SELECT count() FROM events GROUP ALL")
    assert count["count"] == total
    rows = await query(store, "SELECT id, n FROM events")
    assert sorted(tuple(r["id"].id) for r in rows) == [(topic, i) for i in range(total)]
    assert sorted(r["n"] for r in rows) == list(range(total))
