"""sink-postgres: topics -> PostgreSQL tables, upserted by key (upstream has no PostgreSQL
sink; the keys follow its other sinks: ``[postgres]`` and ``[[postgres.routes]]``,
``from`` -> ``to``).

Each record is a JSON object whose fields are the table's columns (``format = "json"``), or
a change event of source-postgres-cdc (``format = "cdc"``: inserts and updates upsert
``after``, deletes delete ``key``). A batch is one transaction: its rows are copied (COPY)
into a temporary table, then ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE`` moves
them into the table, the last record of a key in the batch winning. Writing a record again
(after a crash, before its acknowledgement) writes the same row again: idempotent, at
least once, no duplicates by key.

Bad records go to the dead-letter topic with the reason: not JSON, not an object, a key
column missing, or a row PostgreSQL refuses (a value of the wrong type, a NOT NULL or CHECK
violation: the batch is then written row by row, each in a savepoint, to find them). While
PostgreSQL is unreachable or busy (a deadlock, a lock timeout) the batch is retried without
end (not ready meanwhile); an error no retry can fix (the table dropped, a privilege revoked)
stops the connector with the batch unacknowledged."""

import json
import logging

import orjson

from danube.connect import (ConfigError, ConsumerConfig, FatalError, Field, InvalidRecord,
                            SinkConnector, Table, Tables, Unavailable)
from danube.connect.settings import topic_name
from danube.connectors import _pg
from danube.connectors._pg import psycopg, sql

log = logging.getLogger("danube.connectors.postgres_sink")


def _names(value):
    return None if all(isinstance(c, str) and c for c in value) else \
        "expected an array of column names"


def _columns(value):
    for i, col in enumerate(value):
        if not isinstance(col, dict) or set(col) - {"name", "type", "nullable"} or \
                not isinstance(col.get("name"), str) or not col.get("name") or \
                not isinstance(col.get("type"), str) or not col.get("type") or \
                not isinstance(col.get("nullable", True), bool):
            return (f"[{i}]: expected {{ name = \"...\", type = \"...\", nullable = "
                    f"true|false }}")
    return None


ROUTE = {
    "from": Field(str, check=topic_name),
    "subscription": Field(str, check=lambda v: None if v else "must not be empty"),
    # One reader in offset order: the last record of a key is the one that stays.
    "subscription_type": Field(str, "exclusive", choices=("exclusive", "failover",
                                                          "shared")),
    "to": Field(str, check=_pg.table_name),
    "format": Field(str, "json", choices=("json", "cdc")),
    "key_columns": Field(list, [], check=_names),
    "create_table": Field(bool, False),
    "columns": Field(list, [], check=_columns),
}

POSTGRES = {**_pg.CONNECTION, "routes": Tables(ROUTE, min_items=1)}


class Route:
    """One topic -> table: its columns, key, and statements."""

    def __init__(self, index, cfg):
        self.index = index
        self.cfg = cfg
        self.topic = getattr(cfg, "from")
        self.schema, self.table = _pg.qualified(cfg.to)
        self.columns = []           # written, in order
        self.key = []
        self.key_index = []         # the key's positions in ``columns``
        self.stage = f"danube_stage_{index}"

    def where(self, key):
        return f"postgres.routes[{self.index}].{key}"


