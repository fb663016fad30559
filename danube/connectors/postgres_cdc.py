"""source-postgres-cdc: PostgreSQL change data capture -> Danube topics. Upstream lists a
PostgreSQL CDC source as planned, with no keys yet; ours follow its other connectors:
``[postgres]`` and ``[[postgres.routes]]`` (``table`` -> ``to``).

How: a logical replication slot with PostgreSQL's own ``pgoutput`` plugin and a
publication of the routed tables (both created when missing). psycopg 3 has no client for
the streaming replication protocol, so the slot is read through PostgreSQL's logical
decoding SQL functions: ``pg_logical_slot_peek_binary_changes`` (which reads without
consuming, whole committed transactions in commit order, from the slot's confirmed
position) through a server-side cursor WITH HOLD (the client holds one batch at a time,
whatever the size of a transaction, and no transaction stays open between batches), and ``pg_replication_slot_advance`` once the broker acknowledged
every change of a transaction. A crash of the connector, of the broker or of PostgreSQL
(whose slot position is saved at checkpoints) makes the slot give those changes again: at
least once, in commit order, never a change skipped.

Each insert, update and delete is one message on the route's topic, keyed by the row's
primary key, its payload a JSON object: ``op``, ``schema``, ``table``, ``key``, ``before``,
``after``, ``lsn``, ``commit_lsn``, ``xid``, ``commit_time`` (docs/connect.md)."""

import asyncio
import collections
import json
import logging

import orjson

from danube.connect import (ConfigError, FatalError, Field, ProducerConfig, SourceConnector,
                            SourceRecord, Table, Tables, Unavailable)
from danube.connect.settings import topic_name
from danube.connectors import _pg, pgoutput
from danube.connectors._pg import psycopg, sql

log = logging.getLogger("danube.connectors.postgres_cdc")

ROUTE = {
    "table": Field(str, check=_pg.table_name),
    "to": Field(str, check=topic_name),
    "partitions": Field(int, 0, min=0, max=1024),
    "reliable_dispatch": Field(bool, True),
    # Ours: the columns that key a change (default: the table's primary key, else its
    # replica identity).
    "key_columns": Field(list, [], check=lambda v: None if all(
        isinstance(c, str) and c for c in v) else "expected an array of column names"),
}

POSTGRES = {
    **_pg.CONNECTION,
    "slot_name": Field(str, "danube_cdc", env="POSTGRES_SLOT_NAME", check=_pg.identifier),
    "publication_name": Field(str, "danube_cdc", check=_pg.identifier),
    "create_slot": Field(bool, True),
    "create_publication": Field(bool, True),
    # At most this many changes decoded per read of the slot (whole transactions: one
    # larger than this is read whole, spilled to disk by PostgreSQL, not by us).
    "max_changes_per_read": Field(int, 100_000, min=1),
    "routes": Tables(ROUTE, min_items=1),
}

# An idle slot (no published change) is moved on at most this often.
IDLE_ADVANCE_S = 1.0

PEEK = ("SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, "
        "'proto_version', '1', 'publication_names', %s)")


