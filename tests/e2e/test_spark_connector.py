"""The danube-spark connector (connectors/spark, installed from its wheel by bin/test) in a
real local SparkSession against the real broker process: batch read of a 3-partition
reliable topic, write -> read round trip, and an error naming the problem for each bad
option. One SparkSession for the module (starting Spark takes seconds).

The read tests need the broker's danube_ext.TopicHistory service."""

import asyncio
import json
import os
import shutil
import sys
import time
import uuid

import pytest

pytest.importorskip("pyspark", reason="bin/test installs pyspark[sql] for these tests")
pytest.importorskip("danube_spark", reason="bin/test builds and installs connectors/spark")

from broker_process import BrokerProcess  # noqa: E402
from danube.client import DanubeClient, fnv1a64  # noqa: E402


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("spark-broker")).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("java is not installed; bin/test installs openjdk-17-jre-headless")
    from pyspark.sql import SparkSession
    from danube_spark import DanubeDataSource

    # The Python workers (which run the data source) must be this interpreter, which has
    # danube_spark installed, not whatever python3 is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("danube-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "512m")
               .getOrCreate())
    session.dataSource.register(DanubeDataSource)
    yield session
    session.stop()


def url(broker):
    return f"http://{broker.client_addr}"


def unique(name):
    return f"/default/{name}_{uuid.uuid4().hex[:8]}"


def read(spark, broker, topic, **options):
    reader = spark.read.format("danube").option("service_url", url(broker)).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def publish_keyed(broker, topic, n, partitions):
    """n messages with keys and attributes through danube.client's reliable producer; returns
    {(partition name, offset): (key, payload, attributes)} as the broker numbers them."""
    async def run():
        async with DanubeClient(url(broker)) as client:
            producer = await client.create_producer(topic, "pub", partitions=partitions,
                                                    reliable=True)
            expected, next_offset = {}, {}
            for i in range(n):
                key, payload, attrs = f"k{i % 7}", f"m-{i}".encode(), {"i": str(i), "x": "y"}
                await producer.send(payload, attrs, key=key)
                part = f"{topic}-part-{fnv1a64(key) % partitions}"
                offset = next_offset.get(part, 0)
                next_offset[part] = offset + 1
                expected[(part, offset)] = (key, payload, attrs)
            await producer.close()
            return expected
    return asyncio.run(run())


def test_batch_read_of_a_partitioned_topic_returns_what_was_published(spark, broker):
    topic = unique("spark_read")
    before = time.time()
    expected = publish_keyed(broker, topic, 60, partitions=3)
    df = read(spark, broker, topic)
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert len(rows) == 60
    got = {(r.topic, r.offset): (r.key, bytes(r.value), dict(r.attributes)) for r in rows}
    assert got == expected
    for r in rows:
        assert r.partition == int(r.topic.rsplit("-part-", 1)[1])
        assert r.producer == f"pub-{r.partition}"
        assert before - 5 <= r.timestamp.replace(tzinfo=None).timestamp() <= time.time() + 5 \
            or before - 5 <= r.timestamp.timestamp() <= time.time() + 5
        assert r.schema_id is None and r.schema_version is None


def test_offsets_options_select_a_range(spark, broker):
    topic = unique("spark_range")
    expected = publish_keyed(broker, topic, 30, partitions=3)
    part0 = f"{topic}-part-0"
    n0 = sum(1 for (p, _) in expected if p == part0)
    df = read(spark, broker, topic,
              startingOffsets=json.dumps({part0: 1}),
              endingOffsets=json.dumps({part0: n0 - 1, f"{topic}-part-1": 0,
                                        f"{topic}-part-2": 0}))
    offsets = sorted((r.topic, r.offset) for r in df.collect())
    assert offsets == [(part0, o) for o in range(1, n0 - 1)]
    assert read(spark, broker, topic, startingOffsets="latest").count() == 0
    # Ranges larger than maxOffsetsPerSplit are cut into more Spark partitions.
    df = read(spark, broker, topic, maxOffsetsPerSplit=2)
    assert df.rdd.getNumPartitions() > 3 and df.count() == 30