class PostgresSink(SinkConnector):
    CONFIG = {"postgres": Table(POSTGRES)}

    def __init__(self, context):
        super().__init__(context)
        self.pg = self.config.postgres
        self.routes = {}
        for i, cfg in enumerate(self.pg.routes):
            route = Route(i, cfg)
            if route.topic in self.routes:
                raise ConfigError(f"{route.where('from')}: {route.topic} is routed twice")
            if cfg.create_table and not cfg.columns:
                raise ConfigError(f"{route.where('columns')}: create_table needs the "
                                  f"columns ([{{ name = \"id\", type = \"bigint\" }}, ...])")
            self.routes[route.topic] = route
        self.conn = None
        self._prepared = False

    def consumer_configs(self):
        return [ConsumerConfig(r.topic, r.cfg.subscription, r.cfg.subscription_type)
                for r in self.routes.values()]

    # -- start ----------------------------------------------------------------------------

    async def initialize(self):
        await self._ready()

    async def _ready(self):
        if self.conn is None or self.conn.closed:
            self._prepared = False
            self.conn = await _pg.connect(self.pg, autocommit=False)
        if self._prepared:
            return
        try:
            for route in self.routes.values():
                await self._describe(route)
            await self.conn.commit()
            for route in self.routes.values():
                await self.conn.execute(sql.SQL(
                    "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS SELECT {} "
                    "FROM {} WITH NO DATA").format(
                        sql.Identifier(route.stage),
                        sql.SQL(", ").join(map(sql.Identifier, route.columns)),
                        _pg.table_sql(route.schema, route.table)))
            await self.conn.commit()
        except psycopg.Error as exc:
            await self._drop()
            if _pg.is_outage(exc):
                raise Unavailable(f"PostgreSQL: {_pg.describe(exc)}") from None
            raise ConfigError(f"postgres: {_pg.describe(exc)}") from None
        self._prepared = True

    async def _describe(self, route):
        """Create the table if asked, read its columns, check the key has a unique index."""
        conn = self.conn
        name = f"{route.schema}.{route.table}"
        oid = await self._table_oid(route)
        if oid is None:
            if not route.cfg.create_table:
                raise ConfigError(f"{route.where('to')}: no table {name} in this database "
                                  f"(create it, or set create_table = true with columns)")
            await self._create(route)
            oid = await self._table_oid(route)
        cur = await conn.execute(
            "SELECT attname, attgenerated <> '', atthasdef OR attidentity <> '' FROM "
            "pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY "
            "attnum", (oid,))
        table_cols = {r[0]: r for r in await cur.fetchall()}
        route.key = list(route.cfg.key_columns) or await self._primary_key(oid)
        if route.cfg.columns and not route.cfg.create_table:
            wanted = [c["name"] for c in route.cfg.columns]
        else:
            # By default a column with a default (now(), a sequence) keeps it: it is written
            # only when ``columns`` names it.
            wanted = [c for c, (_, generated, has_default) in table_cols.items()
                      if not generated and (not has_default or c in route.key)]
        missing = [c for c in wanted if c not in table_cols]
        if missing:
            raise ConfigError(f"{route.where('columns')}: {name} has no column {missing[0]!r}")
        route.columns = wanted
        route.key_index = [wanted.index(k) for k in route.key if k in wanted]
        if not route.key:
            raise ConfigError(f"{route.where('key_columns')}: {name} has no primary key; "
                              f"name the columns of a unique index")
        missing = [c for c in route.key if c not in wanted]
        if missing:
            raise ConfigError(f"{route.where('key_columns')}: {missing[0]!r} is not a "
                              f"written column of {name}")
        cur = await conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i JOIN "
            "pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE "
            "i.indrelid = %s AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid",
            (oid,))
        unique = [sorted(r[0]) for r in await cur.fetchall()]
        if sorted(route.key) not in unique:
            raise ConfigError(f"{route.where('key_columns')}: no unique index of {name} on "
                              f"({', '.join(route.key)}): an upsert needs one")

    async def _table_oid(self, route):
        row = await (await self.conn.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (route.schema, route.table))).fetchone()
        return row[0] if row else None

    async def _primary_key(self, oid):
        cur = await self.conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
            "i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND "
            "i.indisprimary ORDER BY array_position(i.indkey, a.attnum)", (oid,))
        return [r[0] for r in await cur.fetchall()]

    async def _create(self, route):
        cols = route.cfg.columns
        key = list(route.cfg.key_columns) or [cols[0]["name"]]
        defs = []
        for i, col in enumerate(cols):
            # The type is checked by PostgreSQL itself before it goes into the DDL.
            try:
                row = await (await self.conn.execute("SELECT format_type(%s::regtype, NULL)",
                                                     (col["type"],))).fetchone()
            except psycopg.Error as exc:
                raise ConfigError(f"{route.where('columns')}[{i}].type: {col['type']!r}: "
                                  f"{_pg.describe(exc)}") from None
            null = "" if col.get("nullable", True) and col["name"] not in key else " NOT NULL"
            defs.append(sql.SQL("{} {}{}").format(sql.Identifier(col["name"]),
                                                  sql.SQL(row[0]), sql.SQL(null)))
        defs.append(sql.SQL("PRIMARY KEY ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, key))))
        await self.conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            _pg.table_sql(route.schema, route.table), sql.SQL(", ").join(defs)))
        log.info("created table %s.%s", route.schema, route.table)

    # -- writing --------------------------------------------------------------------------

    async def process_batch(self, records):
        rejected, by_route = [], {}
        for record in records:
            route = self.routes[record.topic]
            try:
                ops = self._row(route, record)
            except InvalidRecord as exc:
                rejected.append(exc)
                continue
            # The last record of a key in the batch wins (one row per key per statement).
            keyed = by_route.setdefault(route.topic, {})
            for op, row in ops:
                key = tuple(row) if op == "delete" else \
                    tuple(row[i] for i in route.key_index)
                try:
                    keyed.pop(key, None)
                except TypeError:               # an object or array as a key value
                    key = tuple(orjson.dumps(v, option=orjson.OPT_SORT_KEYS) for v in key)
                    keyed.pop(key, None)
                keyed[key] = (op, row, record)
        if not by_route:
            return rejected
        await self._ready()
        try:
            rejected += await self._write(by_route)
        except psycopg.Error as exc:
            await self._rollback()
            if isinstance(exc, (psycopg.DataError, psycopg.IntegrityError)):
                rejected += await self._write_one_by_one(by_route)
            else:
                await self._failed(exc)
        return rejected

    async def _failed(self, exc):
        """A batch PostgreSQL did not take for no fault of a record: down or busy (a
        deadlock, a lock or statement timeout) is retried without end; anything else (a
        table dropped, a privilege revoked) stops the connector with nothing acknowledged,
        rather than dead-lettering every record until someone fixes it."""
        if _pg.is_outage(exc):
            await self._drop()
            raise Unavailable(f"PostgreSQL: {_pg.describe(exc)}") from None
        if _pg.is_transient(exc):
            raise Unavailable(f"PostgreSQL busy: {_pg.describe(exc)}") from None
        raise FatalError(f"writing to PostgreSQL: {_pg.describe(exc)}") from None

    def _row(self, route, record):
        try:
            doc = orjson.loads(record.payload)
        except orjson.JSONDecodeError:
            try:                            # what orjson refuses that JSON allows (huge ints)
                doc = json.loads(record.payload)
            except ValueError as exc:
                raise InvalidRecord(f"invalid JSON: {exc}", record) from None
        if not isinstance(doc, dict):
            raise InvalidRecord(f"expected a JSON object, not {type(doc).__name__}",
                                record)
        op, moved = "upsert", []
        if route.cfg.format == "cdc":
            kind = doc.get("op")
            if kind == "update":
                moved = _moved_key(route.key, doc.get("before"), doc.get("after"))
            if kind in ("insert", "update"):
                doc = doc.get("after")
            elif kind == "delete":
                op, doc = "delete", doc.get("key") or doc.get("before")
            elif kind == "truncate":
                raise InvalidRecord("a truncate is not applied (the table keeps its rows)",
                                    record)
            else:
                raise InvalidRecord(f"not a change event: op {kind!r} (insert, update or "
                                    f"delete expected)", record)
            if not isinstance(doc, dict):
                part = "key" if op == "delete" else "after"
                raise InvalidRecord(f"a change event without its row ({part})", record)
        get = doc.get
        if op == "delete":
            values = [get(k) for k in route.key]
        else:
            values = [get(c) for c in route.columns]
            for i, v in enumerate(values):
                if type(v) is dict or type(v) is list:
                    values[i] = _json_text(v)
        for k in route.key:
            if get(k) is None:
                raise InvalidRecord(f"key column {k!r} missing or null", record)
        return moved + [(op, values)]

    async def _write(self, by_route):
        conn = self.conn
        for topic, keyed in by_route.items():
            route = self.routes[topic]
            upserts = [row for op, row, _ in keyed.values() if op == "upsert"]
            deletes = [row for op, row, _ in keyed.values() if op == "delete"]
            if deletes:
                async with conn.cursor() as cur:
                    await cur.executemany(self._delete_sql(route), deletes)
            if upserts:
                cols = route.columns
                async with conn.cursor() as cur:
                    async with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                            sql.Identifier(route.stage),
                            sql.SQL(", ").join(map(sql.Identifier, cols)))) as copy:
                        for row in upserts:
                            await copy.write_row(row)
                    await cur.execute(self._upsert_sql(route, from_stage=True))
        await conn.commit()
        return []

    async def _write_one_by_one(self, by_route):
        """The batch had a row PostgreSQL refused: each row in a savepoint, the refused
        ones dead-lettered with PostgreSQL's reason."""
        conn = self.conn
        rejected = []
        try:
            async with conn.transaction():             # the batch: one transaction
                for topic, keyed in by_route.items():
                    route = self.routes[topic]
                    for op, row, record in keyed.values():
                        try:
                            async with conn.transaction():     # a savepoint per row
                                if op == "delete":
                                    await conn.execute(self._delete_sql(route), row)
                                else:
                                    await conn.execute(
                                        self._upsert_sql(route, from_stage=False), row)
                        except (psycopg.DataError, psycopg.IntegrityError) as exc:
                            rejected.append(InvalidRecord(
                                f"PostgreSQL refused the row for {route.schema}."
                                f"{route.table}: {_pg.describe(exc)}", record))
        except psycopg.Error as exc:
            await self._rollback()
            await self._failed(exc)
        return rejected

    @staticmethod
    def _upsert_sql(route, from_stage):
        cols = sql.SQL(", ").join(map(sql.Identifier, route.columns))
        if from_stage:
            source = sql.SQL("SELECT {} FROM {}").format(cols, sql.Identifier(route.stage))
        else:
            source = sql.SQL("VALUES ({})").format(
                sql.SQL(", ").join(sql.Placeholder() * len(route.columns)))
        rest = [c for c in route.columns if c not in route.key]
        if rest:
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in rest))
        else:
            action = sql.SQL("DO NOTHING")
        return sql.SQL("INSERT INTO {} ({}) {} ON CONFLICT ({}) {}").format(
            _pg.table_sql(route.schema, route.table), cols, source,
            sql.SQL(", ").join(map(sql.Identifier, route.key)), action)

    @staticmethod
    def _delete_sql(route):
        return sql.SQL("DELETE FROM {} WHERE {}").format(
            _pg.table_sql(route.schema, route.table),
            sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k))
                                  for k in route.key))

    async def _rollback(self):
        try:
            await self.conn.rollback()
        except psycopg.Error:
            pass

    async def _drop(self):
        conn, self.conn = self.conn, None
        self._prepared = False
        await _pg.close_quietly(conn)

    async def shutdown(self):
        await self._drop()

    async def health_check(self):
        return None if self.conn is not None and not self.conn.closed else \
            "not connected to PostgreSQL"


def _moved_key(key, before, after):
    """An update that changed the key: the old key's row is deleted (before the new one is
    upserted); [] otherwise."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    old = [before.get(k) for k in key]
    if None in old or old == [after.get(k) for k in key]:
        return []
    return [("delete", old)]


def _json_text(value):
    """An object or array as COPY and a parameter take it: JSON text (for json/jsonb
    columns; a text column gets the text)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:                       # an integer beyond 64 bits
        return json.dumps(value, separators=(",", ":"))
