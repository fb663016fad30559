"""sink-deltalake: topics -> Delta Lake tables (upstream danube-connectors/sink-deltalake,
same ``[deltalake]`` keys and ``[[deltalake.routes]]``), on the ``deltalake`` library, on
the local file system or S3.

Exactly once: every batch is one Delta commit that also records, as Delta application
transactions (``txn`` actions: app id ``danube:{connector}:{subscription}:{partition}``,
version = the partition's last offset in the commit), how far each partition is written.
At start the sink reads those versions back and the runtime skips every record at or below
them, so a crash between the Delta commit and the broker's ack never writes a row twice.
(Upstream writes and acks without a transaction: a crash there duplicates the batch.) The
records a batch refuses are in the dead-letter topic, acknowledged by the broker, before
that commit: a restart skips them too."""

import asyncio
import logging

from danube.connect import (ConfigError, ConsumerConfig, FatalError, Field, RetryableError,
                            SinkConnector, Table, Tables, Unavailable)
from danube.connect.schemas import columns_of, is_avro, latest_schema, schema_document
from danube.connect.settings import topic_name
from danube.connectors.columns import DATA_TYPES, Columns

try:
    import deltalake
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import (CommitFailedError, DeltaError, DeltaProtocolError,
                                      SchemaMismatchError, TableNotFoundError)
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"sink-deltalake needs deltalake: {exc}", name="deltalake") from None

log = logging.getLogger("danube.connectors.deltalake")


def _mappings(value):
    if not isinstance(value, list):
        return "expected an array of inline tables"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not {"json_path", "column", "data_type"} <= set(m):
            return f"[{i}]: needs json_path, column and data_type"
        unknown = set(m) - {"json_path", "column", "data_type", "nullable"}
        if unknown:
            return f"[{i}]: unknown key {sorted(unknown)[0]}"
        if m["data_type"] not in DATA_TYPES:
            return f"[{i}].data_type: {m['data_type']!r} is not one of {', '.join(DATA_TYPES)}"
        if not isinstance(m.get("nullable", True), bool):
            return f"[{i}].nullable: expected true or false"
    return None


ROUTE = {
    "from": Field(str, check=topic_name),
    "subscription": Field(str, check=lambda v: None if v else "must not be empty"),
    "subscription_type": Field(str, "exclusive", choices=("exclusive", "failover")),
    "to": Field(str, check=lambda v: None if v else "must not be empty"),
    "write_mode": Field(str, "append", choices=("append",)),
    "include_danube_metadata": Field(bool, True),
    "expected_schema_subject": Field(str, None),
    "field_mappings": Field(list, None, check=_mappings),
    "partition_by": Field(list, None),
}

DELTA = {
    "storage_backend": Field(str, "local", choices=("local", "s3")),
    "s3_region": Field(str, None, env="AWS_REGION"),
    "s3_endpoint": Field(str, None, env="S3_ENDPOINT"),
    "s3_allow_http": Field(bool, False),
    "routes": Tables(ROUTE, min_items=1),
}


class DeltaLakeSink(SinkConnector):
    CONFIG = {"deltalake": Table(DELTA)}

    def __init__(self, context):
        super().__init__(context)
        self.delta = self.config.deltalake
        if self.delta.storage_backend == "s3" and not self.delta.s3_region:
            raise ConfigError("deltalake.s3_region: required when storage_backend = \"s3\" "
                              "(or set AWS_REGION)")
        topics = [getattr(r, "from") for r in self.delta.routes]
        if len(set(topics)) != len(topics):
            raise ConfigError("deltalake.routes: a topic may feed one table only")
        self.by_topic = {getattr(r, "from"): r for r in self.delta.routes}
        self.columns = {}
        # Open tables by route: writing through a DeltaTable that is kept open reads only
        # the log's new commits, where a URI replays the log at every write (2-3x slower
        # per batch here).
        self.tables = {}

    def storage_options(self):
        d = self.delta
        if d.storage_backend != "s3":
            return None
        import os
        options = {"AWS_REGION": d.s3_region, "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
        if d.s3_endpoint:
            options["AWS_ENDPOINT_URL"] = d.s3_endpoint
        if d.s3_allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            if os.environ.get(key):
                options[key] = os.environ[key]
        return options

    def consumer_configs(self):
        return [ConsumerConfig(getattr(r, "from"), r.subscription, r.subscription_type,
                               expected_schema_subject=r.expected_schema_subject)
                for r in self.delta.routes]

    def app_id(self, route, partition):
        return f"danube:{self.core.connector_name}:{route.subscription}:{partition}"

    async def initialize(self):
        client = self.context.runtime.client
        for route in self.delta.routes:
            mappings = avro = None
            if route.field_mappings:
                mappings = [(m["json_path"], m["column"], m["data_type"],
                             m.get("nullable", True)) for m in route.field_mappings]
            elif route.expected_schema_subject:
                kind, definition, version = await latest_schema(
                    client, route.expected_schema_subject)
                mappings = [(c, c, t, n) for c, t, n in
                            columns_of(route.expected_schema_subject, kind, definition)]
                if is_avro(kind):
                    avro = schema_document(route.expected_schema_subject, definition)
                log.info("columns from schema %s version %d", route.expected_schema_subject,
                         version)
            self.columns[getattr(route, "from")] = Columns(mappings,
                                                           route.include_danube_metadata, avro)

    def _open(self, route):
        try:
            return DeltaTable(route.to, storage_options=self.storage_options())
        except TableNotFoundError:
            return None

    async def committed_offsets(self):
        client = self.context.runtime.client
        out = {}
        for route in self.delta.routes:
            table = await self._call(self._open, route)
            if table is None:
                continue
            for partition in await client.partitions(getattr(route, "from")):
                version = table.transaction_version(self.app_id(route, partition))
                if version is not None:
                    out[partition] = version
        return out

    def prepare(self, records):
        """Per topic: (route, Arrow table of the good records, [InvalidRecord], {partition:
        last offset}). Parsing only: the runtime runs it for the next batch while this one
        is written."""
        by_topic = {}
        for record in records:
            by_topic.setdefault(record.topic, []).append(record)
        out = []
        for topic, group in by_topic.items():
            table, bad = self.columns[topic].split(group)
            last = {}
            for record in group:
                last[record.partition] = record.offset
            out.append((self.by_topic[topic], table, bad, last))
        return out

    async def process_batch(self, records, prepared=None):
        rejected = []
        for route, table, bad, last in prepared or self.prepare(records):
            # Before the commit that carries their offsets: a restart skips them.
            await self.dead_letter(bad)
            rejected.extend(bad)
            txns = [Transaction(self.app_id(route, p), v) for p, v in last.items()]
            await self._call(self._write, route, table, txns)
        return rejected

    def _write(self, route, table, txns):
        target = self.tables.get(route.to)
        try:
            write_deltalake(route.to if target is None else target, table, mode="append",
                            partition_by=route.partition_by,
                            storage_options=self.storage_options(),
                            commit_properties=CommitProperties(app_transactions=txns))
        except BaseException:
            self.tables.pop(route.to, None)      # opened afresh by the next write
            raise
        if target is None:
            self.tables[route.to] = self._open(route)

    async def _call(self, fn, *args):
        try:
            return await asyncio.to_thread(fn, *args)
        except (SchemaMismatchError, DeltaProtocolError) as exc:
            raise FatalError(f"Delta table refuses the batch: {exc}") from None
        except CommitFailedError as exc:
            raise RetryableError(f"Delta commit conflict: {exc}") from None
        except (DeltaError, OSError) as exc:
            raise Unavailable(f"Delta storage: {exc}") from None
