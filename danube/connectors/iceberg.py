"""sink-iceberg: topics -> Apache Iceberg tables, on ``pyiceberg`` with its SQL catalog
(SQLite, or any SQLAlchemy URI; the warehouse on the local file system or S3) or a REST
catalog (Nessie, Polaris, Unity, Lakekeeper, SeaweedFS ...: ``type = "rest"``, the data files
where the catalog puts them, on S3).

Upstream v0.15.1's ``danube-iceberg`` is a sidecar that reads sealed WAL segments from
object storage; this is a Danube Connect sink that consumes the topic, so it works with any
storage tier. Its keys follow upstream's where they exist: ``[iceberg.catalog]`` ``type`` /
``name`` / ``uri`` / ``warehouse`` (upstream's ``catalog.properties``), ``[iceberg.storage]``
``endpoint`` / ``region`` / ``access_key`` / ``secret_key`` (upstream's
``storage.options``), and per route ``namespace`` / ``table_name`` (upstream's topic entry;
by default the topic's Danube namespace and name, as upstream). A REST catalog takes
upstream's REST properties too: ``credential`` (OAuth2 client credentials, ``id:secret``) or
``token`` (a bearer token), ``scope`` and ``oauth2_server_uri``; the ``[iceberg.storage]``
keys become its FileIO's ``s3.*`` properties, as upstream's ``catalog.properties`` carry them.

Exactly once: every batch is one Iceberg snapshot (a fast append) whose summary also
carries, under ``danube.offsets.{connector}.{subscription}``, the last offset written of
every partition of the route's topic (JSON). At start the sink reads it back from the
newest snapshot that has it and the runtime skips every record at or below, so a crash
between the catalog commit and the broker's ack never writes a row twice. (Upstream's
sidecar keeps its checkpoint in a separate object written after the commit: at least once.)
The records a batch refuses are in the dead-letter topic, acknowledged by the broker, before
that commit: a restart skips them too. A commit the catalog refuses because the table moved
on (another writer's snapshot: ``CommitFailedException``, HTTP 409 from a REST catalog) is
made again on the table reloaded; a commit whose outcome is unknown (a REST call that failed
after it was sent) is retried only if the reloaded table's offsets do not already cover the
batch: the snapshot is there or it is not, never half.

Schema: the columns come from ``field_mappings``, the registry subject, or raw columns
(``columns.py``, as sink-deltalake). A table that exists is evolved to them where Iceberg
allows it (new columns added as optional, int -> long and float -> double widened); a
change it does not allow stops the connector with the column named. A record stamped with a
newer version of the subject than the one the columns came from makes the sink read the
subject again and evolve the table before writing it."""

import asyncio
import json
import logging
import os
import re

import pyarrow as pa

from danube.connect import (ConfigError, ConsumerConfig, FatalError, Field, SinkConnector,
                            Table, Tables, Unavailable)
from danube.connect.schemas import columns_of, is_avro, latest_schema, schema_document
from danube.connect.settings import topic_name
from danube.connectors.columns import Columns
from danube.connectors.deltalake import _mappings

try:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import (CommitFailedException, ForbiddenError,
                                      NamespaceAlreadyExistsError, NoSuchTableError,
                                      OAuthError, RESTError, TableAlreadyExistsError,
                                      UnauthorizedError, ValidationError)
    from pyiceberg.transforms import parse_transform
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"sink-iceberg needs pyiceberg: {exc}", name="pyiceberg") from None

log = logging.getLogger("danube.connectors.iceberg")

# Upstream danube-iceberg's table properties: format 2, zstd Parquet, 10 metadata files kept.
TABLE_PROPERTIES = {"format-version": "2", "write.parquet.compression-codec": "zstd",
                    "write.metadata.previous-versions-max": "10",
                    "write.metadata.delete-after-commit.enabled": "true"}
TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[[1-9]\d*\]|"
                       r"truncate\[[1-9]\d*\])$")
