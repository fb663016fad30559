"""The `danube` data source for PySpark's Python Data Source API (pyspark.sql.datasource,
PySpark >= 4.0): batch read of a reliable topic's offsets, batch write with reliable
producers. Planning (offsets, splits) runs on the driver; each task opens its own channel to
the broker."""

from dataclasses import dataclass

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceWriter,
                                    InputPartition, WriterCommitMessage)

from danube_spark.errors import OptionError
from danube_spark.messages import SCHEMA, rows
from danube_spark.options import ReadOptions, WriteOptions
from danube_spark.planning import Split, ranges, splits
from danube_spark.rpc import Broker


class DanubeDataSource(DataSource):
    """`spark.dataSource.register(DanubeDataSource)`, then `format("danube")`."""

    @classmethod
    def name(cls):
        return "danube"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return DanubeBatchReader(ReadOptions.parse(self.options))

    def writer(self, schema, overwrite):
        if overwrite:
            raise OptionError("a Danube topic is append-only: use mode('append')")
        opts = WriteOptions.parse(self.options)
        check_write_schema(schema, opts)
        return DanubeBatchWriter(opts)


class DanubePartition(InputPartition):
    def __init__(self, split):
        super().__init__(split)
        self.split = split


class DanubeBatchReader(DataSourceReader):
    def __init__(self, opts):
        self.opts = opts

    def partitions(self):
        opts = self.opts
        with Broker(opts.service_url, opts.timeout) as broker:
            offsets = broker.offsets(opts.topic)
        planned = splits(ranges(offsets, opts.starting, opts.ending, opts.fail_on_data_loss,
                                opts.topic), opts.max_offsets_per_split)
        if not planned:
            planned = [Split(opts.topic, 0, 0, 0)]
        return [DanubePartition(s) for s in planned]

    def read(self, partition):
        split, opts = partition.split, self.opts
        if split.start >= split.end:
            return
        with Broker(opts.service_url, opts.timeout) as broker:
            batches = broker.read_range(split.topic, split.start, split.end,
                                        opts.batch_messages)
            yield from rows(batches, split.topic, split.partition, split.start, split.end,
                            opts.fail_on_data_loss)


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


class DanubeBatchWriter(DataSourceWriter):
    def __init__(self, opts):
        self.opts = opts

    def write(self, iterator):
        from pyspark import TaskContext
        from danube_spark.writing import TaskWriter

        context = TaskContext.get()
        label = f"p{context.partitionId()}a{context.attemptNumber()}" if context else "task"
        writer = TaskWriter(self.opts, label)
        try:
            for row in iterator:
                fields = row.asDict()
                lower = {k.lower(): v for k, v in fields.items()}
                # The topic option wins over a topic column (a DataFrame read from Danube
                # carries its source partition's name there).
                topic = self.opts.topic or lower.get("topic")
                writer.add(lower.get("value"), lower.get("key"), lower.get("attributes"), topic)
            writer.flush()
        finally:
            writer.close()
        return DanubeCommit(writer.sent)
