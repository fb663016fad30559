"""Danube Connect's source-postgres-cdc against a real PostgreSQL (its own cluster, wal_level
= logical) and the real broker process, run as `danube connect run`: inserts, updates,
deletes and a truncate as keyed JSON change events; the slot and publication created and
the slot advanced only after the broker's ack (a clean restart repeats nothing); a SIGKILL
of the connector and a crash of PostgreSQL in the middle of a stream (every committed
change at least once, in commit order per key); configurations refused with the problem
named."""

import asyncio
import json
import signal
import threading
import uuid

import psycopg
import pytest

from broker_process import BrokerProcess
from connector_process import Collector, ConnectorProcess, runtime_toml
from postgres_process import Postgres, pg, sql  # noqa: F401 - pg: a fixture
from waiting import async_wait_for
from danube.client import DanubeClient, fnv1a64


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("connect-pg")).start()
    yield b
    b.stop()


def write_config(path, broker, pg, routes, *, name=None, extra="", batch_size=200):
    name = name or f"cdc-{uuid.uuid4().hex[:8]}"
    slot = name.replace("-", "_")
    head = runtime_toml("source-postgres-cdc", f"http://{broker.client_addr}", name,
                        batch_size=batch_size, poll_interval_ms=20)
    path.write_text(f'''{head}
[postgres]
connection_url = "{pg.url}"
publication_name = "{slot}"
{extra if "slot_name" in extra else f'slot_name = "{slot}"'}
{extra if "slot_name" not in extra else ""}
''' + "".join(f'\n[[postgres.routes]]\ntable = "{t}"\nto = "{topic}"\n' for t, topic in routes))
    return path


def confirmed(pg, slot):
    with psycopg.connect(pg.url, autocommit=True) as c:
        return c.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE "
                         "slot_name = %s", (slot,)).fetchone()[0]


def query_all(pg, statement):
    with psycopg.connect(pg.url, autocommit=True) as c:
        return c.execute(statement).fetchall()


def query_one(pg, statement):
    with psycopg.connect(pg.url, autocommit=True) as c:
        return c.execute(statement).fetchone()[0]


def lsn(text):
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