# Iceberg has no 8/16-bit or unsigned integers: the narrow ones are written as int (32 bit),
# UInt32 as long; UInt64 has no Iceberg type that holds all of it.
_WIDEN = {pa.int8(): pa.int32(), pa.int16(): pa.int32(), pa.uint8(): pa.int32(),
          pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}


def _spec(value):
    if not isinstance(value, list):
        return "expected an array of inline tables"
    names = set()
    for i, f in enumerate(value):
        if not isinstance(f, dict) or not {"column", "transform"} <= set(f):
            return f"[{i}]: needs column and transform"
        unknown = set(f) - {"column", "transform", "name"}
        if unknown:
            return f"[{i}]: unknown key {sorted(unknown)[0]}"
        if not isinstance(f["transform"], str) or not TRANSFORM.match(f["transform"]):
            return (f"[{i}].transform: {f['transform']!r} is not one of identity, year, "
                    f"month, day, hour, void, bucket[N], truncate[W]")
        name = f.get("name") or _field_name(f["column"], f["transform"])
        if name in names:
            return f"[{i}]: partition field {name!r} appears twice"
        names.add(name)
    return None


def _field_name(column, transform):
    if transform == "identity":
        return column
    return f"{column}_{transform.split('[')[0]}"


def _identifier(kind):
    def check(value):
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            return f"{value!r}: an Iceberg {kind} here is letters, digits and '_'"
        return None
    return check


ROUTE = {
    "from": Field(str, check=topic_name),
    "subscription": Field(str, check=lambda v: None if v else "must not be empty"),
    "subscription_type": Field(str, "exclusive", choices=("exclusive", "failover")),
    "namespace": Field(str, None, check=_identifier("namespace")),
    "table_name": Field(str, None, check=_identifier("table name")),
    "include_danube_metadata": Field(bool, True),
    "expected_schema_subject": Field(str, None),
    "field_mappings": Field(list, None, check=_mappings),
    "partition_spec": Field(list, None, check=_spec),
}


def _nonempty(value):
    return None if value is None or value else "must not be empty"


CATALOG = {
    "type": Field(str, "sql", choices=("sql", "rest")),
    "name": Field(str, "danube_catalog"),
    # sql: a SQLAlchemy URI; rest: the catalog's http(s):// base URL (checked in __init__).
    "uri": Field(str, env="ICEBERG_CATALOG_URI",
                 check=lambda v: None if "://" in v else
                 "expected a SQLAlchemy URI such as sqlite:////var/lib/iceberg/catalog.db "
                 "(type sql) or the REST catalog's http(s):// URL (type rest)"),
    # Required for sql; for rest whatever the catalog calls a warehouse (s3://bucket/path,
    # a catalog name), or none when the catalog has a default.
    "warehouse": Field(str, None, env="ICEBERG_WAREHOUSE", check=_nonempty),
    # rest only: OAuth2 client credentials ("client_id:client_secret", exchanged at
    # oauth2_server_uri for a token) or a bearer token; scope asked with the credential.
    "credential": Field(str, None, env="ICEBERG_CATALOG_CREDENTIAL", check=_nonempty),
    "token": Field(str, None, env="ICEBERG_CATALOG_TOKEN", check=_nonempty),
    "scope": Field(str, None, check=_nonempty),
    "oauth2_server_uri": Field(str, None, check=lambda v: None if v is None or re.match(
        r"^https?://", v) else "expected an http(s):// URL"),
}
REST_ONLY = ("credential", "token", "scope", "oauth2_server_uri")

STORAGE = {
    "endpoint": Field(str, None, env="S3_ENDPOINT"),
    "region": Field(str, None, env="AWS_REGION"),
    "access_key": Field(str, None, env="AWS_ACCESS_KEY_ID"),
    "secret_key": Field(str, None, env="AWS_SECRET_ACCESS_KEY"),
}

ICEBERG = {
    "catalog": Table(CATALOG),
    "storage": Table(STORAGE),
    "routes": Tables(ROUTE, min_items=1),
}