def test_write_then_read_round_trip(spark, broker):
    topic = unique("spark_round_trip")
    data = [(f"key{i % 3}", f"value-{i}", {"n": str(i)}) for i in range(50)]
    df = spark.createDataFrame(data, "key string, value string, attributes map<string,string>")
    (df.repartition(2).write.format("danube").mode("append")
     .option("service_url", url(broker)).option("topic", topic).save())
    rows = read(spark, broker, topic).collect()
    got = sorted((r.key, bytes(r.value).decode(), dict(r.attributes)) for r in rows)
    assert got == sorted(data)
    assert sorted(r.offset for r in rows) == list(range(50))


def test_write_publishes_to_a_reliable_subscription(spark, broker):
    """The write path alone (no TopicHistory): a reliable subscription created before the
    write receives every row, with its key and attributes; binary values and a topic
    column."""
    topic = unique("spark_write")

    data = [(topic, f"k{i}", bytes([i]) * 3, {"i": str(i)}) for i in range(20)]

    def write():
        df = spark.createDataFrame(
            data, "topic string, key string, value binary, attributes map<string,string>")
        df.write.format("danube").mode("append").option("service_url", url(broker)).save()

    async def subscribe_write_receive():
        async with DanubeClient(url(broker)) as client:
            # The topic exists as a reliable topic before the subscription, so the
            # subscription is reliable; it starts at the live tail, before the write.
            producer = await client.create_producer(topic, "seed", reliable=True)
            await producer.close()
            consumer = await client.subscribe(topic, "c", "sub")
            await asyncio.get_running_loop().run_in_executor(None, write)
            out = []
            for _ in range(len(data)):
                msg = await consumer.receive(timeout=30)
                out.append(msg)
                await consumer.ack(msg)
            await consumer.close()
            return out

    msgs = asyncio.run(subscribe_write_receive())
    got = sorted((m.routing_key, m.payload, dict(m.attributes)) for m in msgs)
    assert got == sorted((f"k{i}", bytes([i]) * 3, {"i": str(i)}) for i in range(20))
    assert all(m.msg_id.topic_name == topic for m in msgs)


# -- errors that name the problem ------------------------------------------------------------

def expect_error(action, *fragments):
    with pytest.raises(Exception) as info:
        action()
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in the error:\n{text[:3000]}"


def test_unknown_topic(spark, broker):
    topic = unique("no_such_topic")
    expect_error(lambda: read(spark, broker, topic).collect(), f"topic {topic} not found")


def test_non_reliable_topic(spark, broker):
    topic = unique("spark_non_reliable")

    async def make():
        async with DanubeClient(url(broker)) as client:
            producer = await client.create_producer(topic, "p")
            await producer.send(b"x")
            await producer.close()
    asyncio.run(make())
    expect_error(lambda: read(spark, broker, topic).collect(), "use a reliable topic", topic)


def test_bad_offsets_json(spark, broker):
    expect_error(lambda: read(spark, broker, "/default/any",
                              startingOffsets="{not json").collect(),
                 "option startingOffsets", "{not json")
    expect_error(lambda: read(spark, broker, "/default/any",
                              endingOffsets='{"/default/any": "x"}').collect(),
                 "option endingOffsets", "/default/any")


def test_unreachable_broker(spark):
    dead = "http://127.0.0.1:1"
    df = (spark.read.format("danube").option("service_url", dead)
          .option("topic", "/default/t").option("timeoutMs", "3000").load())
    expect_error(df.collect, "cannot reach the Danube broker", dead)


def test_missing_options(spark, broker):
    expect_error(lambda: spark.read.format("danube").option("topic", "/default/t").load()
                 .collect(), "option service_url is required")
    expect_error(lambda: spark.read.format("danube").option("service_url", url(broker))
                 .load().collect(), "option topic is required")
    df = spark.createDataFrame([("a",)], "payload string")
    expect_error(lambda: df.write.format("danube").mode("append")
                 .option("service_url", url(broker)).option("topic", "/default/t").save(),
                 "needs a column value")
    df = spark.createDataFrame([("a",)], "value string")
    expect_error(lambda: df.write.format("danube").mode("append")
                 .option("service_url", url(broker)).save(), "no topic to write to")