async def test_round_trip_and_a_clean_restart(tmp_path, broker, pg):
    table = f"orders_{uuid.uuid4().hex[:6]}"
    topic = f"/default/{table}"
    sql(pg, f"CREATE TABLE {table} (id int PRIMARY KEY, name text, qty int, price numeric, "
            f"meta jsonb, ok bool)",
        f"CREATE TABLE other_{table} (id int PRIMARY KEY)")
    path = write_config(tmp_path / "cdc.toml", broker, pg, [(table, topic)])
    conn = ConnectorProcess(path)
    await asyncio.to_thread(conn.start)
    slot = conn.records()[0]["connector"].replace("-", "_")
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic, create_topic=True).start()
        with psycopg.connect(pg.url) as c:        # one transaction, then one per statement
            c.execute(f"INSERT INTO {table} VALUES (1, 'tea', 2, 3.50, '{{\"a\": [1]}}', "
                      f"true), (2, 'cake', 1, NULL, NULL, false)")
            c.execute(f"INSERT INTO other_{table} VALUES (1)")
        sql(pg, f"UPDATE {table} SET qty = 5 WHERE id = 1",
            f"UPDATE {table} SET id = 3 WHERE id = 2",
            f"DELETE FROM {table} WHERE id = 1",
            f"TRUNCATE {table}")
        await async_wait_for(lambda: len(got.messages) >= 6, 60, "6 change events")
        events = got.events()
        assert [(e["op"], e["key"]) for e in events] == [
            ("insert", {"id": 1}), ("insert", {"id": 2}), ("update", {"id": 1}),
            ("update", {"id": 3}), ("delete", {"id": 1}), ("truncate", None)]
        first = events[0]
        assert first["after"] == {"id": 1, "name": "tea", "qty": 2, "price": "3.50",
                                  "meta": {"a": [1]}, "ok": True}
        assert first["before"] is None and first["schema"] == "public"
        assert first["table"] == table
        assert events[0]["xid"] == events[1]["xid"] != events[2]["xid"]
        assert events[0]["commit_time"].endswith("Z")
        assert events[3]["before"] == {"id": 2} and events[3]["after"]["id"] == 3
        assert events[4]["before"] == {"id": 1} and events[4]["after"] is None
        assert [m.routing_key for m in got.messages[:5]] == ["1", "2", "1", "3", "1"]
        # Acknowledged by the broker: the slot moved past the last transaction.
        last = lsn(events[5]["commit_lsn"])
        await async_wait_for(lambda: lsn(confirmed(pg, slot)) > last, 30,
                             "the slot advanced past the last transaction")
        assert conn.stop() == 0
        # Restarted: nothing repeated, what was written meanwhile comes.
        sql(pg, f"INSERT INTO {table} VALUES (10, 'while away', 1, 1, NULL, NULL)")
        conn = ConnectorProcess(path)
        await asyncio.to_thread(conn.start)
        await async_wait_for(lambda: len(got.messages) >= 7, 60, "the change made meanwhile")
        # Writes no route takes: the idle slot is moved past them (no WAL kept for them).
        sql(pg, f"INSERT INTO other_{table} SELECT g FROM generate_series(2, 500) g")
        after = lsn(query_one(pg, "SELECT pg_current_wal_flush_lsn()::text"))
        await async_wait_for(lambda: lsn(confirmed(pg, slot)) >= after, 30,
                             "the idle slot moved past unpublished writes")
        await got.stop()
    assert [e["key"] for e in got.events()[6:]] == [{"id": 10}]
    assert conn.metric("danube_connector_messages_processed_total", topic=topic) == 1
    assert conn.stop() == 0


async def test_a_large_transaction_comes_in_bounded_batches(tmp_path, broker, pg):
    """The slot is read through a server-side cursor: a transaction of 1,500 rows reaches
    the broker in batches of at most processing.batch_size, in order."""
    table = f"big_{uuid.uuid4().hex[:6]}"
    topic = f"/default/{table}"
    sql(pg, f"CREATE TABLE {table} (id int PRIMARY KEY, pad text)")
    conn = ConnectorProcess(write_config(tmp_path / "cdc.toml", broker, pg, [(table, topic)],
                                         batch_size=100))
    await asyncio.to_thread(conn.start)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic, create_topic=True).start()
        sql(pg, f"INSERT INTO {table} SELECT g, repeat('x', 100) FROM generate_series(1, "
                f"1500) g")
        # The cursor is held between batches without a transaction (none holds back
        # vacuum while the broker takes the batch).
        states = set()

        def sample():
            states.update(r[0] for r in query_all(
                pg, "SELECT state FROM pg_stat_activity WHERE application_name = "
                    "'danube-connect'"))
            return len(got.messages) >= 1500
        await async_wait_for(sample, 60, "1,500 events")
        await got.stop()
    assert "idle" in states and "idle in transaction" not in states, states
    assert [e["key"]["id"] for e in got.events()] == list(range(1, 1501))
    assert len({e["xid"] for e in got.events()}) == 1
    batches = conn.metric("danube_connector_batch_size_count")
    assert batches >= 15
    assert conn.metric("danube_connector_batch_size_bucket", le="100.0") == batches
    assert conn.stop() == 0


