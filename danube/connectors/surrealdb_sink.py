"""sink-surrealdb: topics -> SurrealDB tables (upstream danube-connectors/sink-surrealdb, the
same ``[surrealdb]`` keys and ``[[surrealdb.routes]]``), on the ``surrealdb`` Python SDK: a
server (``ws://``, ``wss://``, ``http://``, ``https://``) or, ours, the embedded engine in
this process (``file://``, ``surrealkv://``, ``mem://``).

A record is a JSON object, stored as one document of the route's table. With
``storage_mode = "TimeSeries"`` it also gets ``_timestamp`` (the publish time, RFC 3339), with
``include_danube_metadata`` a ``_danube_metadata`` object (``danube_topic``,
``danube_partition``, ``danube_offset``, ``danube_timestamp``, ``danube_producer``).

Delivery: at least once with idempotent writes. Every record has a deterministic record id:
the ``record_id`` attribute (upstream's), else the document's own ``id`` field (what
SurrealDB would take as its id), else ``[partition, offset]`` (an array id: the partition's
topic and the record's offset). Each is written with ``UPSERT ... CONTENT`` (upstream
``CREATE``s, which fails on a record written again), so a batch written again after a crash
replaces the same records with the same contents: none twice, none lost. A batch is one
statement (one transaction); when SurrealDB refuses it (a SCHEMAFULL table's field of the
wrong type, an ASSERT) the records are written one by one and those refused go to the
dead-letter topic, acknowledged by the broker, before the batch is acknowledged."""

import asyncio
import datetime
import logging
import urllib.parse

import orjson

from danube.connect import (ConfigError, ConsumerConfig, FatalError, Field, InvalidRecord,
                            SinkConnector, Table, Tables, Unavailable)
from danube.connect.settings import topic_name, upstream_subscription_type

try:
    from surrealdb import AsyncSurreal, RecordID
    from surrealdb.errors import NotAllowedError, ServerError, SurrealError
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"sink-surrealdb needs surrealdb (pip install "
                      f"'danube-broker-py[surrealdb]'): {exc}", name="surrealdb") from None

log = logging.getLogger("danube.connectors.surrealdb")

SCHEMES = ("ws", "wss", "http", "https", "mem", "memory", "file", "surrealkv",
           "surrealkv+versioned")
REMOTE = ("ws", "wss", "http", "https")

# One statement: every record of the batch in one transaction.
WRITE = "FOR $r IN $rows { UPSERT $r.id CONTENT $r.doc RETURN NONE; };"
WRITE_ONE = "UPSERT $id CONTENT $doc RETURN NONE;"


def _url(value):
    scheme = urllib.parse.urlsplit(value).scheme
    if scheme not in SCHEMES:
        return (f"{value!r}: expected ws://, wss://, http://, https:// (a server) or "
                f"file://, surrealkv://, mem:// (embedded)")
    return None


def _name(value):
    return None if value else "must not be empty"


ROUTE = {
    "from": Field(str, check=topic_name),
    "subscription": Field(str, check=_name),
    "subscription_type": Field(str, "Shared", check=upstream_subscription_type),
    "to": Field(str, check=lambda v: None if v and all(c.isalnum() or c == "_" for c in v)
                else f"{v!r}: a table name of letters, digits and '_'"),
    "include_danube_metadata": Field(bool, True),
    "expected_schema_subject": Field(str, None),
    "storage_mode": Field(str, "Document", choices=("Document", "TimeSeries")),
}

SURREALDB = {
    "url": Field(str, env="SURREALDB_URL", check=_url),
    "namespace": Field(str, check=_name),
    "database": Field(str, check=_name),
    "username": Field(str, None, env="SURREALDB_USERNAME"),
    "password": Field(str, None, env="SURREALDB_PASSWORD"),
    "connection_timeout_secs": Field(int, 30, min=1),
    "request_timeout_secs": Field(int, 30, min=1),
    "routes": Tables(ROUTE, min_items=1),
}


def _rfc3339(millis):
    return datetime.datetime.fromtimestamp(millis / 1000, datetime.timezone.utc).isoformat()


class Route:
    def __init__(self, cfg):
        self.cfg = cfg
        self.topic = getattr(cfg, "from")
        self.table = cfg.to
        self.timeseries = cfg.storage_mode == "TimeSeries"
        self.metadata = cfg.include_danube_metadata

    def row(self, record):
        """{"id": RecordID, "doc": {...}} of ``record``; InvalidRecord if it cannot be one."""
        try:
            doc = orjson.loads(record.payload)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecord(f"invalid JSON: {exc}", record) from None
        if not isinstance(doc, dict):
            raise InvalidRecord(f"expected a JSON object, got {type(doc).__name__}", record)
        own = doc.pop("id", None)
        key = record.attributes.get("record_id")
        if key is None:
            key = own
        if key is None:
            key = [record.partition, record.offset]
        elif isinstance(key, bool) or not isinstance(key, (str, int)) or key == "":
            raise InvalidRecord(f"field 'id': expected a string or an integer, got "
                                f"{key!r}", record)
        if self.timeseries:
            doc["_timestamp"] = _rfc3339(record.publish_time)
        if self.metadata:
            doc["_danube_metadata"] = {
                "danube_topic": record.topic, "danube_partition": record.partition,
                "danube_offset": record.offset,
                "danube_timestamp": _rfc3339(record.publish_time),
                "danube_producer": record.producer_name}
        return {"id": RecordID(self.table, key), "doc": doc}