class PostgresCdcSource(SourceConnector):
    CONFIG = {"postgres": Table(POSTGRES)}

    def __init__(self, context):
        super().__init__(context)
        self.pg = self.config.postgres
        self.routes = {}
        for i, route in enumerate(self.pg.routes):
            name = _pg.qualified(route.table)
            if name in self.routes:
                raise ConfigError(f"postgres.routes[{i}].table: {route.table} is routed twice")
            self.routes[name] = route
        self._read = None               # the connection that reads the slot
        self._write = None              # autocommit: advances the slot
        self._cursor = None
        self._decoder = pgoutput.Decoder()
        self._txn = None                # the Begin of the transaction being read
        self._seq = 0                   # records handed out so far
        self._committed_seq = 0         # ... of which the broker acknowledged
        self._done = collections.deque()   # (last record's seq, end LSN) per transaction
        self._advance_to = 0
        self._confirmed = 0             # the slot's confirmed position, as we know it
        self._keys = {}                 # (schema, table) -> key columns
        self._attempt = 0
        self._floor = "0/0"
        self._peeked = 0
        self._idle_at = 0.0

    def producer_configs(self):
        return [ProducerConfig(r.to, r.partitions, r.reliable_dispatch)
                for r in self.routes.values()]

    # -- start ----------------------------------------------------------------------------

    async def initialize(self):
        try:
            await self._connect()
            await self._prepare()
        except psycopg.Error as exc:
            if _pg.is_outage(exc):
                await self._drop()
                raise Unavailable(f"PostgreSQL: {_pg.describe(exc)}") from None
            raise ConfigError(f"postgres: {_pg.describe(exc)}") from None

    async def _connect(self):
        if self._read is None:
            self._read = await _pg.connect(self.pg, autocommit=True)
        if self._write is None:
            self._write = await _pg.connect(self.pg, autocommit=True)
        row = await (await self._write.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (self.pg.slot_name,))).fetchone()
        if row and row[0]:
            self._confirmed = pgoutput.parse_lsn(row[0])

    async def _prepare(self):
        conn = self._write
        level = (await (await conn.execute("SHOW wal_level")).fetchone())[0]
        if level != "logical":
            raise ConfigError(f"postgres: PostgreSQL's wal_level is {level!r}; change data "
                              f"capture needs wal_level = logical (postgresql.conf, then "
                              f"restart PostgreSQL)")
        for i, ((schema, table), route) in enumerate(self.routes.items()):
            self._keys[(schema, table)] = await self._key_columns(i, schema, table, route)
        await self._publication()
        await self._slot()
        log.info("reading slot %s (publication %s) from %s", self.pg.slot_name,
                 self.pg.publication_name, pgoutput.lsn_text(self._confirmed))

    async def _key_columns(self, i, schema, table, route):
        cur = await self._write.execute(
            "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON "
            "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (schema, table))
        row = await cur.fetchone()
        if row is None or row[1] not in ("r", "p"):
            raise ConfigError(f"postgres.routes[{i}].table: no table {schema}.{table} in "
                              f"this database")
        oid = row[0]
        cur = await self._write.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND "
            "NOT attisdropped", (oid,))
        columns = {r[0] for r in await cur.fetchall()}
        if route.key_columns:
            missing = [c for c in route.key_columns if c not in columns]
            if missing:
                raise ConfigError(f"postgres.routes[{i}].key_columns: {schema}.{table} has "
                                  f"no column {missing[0]!r}")
            return list(route.key_columns)
        cur = await self._write.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
            "i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND "
            "i.indisprimary ORDER BY array_position(i.indkey, a.attnum)", (oid,))
        return [r[0] for r in await cur.fetchall()]     # [] : the replica identity's

    async def _publication(self):
        conn, name = self._write, self.pg.publication_name
        exists = await (await conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))).fetchone()
        tables = [_pg.table_sql(s, t) for s, t in self.routes]
        if not exists:
            if not self.pg.create_publication:
                raise ConfigError(f"postgres.publication_name: no publication {name!r} (create "
                                  f"it, or set postgres.create_publication = true)")
            await conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(name), sql.SQL(", ").join(tables)))
            log.info("created publication %s", name)
            return
        cur = await conn.execute("SELECT schemaname, tablename FROM pg_publication_tables "
                                 "WHERE pubname = %s", (name,))
        published = {(r[0], r[1]) for r in await cur.fetchall()}
        missing = [n for n in self.routes if n not in published]
        if not missing:
            return
        if not self.pg.create_publication:
            s, t = missing[0]
            raise ConfigError(f"postgres.routes: publication {name!r} does not include "
                              f"{s}.{t} (ALTER PUBLICATION {name} ADD TABLE {s}.{t})")
        await conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(_pg.table_sql(s, t)
                                                     for s, t in missing)))
        log.info("added %s to publication %s", ", ".join(f"{s}.{t}" for s, t in missing),
                 name)

    async def _slot(self):
        conn, name = self._write, self.pg.slot_name
        row = await (await conn.execute(
            "SELECT plugin, database, confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s", (name,))).fetchone()
        if row is None:
            if not self.pg.create_slot:
                raise ConfigError(f"postgres.slot_name: no replication slot {name!r} (create "
                                  f"it, or set postgres.create_slot = true)")
            row = await (await conn.execute(
                "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')",
                (name,))).fetchone()
            self._confirmed = pgoutput.parse_lsn(row[0])
            log.info("created replication slot %s at %s", name, row[0])
            return
        plugin, database, confirmed = row
        current = (await (await conn.execute("SELECT current_database()")).fetchone())[0]
        if plugin != "pgoutput" or database != current:
            raise ConfigError(f"postgres.slot_name: slot {name!r} is not a pgoutput slot of "
                              f"database {current!r} (plugin {plugin}, database {database})")
        self._confirmed = pgoutput.parse_lsn(confirmed)

    # -- reading --------------------------------------------------------------------------

    async def poll(self, max_records):
        try:
            if self._read is None:
                await self._connect()
            records, more = await self._fetch(max_records)
        except Unavailable as exc:
            await self._lost(exc)
            return []
        except psycopg.Error as exc:
            if not _pg.is_outage(exc):
                raise FatalError(f"reading slot {self.pg.slot_name}: "
                                 f"{_pg.describe(exc)}") from None
            await self._lost(exc)
            return []
        except pgoutput.DecodeError as exc:
            raise FatalError(f"slot {self.pg.slot_name}: {exc}") from None
        if self._attempt:
            self._attempt = 0
            self.context.health.set("postgres")
            log.info("PostgreSQL reachable again")
        if not records and not more:
            await asyncio.sleep(self.core.processing.poll_interval_ms / 1000)
        return records

    async def _fetch(self, max_records):
        """(records, whether more rows may be waiting)."""
        if self._cursor is None:
            await self._advance()
            self._decoder = pgoutput.Decoder()      # a new decoding session: Relations again
            self._txn = None
            # Where the WAL ended before this read: a read that finds nothing has seen every
            # transaction committed before it.
            self._floor = (await (await self._read.execute(
                "SELECT pg_current_wal_flush_lsn()::text")).fetchone())[0]
            self._peeked = 0
            # WITH HOLD: the result outlives its transaction, so no transaction stays
            # open (holding back vacuum) while the broker takes its time.
            self._cursor = self._read.cursor(name="danube_cdc_peek", withhold=True)
            await self._cursor.execute(PEEK, (self.pg.slot_name, self.pg.max_changes_per_read,
                                              self.pg.publication_name))
        rows = await self._cursor.fetchmany(max_records)
        self._peeked += len(rows)
        exhausted = len(rows) < max_records
        if exhausted:
            await self._cursor.close()
            self._cursor = None
            if not self._peeked:
                await self._idle_advance()
        return self._decode(rows), bool(rows)

    async def _idle_advance(self):
        """Nothing published came: move the slot to where the WAL ended before the read, at
        most once a second, so the writes of tables no route takes are not kept on the
        server's disk (nor decoded again on every read)."""
        now = asyncio.get_running_loop().time()
        if now - self._idle_at < IDLE_ADVANCE_S or self._done:
            return
        self._idle_at = now
        self._advance_to = max(self._advance_to, pgoutput.parse_lsn(self._floor))
        await self._advance()

    def _decode(self, rows):
        records = []
        decode = self._decoder.decode
        for lsn, data in rows:
            event = decode(data)
            kind = type(event)
            if kind is pgoutput.Change:
                record = self._record(event, lsn)
                if record is not None:
                    records.append(record)
            elif kind is pgoutput.Begin:
                self._txn = event
            elif kind is pgoutput.Commit:
                self._done.append((self._seq, event.end_lsn))
                self._txn = None
            elif kind is pgoutput.Truncate:
                for rel in event.relations:
                    route = self.routes.get((rel.schema, rel.table))
                    if route is not None:
                        records.append(self._make(route, rel, "truncate", None, None, None,
                                                  lsn, []))
        return records

    def _record(self, change, lsn):
        rel = change.relation
        route = self.routes.get((rel.schema, rel.table))
        if route is None:
            return None             # a table of the publication that no route takes
        row = change.new if change.new is not None else change.old or {}
        names = self._keys.get((rel.schema, rel.table)) or \
            [c.name for c in rel.columns if c.in_key]
        key = {n: row.get(n) for n in names if n in row}
        return self._make(route, rel, change.op, key, change.old, change.new, lsn,
                          change.unchanged)

    def _make(self, route, rel, op, key, before, after, lsn, unchanged):
        txn = self._txn
        event = {"op": op, "schema": rel.schema, "table": rel.table, "key": key,
                 "before": before, "after": after, "lsn": lsn}
        if txn is not None:
            event["commit_lsn"] = pgoutput.lsn_text(txn.final_lsn)
            event["xid"] = txn.xid
            event["commit_time"] = pgoutput.pg_time(txn.commit_time)
        if unchanged:
            event["unchanged_toast"] = unchanged
        self._seq += 1
        try:
            payload = orjson.dumps(event)
        except TypeError:                   # a json/jsonb integer beyond 64 bits
            payload = json.dumps(event, separators=(",", ":")).encode()
        return SourceRecord(route.to, payload, key=_key_text(key), token=self._seq)

    # -- acknowledging --------------------------------------------------------------------

    async def commit(self, records):
        if records:
            self._committed_seq = max(self._committed_seq, records[-1].token)
        try:
            if self._write is None:
                await self._connect()
            await self._advance()
        except psycopg.Error as exc:
            if not _pg.is_outage(exc):
                raise FatalError(f"advancing slot {self.pg.slot_name}: "
                                 f"{_pg.describe(exc)}") from None
            await self._drop()
            raise Unavailable(f"advancing slot {self.pg.slot_name}: "
                              f"{_pg.describe(exc)}") from None

    async def _advance(self):
        """Move the slot past every transaction whose changes the broker acknowledged."""
        done = self._done
        while done and done[0][0] <= self._committed_seq:
            self._advance_to = max(self._advance_to, done.popleft()[1])
        if self._advance_to <= self._confirmed:
            return
        target = pgoutput.lsn_text(self._advance_to)
        row = await (await self._write.execute(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
            (self.pg.slot_name, target))).fetchone()
        self._confirmed = pgoutput.parse_lsn(row[0])

    # -- outages --------------------------------------------------------------------------

    async def _lost(self, exc):
        """PostgreSQL went away: drop the connections and the read in progress (the slot
        gives it again from its confirmed position), wait the backoff."""
        await self._drop()
        rt = self.context.runtime
        self.context.metrics.retry("external")
        self.context.metrics.error("postgres")
        if self._attempt >= rt.backoff.max_retries:
            self.context.health.set("postgres", f"PostgreSQL unavailable: {exc}")
        log.warning("PostgreSQL unavailable (attempt %d), retrying: %s", self._attempt + 1,
                    exc, extra={"target": "external", "attempt": self._attempt + 1})
        await asyncio.sleep(rt.backoff.delay(self._attempt))
        self._attempt += 1

    async def _drop(self):
        # Positions not yet applied to the slot are forgotten: after a crash PostgreSQL may
        # have lost a transaction that was never flushed (asynchronous commit) and reuse its
        # LSNs, so only what the slot gives again is trusted (it is published again).
        self._done.clear()
        self._advance_to = 0
        self._cursor = None
        read, write = self._read, self._write
        self._read = self._write = None
        await _pg.close_quietly(read)
        await _pg.close_quietly(write)

    async def shutdown(self):
        await self._drop()

    async def health_check(self):
        return None if self._read is not None else "not connected to PostgreSQL"


def _key_text(key):
    """The message key: the key column's value as text, or a JSON array of several."""
    if not key:
        return None
    values = list(key.values())
    if len(values) == 1:
        v = values[0]
        return v if isinstance(v, str) else json.dumps(v)
    return json.dumps(values, separators=(",", ":"))