async def test_a_partitioned_route_keys_each_row_to_its_partition(tmp_path, broker, pg):
    table = f"parts_{uuid.uuid4().hex[:6]}"
    topic = f"/default/{table}"
    sql(pg, f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
    path = write_config(tmp_path / "cdc.toml", broker, pg, [(table, topic)])
    path.write_text(path.read_text() + "partitions = 3\n")
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        await client.create_producer(topic, "mk", partitions=3, reliable=True)
        consumer = await client.subscribe(topic, "c", "s", "shared")
        conn = ConnectorProcess(path)
        await asyncio.to_thread(conn.start)
        sql(pg, f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 30) g",
            f"UPDATE {table} SET v = 1", f"UPDATE {table} SET v = 2")
        got = [await consumer.receive(timeout=60) for _ in range(90)]
        await consumer.close()
    per_key = {}
    for m in got:
        event = json.loads(m.payload)
        assert m.routing_key == str(event["key"]["id"])
        assert m.msg_id.topic_name == f"{topic}-part-{fnv1a64(m.routing_key) % 3}"
        per_key.setdefault(m.routing_key, []).append(event["after"]["v"])
    assert len({m.msg_id.topic_name for m in got}) == 3
    assert all(v == [0, 1, 2] for v in per_key.values()) and len(per_key) == 30
    assert conn.stop() == 0


class Writer:
    """Commits ``rounds`` transactions, each updating every key to its next version, in a
    thread; after round ``pause_at`` it waits for ``resume``. Waits out a PostgreSQL
    restart: a transaction whose commit was cut off is tried again, and changes nothing if
    it had landed (the UPDATE checks the version before)."""

    def __init__(self, pg, table, keys, rounds, pause_at):
        self.pg, self.table, self.keys, self.rounds = pg, table, keys, rounds
        self.pause_at = pause_at
        self.committed = 0
        self.resume = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error = None

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        version = 1
        conn = None
        while version <= self.rounds:
            if version == self.pause_at + 1:
                self.resume.wait()
            try:
                if conn is None:
                    conn = psycopg.connect(self.pg.url, autocommit=False, connect_timeout=2)
                with conn.transaction():
                    for k in range(self.keys):
                        conn.execute(f"UPDATE {self.table} SET v = %s WHERE id = %s AND "
                                     f"v = %s", (version, k, version - 1))
                version += 1
                self.committed = version - 1
            except psycopg.OperationalError:
                conn = None
                now = _version_now(self.pg, self.table)
                if now is not None and now >= version:
                    version = now + 1
                    self.committed = now
                threading.Event().wait(0.2)
            except Exception as exc:        # noqa: BLE001 - reported by the test
                self.error = exc
                return
        if conn is not None:
            conn.close()


def _version_now(pg, table):
    try:
        with psycopg.connect(pg.url, connect_timeout=2) as c:
            return c.execute(f"SELECT min(v) FROM {table}").fetchone()[0]
    except psycopg.OperationalError:
        return None


def check_per_key_order(events, keys, rounds):
    """Every version of every key at least once, and the first sighting of each version in
    commit order (a redelivery may repeat a run, never reorder what is new)."""
    seen = {k: [] for k in range(keys)}
    for e in events:
        if e["op"] == "update":
            seen[e["key"]["id"]].append(e["after"]["v"])
    for k, versions in seen.items():
        first = list(dict.fromkeys(versions))
        assert first == list(range(1, rounds + 1)), (k, versions[:50])
    return sum(len(v) for v in seen.values())


async def setup_stream(tmp_path, broker, pg, keys):
    table = f"stream_{uuid.uuid4().hex[:6]}"
    topic = f"/default/{table}"
    sql(pg, f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, pad text)",
        f"INSERT INTO {table} SELECT g, 0, repeat('x', 50) FROM generate_series(0, "
        f"{keys - 1}) g")
    path = write_config(tmp_path / "cdc.toml", broker, pg, [(table, topic)])
    conn = ConnectorProcess(path)
    await asyncio.to_thread(conn.start)
    return table, topic, conn