class SurrealDBSink(SinkConnector):
    CONFIG = {"surrealdb": Table(SURREALDB)}

    def __init__(self, context):
        super().__init__(context)
        self.s = self.config.surrealdb
        if (self.s.username is None) != (self.s.password is None):
            raise ConfigError("surrealdb.username and surrealdb.password: give both or "
                              "neither (SURREALDB_USERNAME, SURREALDB_PASSWORD)")
        self.routes = {}
        for i, cfg in enumerate(self.s.routes):
            route = Route(cfg)
            if route.topic in self.routes:
                raise ConfigError(f"surrealdb.routes[{i}].from: {route.topic} is routed "
                                  f"twice")
            self.routes[route.topic] = route
        self.db = None

    def consumer_configs(self):
        return [ConsumerConfig(r.topic, r.cfg.subscription,
                               r.cfg.subscription_type.lower(),
                               consumer_name=f"surrealdb-sink-{r.table}",
                               expected_schema_subject=r.cfg.expected_schema_subject)
                for r in self.routes.values()]

    # -- the connection -------------------------------------------------------------------

    async def initialize(self):
        await self._connected()

    async def _connected(self):
        if self.db is not None:
            return self.db
        s = self.s
        db = AsyncSurreal(s.url)
        try:
            await asyncio.wait_for(self._open(db), s.connection_timeout_secs)
        except NotAllowedError as exc:
            await self._close(db)
            raise FatalError(f"SurrealDB refused the sign-in or namespace: {exc}") from None
        except (SurrealError, OSError, asyncio.TimeoutError) as exc:
            await self._close(db)
            raise Unavailable(f"SurrealDB at {s.url}: {_reason(exc)}") from None
        self.db = db
        return db

    async def _open(self, db):
        s = self.s
        await db.connect()
        if s.username is not None:
            await db.signin({"username": s.username, "password": s.password})
        await db.use(s.namespace, s.database)

    @staticmethod
    async def _close(db):
        try:
            await db.close()
        except Exception as exc:      # noqa: BLE001 - it is being dropped
            log.debug("closing SurrealDB: %s", exc)

    async def _lost(self):
        db, self.db = self.db, None
        if db is not None:
            await self._close(db)

    async def health_check(self):
        try:
            db = await self._connected()
            await asyncio.wait_for(db.query("RETURN 1"), self.s.request_timeout_secs)
        except Exception as exc:      # noqa: BLE001
            return f"SurrealDB: {_reason(exc)}"
        return None

    async def shutdown(self):
        await self._lost()

    # -- records --------------------------------------------------------------------------

    def prepare(self, records):
        """Per route: (route, [(row, record)], [InvalidRecord])."""
        out = {}
        for record in records:
            route = self.routes[record.topic]
            entry = out.get(record.topic)
            if entry is None:
                entry = out[record.topic] = (route, [], [])
            try:
                entry[1].append((route.row(record), record))
            except InvalidRecord as exc:
                entry[2].append(exc)
        return list(out.values())

    async def process_batch(self, records, prepared=None):
        rejected = []
        for route, rows, bad in prepared or self.prepare(records):
            # In the dead-letter topic before the batch is acknowledged.
            await self.dead_letter(bad)
            rejected.extend(bad)
            if rows:
                refused = await self._write(rows)
                await self.dead_letter(refused)
                rejected.extend(refused)
        return rejected

    async def _write(self, rows):
        """Write ``rows``: one statement; when SurrealDB refuses it, row by row.
        [InvalidRecord] for the rows refused."""
        try:
            await self._query(WRITE, {"rows": [row for row, _r in rows]})
            return []
        except ServerError as exc:
            if isinstance(exc, NotAllowedError):
                raise FatalError(f"SurrealDB: {_reason(exc)}") from None
            if len(rows) == 1:
                return [InvalidRecord(f"SurrealDB refused the record: {_reason(exc)}",
                                      rows[0][1])]
        refused = []
        for row, record in rows:
            try:
                await self._query(WRITE_ONE, row)
            except NotAllowedError as exc:
                raise FatalError(f"SurrealDB: {_reason(exc)}") from None
            except ServerError as exc:
                refused.append(InvalidRecord(f"SurrealDB refused the record: "
                                             f"{_reason(exc)}", record))
        return refused

    async def _query(self, statement, variables):
        """Run ``statement``: ServerError as SurrealDB answered it; Unavailable for a
        connection that failed or a request that timed out (reconnected next time)."""
        db = await self._connected()
        try:
            return await asyncio.wait_for(db.query(statement, variables),
                                          self.s.request_timeout_secs)
        except ServerError:
            raise
        except (SurrealError, OSError, asyncio.TimeoutError, ConnectionError) as exc:
            await self._lost()
            raise Unavailable(f"SurrealDB: {_reason(exc)}") from None
        except Exception as exc:      # noqa: BLE001 - websockets' ConnectionClosed and kin
            if type(exc).__module__.startswith(("websockets", "aiohttp")):
                await self._lost()
                raise Unavailable(f"SurrealDB: {_reason(exc)}") from None
            raise


def _reason(exc):
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 500 else text[:500] + "..."

