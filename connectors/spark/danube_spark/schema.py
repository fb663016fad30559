"""The columns a Danube topic reads as (Kafka's source's names, and Danube's own), as Spark
and as Arrow see them."""

import pyarrow as pa
from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType,
                               StructField, StructType, TimestampType)

from danube_spark.errors import OptionError

SCHEMA = StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("producer", StringType()),
    StructField("attributes", MapType(StringType(), StringType())),
    StructField("schema_id", LongType()),
    StructField("schema_version", IntegerType()),
])


def _arrow_schema(schema):
    # Spark checks a data source's record batches against exactly this schema (4.2 and
    # later), so it is Spark's own conversion, with the time zone it uses.
    from pyspark.sql.pandas.types import to_arrow_schema
    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:      # PySpark < 4.1: no timezone argument; timestamps are UTC
        return to_arrow_schema(schema)


ARROW_SCHEMA = _arrow_schema(SCHEMA)


class Projection:
    """The columns a read returns: all of SCHEMA, or those of a schema the job gave
    (`spark.read.format("danube").schema("value binary, offset long")`), which Spark then
    never receives the rest of."""

    def __init__(self, schema=None):
        if schema is None or schema == SCHEMA:
            self.names, self.arrow = None, ARROW_SCHEMA
            return
        ours = {f.name: f for f in SCHEMA.fields}
        for field in schema.fields:
            known = ours.get(field.name)
            if known is None:
                raise OptionError(f"column {field.name} is not one of the danube source's "
                                  f"({', '.join(ours)})")
            if known.dataType != field.dataType:
                raise OptionError(f"column {field.name} is {known.dataType.simpleString()} "
                                  f"in the danube source, not "
                                  f"{field.dataType.simpleString()}")
        self.names = [f.name for f in schema.fields]
        self.arrow = _arrow_schema(schema)

    def __call__(self, batch):
        if self.names is None:
            return batch
        return pa.RecordBatch.from_arrays([batch.column(n) for n in self.names],
                                          schema=self.arrow)