async def test_sigkill_mid_stream_loses_nothing_in_order(tmp_path, broker, pg):
    keys, rounds = 20, 150
    table, topic, conn = await setup_stream(tmp_path, broker, pg, keys)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic, create_topic=True).start()
        writer = Writer(pg, table, keys, rounds, pause_at=100).start()
        await async_wait_for(lambda: len(got.messages) >= 600, 120, "600 events")
        conn.sigkill()
        assert len(got.messages) < keys * 100, "the stream was read before the kill"
        writer.resume.set()         # more changes while the connector is away
        conn = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn.start)
        await asyncio.to_thread(writer.thread.join, 120)
        assert writer.error is None, writer.error
        await async_wait_for(lambda: len(got.messages) >= keys * rounds, 120, "every change")
        await async_wait_for(lambda: _all_seen(got, keys, rounds), 120, "every version")
        await got.stop()
    check_per_key_order(got.events(), keys, rounds)
    assert conn.stop() == 0


def _all_seen(got, keys, rounds):
    last = {}
    for e in got.events():
        last[e["key"]["id"]] = max(last.get(e["key"]["id"], 0), e["after"]["v"])
    return len(last) == keys and all(v == rounds for v in last.values())


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGQUIT], ids=["restart", "crash"])
async def test_postgres_restart_mid_stream(tmp_path, broker, pg, how):
    """PostgreSQL restarted (SIGINT: a fast shutdown, the slot saved) or stopped
    immediately (SIGQUIT: a crash, the slot's position goes back to the last checkpoint)
    while the connector reads a stream: retries, not ready, then every change again from
    the slot, in commit order per key."""
    keys, rounds = 20, 150
    table, topic, conn = await setup_stream(tmp_path, broker, pg, keys)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic, create_topic=True).start()
        writer = Writer(pg, table, keys, rounds, pause_at=100).start()
        await async_wait_for(lambda: len(got.messages) >= 400, 120, "400 events")
        await asyncio.to_thread(pg.stop, how)
        assert len(got.messages) < keys * 100, "the stream was read before the restart"
        await async_wait_for(lambda: conn.metric("danube_connector_messages_retried_total",
                                                 target="external") >= 2, 60, "retries")
        await async_wait_for(lambda: not conn.ready(), 60, "not ready while PostgreSQL is down")
        await asyncio.to_thread(pg.start)
        writer.resume.set()
        await asyncio.to_thread(writer.thread.join, 120)
        assert writer.error is None, writer.error
        await async_wait_for(lambda: _all_seen(got, keys, rounds), 120, "every version")
        await async_wait_for(conn.ready, 60, "ready again")
        await got.stop()
    check_per_key_order(got.events(), keys, rounds)
    assert conn.stop() == 0


@pytest.mark.parametrize("setup,extra,route,needle", [
    ([], "", "no_such_table", "postgres.routes[0].table: no table public.no_such_table"),
    ([], "slot_name = \"Bad-Slot\"", "t_cfg", "postgres.slot_name: 'Bad-Slot'"),
    (["CREATE TABLE t_cfg (id int PRIMARY KEY)"], "create_publication = false", "t_cfg",
     "no publication"),
    ([], "slot_nam = \"x\"", "t_cfg", "unknown key postgres.slot_nam"),
])
def test_bad_configuration_names_the_problem(tmp_path, broker, pg, setup, extra, route,
                                             needle):
    sql(pg, *setup) if setup else None
    path = write_config(tmp_path / "bad.toml", broker, pg, [(route, "/default/x")],
                        extra=extra)
    result = ConnectorProcess(path).run_to_exit()
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr


def test_wal_level_replica_is_refused(tmp_path, broker):
    p = Postgres(settings={"wal_level": "replica"}).start()
    try:
        sql(p, "CREATE TABLE t (id int PRIMARY KEY)")
        path = write_config(tmp_path / "c.toml", broker, p, [("t", "/default/x")])
        result = ConnectorProcess(path).run_to_exit()
    finally:
        p.close()
    assert result.returncode == 2, result.stderr
    assert "wal_level is 'replica'" in result.stderr and "wal_level = logical" in \
        result.stderr