def iceberg_schema(columns):
    """The Arrow schema a route's batches are written with: Columns' schema with integer
    types Iceberg lacks widened."""
    fields = []
    for field in columns.schema:
        if field.type == pa.uint64():
            raise ConfigError(f"column {field.name!r}: UInt64 has no Iceberg type (use Int64 "
                              f"or Utf8)")
        fields.append(field.with_type(_WIDEN.get(field.type, field.type)))
    return pa.schema(fields)


class _Route:
    """A route's table and what is known of it: the loaded pyiceberg Table, the Columns the
    records are parsed with, the schema version they came from, the offsets written."""

    def __init__(self, cfg, connector_name):
        self.cfg = cfg
        self.topic = getattr(cfg, "from")
        _, namespace, name = self.topic.split("/")
        self.identifier = (cfg.namespace or namespace.replace("-", "_"),
                           cfg.table_name or name.replace("-", "_"))
        self.property = f"danube.offsets.{connector_name}.{cfg.subscription}"
        self.table = None
        self.columns = None
        self.schema = None
        self.schema_version = None
        self.offsets = {}


class IcebergSink(SinkConnector):
    CONFIG = {"iceberg": Table(ICEBERG)}

    def __init__(self, context):
        super().__init__(context)
        self.ice = self.config.iceberg
        topics = [getattr(r, "from") for r in self.ice.routes]
        if len(set(topics)) != len(topics):
            raise ConfigError("iceberg.routes: a topic may feed one table only")
        self.routes = {t: _Route(r, self.core.connector_name)
                       for t, r in zip(topics, self.ice.routes)}
        idents = [r.identifier for r in self.routes.values()]
        if len(set(idents)) != len(idents):
            raise ConfigError("iceberg.routes: two routes write the same table "
                              "(namespace.table_name)")
        c = self.ice.catalog
        if c.type == "rest":
            if not re.match(r"^https?://", c.uri):
                raise ConfigError(f"iceberg.catalog.uri: {c.uri!r}: a REST catalog's URI is "
                                  f"its http:// or https:// base URL")
            if c.credential and c.token:
                raise ConfigError("iceberg.catalog: credential and token are two ways to "
                                  "authenticate: give one")
            if c.credential and ":" not in c.credential:
                raise ConfigError("iceberg.catalog.credential: expected "
                                  "client_id:client_secret")
        else:
            given = [k for k in REST_ONLY if getattr(c, k) is not None]
            if given:
                raise ConfigError(f"iceberg.catalog.{given[0]}: a REST catalog key (set "
                                  f'type = "rest")')
            if c.warehouse is None:
                raise ConfigError("iceberg.catalog.warehouse: required for the sql catalog "
                                  "(or set ICEBERG_WAREHOUSE)")
            if c.warehouse.startswith("s3://") and not self.ice.storage.region:
                raise ConfigError("iceberg.storage.region: required for an s3:// warehouse "
                                  "(or set AWS_REGION)")
        self.catalog = None

    # -- the catalog (called in a thread: pyiceberg blocks) -------------------------------

    def _properties(self):
        """pyiceberg's catalog properties (``load_catalog``'s keys) from the config."""
        c, s = self.ice.catalog, self.ice.storage
        props = {"uri": c.uri}
        if c.type == "rest":
            props["uri"] = c.uri.rstrip("/")
            if c.warehouse:
                props["warehouse"] = c.warehouse
            if c.token:
                props["token"] = c.token
            if c.credential:
                props["credential"] = c.credential
                # pyiceberg's default token endpoint, named (unnamed it warns).
                props["oauth2-server-uri"] = (c.oauth2_server_uri or
                                              props["uri"] + "/v1/oauth/tokens")
            if c.scope:
                props["scope"] = c.scope
        else:
            warehouse = c.warehouse
            if "://" not in warehouse:
                warehouse = "file://" + os.path.abspath(warehouse)
            props["warehouse"] = warehouse
        if s.endpoint:
            props["s3.endpoint"] = s.endpoint
        if s.region:
            props["s3.region"] = s.region
        if s.access_key:
            props["s3.access-key-id"] = s.access_key
        if s.secret_key:
            props["s3.secret-access-key"] = s.secret_key
        return props

    def _connect(self):
        if self.ice.catalog.type == "rest":
            return self._connect_rest()
        uri = self.ice.catalog.uri
        if uri.startswith("sqlite:///"):
            folder = os.path.dirname(uri[len("sqlite:///"):])
            if folder:
                os.makedirs(folder, exist_ok=True)
        warehouse = self.ice.catalog.warehouse
        if "://" not in warehouse or warehouse.startswith("file://"):
            os.makedirs(warehouse.removeprefix("file://"), exist_ok=True)
        return SqlCatalog(self.ice.catalog.name, **self._properties())

    def _connect_rest(self):
        """The REST catalog, its configuration read (``/v1/config``) and, with a
        credential, a token taken: errors name the catalog's URI (a refused credential is
        fatal, an unreachable catalog is waited for)."""
        from pyiceberg.catalog.rest import RestCatalog
        try:
            catalog = RestCatalog(self.ice.catalog.name, **self._properties())
        except (OAuthError, UnauthorizedError, ForbiddenError) as exc:
            raise FatalError(self._refused(exc)) from None
        except RESTError as exc:
            raise Unavailable(f"Iceberg REST catalog {self.ice.catalog.uri}: "
                              f"{type(exc).__name__}: {exc}") from None
        except OSError as exc:          # requests' ConnectionError, Timeout
            raise Unavailable(f"Iceberg REST catalog {self.ice.catalog.uri} unreachable: "
                              f"{type(exc).__name__}: {exc}") from None
        except ValueError as exc:       # not a catalog's answer (pydantic, JSON)
            raise Unavailable(f"Iceberg REST catalog {self.ice.catalog.uri}: not an "
                              f"Iceberg REST catalog's answer to /v1/config: {exc}") from None
        log.info("Iceberg REST catalog %s", self.ice.catalog.uri,
                 extra={"warehouse": self.ice.catalog.warehouse or ""})
        return catalog

    def _refused(self, exc):
        """A 401 (the credential or token is not accepted) or a 403 (it is, but may not do
        this): the catalog's URI and what it said."""
        c = self.ice.catalog
        if isinstance(exc, ForbiddenError):
            return (f"Iceberg REST catalog {c.uri} forbids it (the identity may not create "
                    f"or write this namespace or table): {type(exc).__name__}: {exc}")
        how = ("credential" if c.credential else "token" if c.token
               else "request without a credential or token")
        return (f"Iceberg REST catalog {c.uri} refused the {how}: "
                f"{type(exc).__name__}: {exc}")

    def _load(self, route):
        """Open (or create) the route's table, shaped to its columns and partition spec."""
        if self.catalog is None:
            self.catalog = self._connect()
        try:
            table = self.catalog.load_table(route.identifier)
        except NoSuchTableError:
            table = self._create(route)
        self._evolve(route, table)
        route.table = table
        route.offsets = self._offsets(route, table)
        return table

    def _create(self, route):
        namespace, name = route.identifier
        try:
            self.catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        try:
            with self.catalog.create_table_transaction(
                    route.identifier, schema=route.schema,
                    properties=TABLE_PROPERTIES) as txn:
                if route.cfg.partition_spec:
                    with txn.update_spec() as spec:
                        for f in route.cfg.partition_spec:
                            spec.add_field(f["column"], parse_transform(f["transform"]),
                                           f.get("name") or _field_name(f["column"],
                                                                        f["transform"]))
        except TableAlreadyExistsError:
            pass                    # created by another sink in the meantime
        log.info("created Iceberg table %s.%s", namespace, name)
        return self.catalog.load_table(route.identifier)

    def _evolve(self, route, table):
        """The table's schema and spec made to fit the route's columns and partition spec,
        as far as Iceberg allows; FatalError naming what it does not."""
        current = table.schema()
        wanted = route.schema
        missing = [f.name for f in current.fields
                   if f.required and f.name not in wanted.names]
        if missing:
            raise FatalError(f"Iceberg table {'.'.join(route.identifier)}: required column "
                             f"{missing[0]!r} is not among the sink's columns")
        known = {f.name for f in current.fields}
        # New columns are optional: rows written before them have none.
        relaxed = pa.schema([f if f.name in known else f.with_nullable(True)
                             for f in wanted])
        try:
            with table.update_schema() as update:
                update.union_by_name(relaxed)
        except (ValidationError, ValueError, TypeError) as exc:
            raise FatalError(f"Iceberg table {'.'.join(route.identifier)}: the columns "
                             f"cannot evolve so: {exc}") from None
        if table.schema().schema_id != current.schema_id:
            log.info("evolved the schema of Iceberg table %s", ".".join(route.identifier),
                     extra={"columns": ",".join(table.schema().column_names)})
        wanted_spec = {(f["column"], f["transform"]) for f in route.cfg.partition_spec or ()}
        have = {(table.schema().find_column_name(f.source_id), str(f.transform))
                for f in table.spec().fields}
        if wanted_spec != have and route.cfg.partition_spec is not None:
            try:
                with table.update_spec() as spec:
                    for f in table.spec().fields:
                        if (table.schema().find_column_name(f.source_id),
                                str(f.transform)) not in wanted_spec:
                            spec.remove_field(f.name)
                    for column, transform in sorted(wanted_spec - have):
                        spec.add_field(column, parse_transform(transform),
                                       _field_name(column, transform))
            except (ValidationError, ValueError) as exc:
                raise FatalError(f"Iceberg table {'.'.join(route.identifier)}: partition "
                                 f"spec: {exc}") from None
            log.info("evolved the partition spec of Iceberg table %s",
                     ".".join(route.identifier))

    @staticmethod
    def _offsets(route, table):
        """{partition: last offset} of the newest snapshot (walking back through its
        ancestors) that carries this sink's offsets."""
        snapshot = table.current_snapshot()
        while snapshot is not None:
            value = snapshot.summary.additional_properties.get(route.property) \
                if snapshot.summary else None
            if value is not None:
                return {k: int(v) for k, v in json.loads(value).items()}
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        return {}

    # A commit refused because the table moved on is made again at once on the table
    # reloaded, this many times, before the runtime's retries take over.
    CONFLICT_RETRIES = 5

    def _append(self, route, batch, offsets):
        for attempt in range(self.CONFLICT_RETRIES + 1):
            table = route.table or self._load(route)
            if all(route.offsets.get(p, -1) >= o for p, o in offsets.items()):
                # Reloaded after a commit whose answer was lost: the snapshot is there.
                log.info("batch already in Iceberg table %s (its offsets are committed)",
                         ".".join(route.identifier))
                return
            merged = dict(route.offsets)
            merged.update(offsets)
            try:
                table.append(batch, snapshot_properties={
                    route.property: json.dumps(merged, separators=(",", ":"),
                                               sort_keys=True)})
            except CommitFailedException as exc:
                route.table = None      # another writer's snapshot came first: reload
                if attempt == self.CONFLICT_RETRIES:
                    raise
                log.info("Iceberg commit conflict on %s, committing again on the table "
                         "reloaded: %s", ".".join(route.identifier), exc)
                continue
            except BaseException:
                route.table = None      # loaded afresh (the catalog may have moved on)
                raise
            route.offsets = merged
            return

    # -- the connector --------------------------------------------------------------------

    def consumer_configs(self):
        return [ConsumerConfig(r.topic, r.cfg.subscription, r.cfg.subscription_type,
                               expected_schema_subject=r.cfg.expected_schema_subject)
                for r in self.routes.values()]

    async def _columns(self, route):
        cfg = route.cfg
        mappings = avro = None
        if cfg.field_mappings:
            mappings = [(m["json_path"], m["column"], m["data_type"], m.get("nullable", True))
                        for m in cfg.field_mappings]
        elif cfg.expected_schema_subject:
            kind, definition, version = await latest_schema(
                self.context.runtime.client, cfg.expected_schema_subject)
            mappings = [(c, c, t, n) for c, t, n in
                        columns_of(cfg.expected_schema_subject, kind, definition)]
            if is_avro(kind):
                avro = schema_document(cfg.expected_schema_subject, definition)
            route.schema_version = version
            log.info("columns from schema %s version %d", cfg.expected_schema_subject, version)
        columns = Columns(mappings, cfg.include_danube_metadata, avro)
        schema = iceberg_schema(columns)
        names = set(schema.names)
        for f in cfg.partition_spec or ():
            if f["column"] not in names:
                raise ConfigError(f"iceberg.routes: {route.topic}: partition_spec column "
                                  f"{f['column']!r} is not a column (columns: "
                                  f"{', '.join(schema.names)})")
        route.columns, route.schema = columns, schema

    async def initialize(self):
        for route in self.routes.values():
            await self._columns(route)
        for route in self.routes.values():
            await self._call(self._load, route)

    async def committed_offsets(self):
        out = {}
        for route in self.routes.values():
            if route.table is None:
                await self._call(self._load, route)
            out.update(route.offsets)
        return out

    def prepare(self, records):
        """Per topic: (route, Arrow batch of the good records, [InvalidRecord], {partition:
        last offset}, the Columns it was parsed with). Parsing only: the runtime runs it for
        the next batch while this one is written."""
        by_topic = {}
        for record in records:
            by_topic.setdefault(record.topic, []).append(record)
        out = []
        for topic, group in by_topic.items():
            route = self.routes[topic]
            if route.schema_version is not None and any(
                    (r.schema_version or 0) > route.schema_version for r in group):
                out.append((route, None, [], {}, None))     # parsed after the evolution
                continue
            out.append(self._split(route, group))
        return out

    @staticmethod
    def _split(route, group):
        table, bad = route.columns.split(group)
        last = {}
        for record in group:
            last[record.partition] = record.offset
        batch = table.cast(route.schema) if table.schema != route.schema else table
        return route, batch, bad, last, route.columns

    async def process_batch(self, records, prepared=None):
        rejected = []
        for route, batch, bad, last, columns in prepared or self.prepare(records):
            if columns is not route.columns or batch is None:
                # A newer schema version came: read the subject again, evolve the table,
                # and parse this topic's records with the new columns.
                group = [r for r in records if r.topic == route.topic]
                if route.schema_version is not None and any(
                        (r.schema_version or 0) > route.schema_version for r in group):
                    await self._columns(route)
                    await self._call(self._load, route)
                route, batch, bad, last, _ = self._split(route, group)
            # Before the commit that carries their offsets: a restart skips them.
            await self.dead_letter(bad)
            rejected.extend(bad)
            await self._call(self._append, route, batch, last)
        return rejected

    async def _call(self, fn, *args):
        try:
            return await asyncio.to_thread(fn, *args)
        except (FatalError, ConfigError, Unavailable):
            raise
        except CommitFailedException as exc:
            # Still conflicting after CONFLICT_RETRIES reloads: waited for, never
            # dead-lettered (the records are good).
            raise Unavailable(f"Iceberg commit conflict: {exc}") from None
        except (OAuthError, UnauthorizedError, ForbiddenError) as exc:
            raise FatalError(self._refused(exc)) from None
        except RESTError as exc:        # 5xx, CommitStateUnknown, 429: reloaded, retried
            raise Unavailable(f"Iceberg REST catalog {self.ice.catalog.uri}: "
                              f"{type(exc).__name__}: {exc}") from None
        except (ValidationError, ValueError, TypeError) as exc:
            raise FatalError(f"Iceberg table refuses the batch: {exc}") from None
        except Exception as exc:        # noqa: BLE001 - storage and catalog outages
            raise Unavailable(f"Iceberg catalog or storage: {type(exc).__name__}: "
                              f"{exc}") from None
