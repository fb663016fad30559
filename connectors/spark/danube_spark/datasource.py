"""The `danube` data source for PySpark's Python Data Source API (pyspark.sql.datasource,
PySpark >= 4.0): batch read of a reliable topic's offsets, batch write with reliable
producers. Planning (offsets, splits) runs on the driver; each task looks up the broker
that owns its partition and opens its own channel to it (danube_spark.owners)."""

from dataclasses import dataclass

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamWriter,
                                    DataSourceWriter, InputPartition, WriterCommitMessage)

from danube_spark.errors import DanubeSparkError, OptionError
from danube_spark.columns import record_batches
from danube_spark.options import ReadOptions, WriteOptions
from danube_spark.planning import Split, ranges, splits
from danube_spark.owners import Owners
from danube_spark.schema import ARROW_SCHEMA, SCHEMA, Projection

OFFSET = ARROW_SCHEMA.get_field_index("offset")


class DanubeDataSource(DataSource):
    """`spark.dataSource.register(DanubeDataSource)`, then `format("danube")`."""

    @classmethod
    def name(cls):
        return "danube"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return DanubeBatchReader(ReadOptions.parse(self.options), Projection(schema))

    def streamReader(self, schema):
        from danube_spark.streaming import DanubeStreamReader
        return DanubeStreamReader(ReadOptions.parse(self.options), Projection(schema))

    def writer(self, schema, overwrite):
        if overwrite:
            raise OptionError("a Danube topic is append-only: use mode('append')")
        opts = WriteOptions.parse(self.options)
        check_write_schema(schema, opts)
        return DanubeBatchWriter(opts)

    def streamWriter(self, schema, overwrite):
        # Every micro-batch appends (output mode append); its rows are published by the
        # tasks, so there is nothing left to do at the micro-batch's commit.
        opts = WriteOptions.parse(self.options)
        check_write_schema(schema, opts)
        return DanubeStreamWriter(opts)


class DanubePartition(InputPartition):
    def __init__(self, split):
        super().__init__(split)
        self.split = split


class DanubeBatchReader(DataSourceReader):
    def __init__(self, opts, projection):
        self.opts = opts
        self.projection = projection

    def partitions(self):
        opts = self.opts
        with Owners(opts.service_url, opts.timeout, opts.owner_wait) as owners:
            offsets = topic_offsets(owners, opts.topic)
        planned = splits(ranges(offsets, opts.starting, opts.ending, opts.fail_on_data_loss,
                                opts.topic), opts.max_offsets_per_split)
        if not planned:
            planned = [Split(opts.topic, 0, 0, 0)]
        return [DanubePartition(s) for s in planned]

    def read(self, partition):
        return read_split(self.opts, self.projection, partition.split)


def topic_offsets(owners, topic):
    """[PartitionRange] of every partition of ``topic``, each asked of its owner. One call
    when the broker asked serves them all (a standalone broker, or a cluster's broker that
    owns every partition); otherwise (UNAVAILABLE: some partition lives elsewhere) the
    partitions are listed and each owner asked."""
    first = None
    if owners.one_call_offsets:
        try:
            return owners.seed().offsets(topic)
        except DanubeSparkError as exc:
            if exc.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_FOUND"):
                raise
            # Not all here, that broker is down, or a partition has no owner right now (a
            # failover): each partition's owner from now on. A topic that does not exist
            # is reported by the listing below.
            owners.one_call_offsets = False
            first = exc
    try:
        names = owners.partitions(topic)
    except DanubeSparkError as exc:
        if exc.code == "UNIMPLEMENTED" and first is not None:
            raise first from None       # no danube.Discovery: the broker's own answer
        raise
    out = []
    for name in names:
        out.extend(owners.call(name, lambda broker, n=name: broker.offsets(n), "the offsets"))
    return out


def read_split(opts, projection, split):
    """The rows of one split as Arrow record batches, streamed from the partition's owner
    over a channel of the task's own. If the owner fails or the partition moves midway, the
    rest of the range is read from the new owner: Spark gets every offset once."""
    if split.start >= split.end:
        return
    at = split.start
    with Owners(opts.service_url, opts.timeout, opts.owner_wait) as owners:
        retry = owners.retry(split.topic, f"reading offsets [{at}, {split.end})")
        while at < split.end:
            try:
                broker = owners.owner(split.topic)
                batches = broker.read_columns(split.topic, at, split.end, opts.batch_messages)
                for batch in record_batches(batches, split.topic, split.partition, at,
                                            split.end, opts.fail_on_data_loss):
                    at = batch.column(OFFSET).to_numpy()[-1].item() + 1
                    retry.progressed()
                    yield projection(batch)
                return
            except DanubeSparkError as exc:
                retry.failed(exc)


def check_write_schema(schema, opts):
    names = {f.name.lower(): f for f in schema.fields}
    value = names.get("value")
    if value is None:
        raise OptionError("the DataFrame to write needs a column value (binary or string)")
    if value.dataType.typeName() not in ("binary", "string"):
        raise OptionError(f"column value must be binary or string, not "
                          f"{value.dataType.simpleString()}")
    key = names.get("key")
    if key is not None and key.dataType.typeName() != "string":
        raise OptionError(f"column key must be a string, not {key.dataType.simpleString()}")
    attributes = names.get("attributes")
    if attributes is not None and attributes.dataType.typeName() != "map":
        raise OptionError(f"column attributes must be map<string,string>, not "
                          f"{attributes.dataType.simpleString()}")
    if opts.topic is None and "topic" not in names:
        raise OptionError("no topic to write to: set option topic or give a topic column")


@dataclass
class DanubeCommit(WriterCommitMessage):
    published: int


def publish_rows(opts, iterator):
    """One task's rows to the broker; the commit message counts what was published."""
    from pyspark import TaskContext
    from danube_spark.writing import TaskWriter

    context = TaskContext.get()
    label = f"p{context.partitionId()}a{context.attemptNumber()}" if context else "task"
    writer = TaskWriter(opts, label)
    try:
        for row in iterator:
            fields = {k.lower(): v for k, v in row.asDict().items()}
            # The topic option wins over a topic column (a DataFrame read from Danube
            # carries its source partition's name there), as in Kafka's sink.
            writer.add(fields.get("value"), fields.get("key"), fields.get("attributes"),
                       opts.topic or fields.get("topic"))
        writer.flush()
    finally:
        writer.close()
    return DanubeCommit(writer.sent)


class DanubeBatchWriter(DataSourceWriter):
    def __init__(self, opts):
        self.opts = opts

    def write(self, iterator):
        return publish_rows(self.opts, iterator)


class DanubeStreamWriter(DataSourceStreamWriter):
    def __init__(self, opts):
        self.opts = opts

    def write(self, iterator):
        return publish_rows(self.opts, iterator)

    def commit(self, messages, batchId):
        pass

    def abort(self, messages, batchId):
        pass
