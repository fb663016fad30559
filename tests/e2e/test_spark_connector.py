"""The danube-spark connector (connectors/spark, installed from its wheel by bin/test) in a
real local SparkSession against the real broker process: batch read of a 3-partition
reliable topic, write -> read round trip, and an error naming the problem for each bad
option. One SparkSession for the module (starting Spark takes seconds).

The read tests need the broker's danube_ext.TopicHistory service."""

import asyncio
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid

import pytest

try:
    import danube_spark  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # a missing tool fails, it does not skip: bin/test installs both
    raise ImportError(f"{exc}: run `bash bin/test`, which installs pyspark[sql] and builds and "
                      f"installs connectors/spark") from exc

from broker_process import BrokerProcess  # noqa: E402
from danube.client import DanubeClient, fnv1a64  # noqa: E402

# Before 4.2 Spark gives a Python streaming source no read limit (maxOffsetsPerTrigger) and
# does not ask it to prepare for Trigger.AvailableNow.
#: Spark's error when a Python worker did not connect back within its fixed 10 s.
CONNECT_BACK = "Python worker failed to connect back"
SPARK_4_2 = tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= (4, 2)


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
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "512m")
               # The tests' jobs are small: the C1 compiler alone and the serial collector
               # cost a sixth less CPU than the JVM's defaults (CI runs on 2 cores).
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               # Python workers connecting to the JVM: 15 s by default, which a loaded
               # machine (the suite runs on several workers) has exceeded.
               .config("spark.python.authenticate.socketTimeout", "120s")
               .getOrCreate())
    if not SPARK_4_2:
        # Otherwise Trigger.AvailableNow on the danube source is Trigger.Once, which after a
        # query stopped mid-batch runs only that batch again (the README says so too).
        session.conf.set("spark.sql.streaming.triggerAvailableNowWrapper.enabled", "true")
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
        # publish_time is in milliseconds; Spark hands back a naive local datetime.
        assert before - 5 <= r.timestamp.timestamp() <= time.time() + 5
        assert r.schema_id is None and r.schema_version is None


def test_a_given_schema_reads_only_its_columns(spark, broker):
    topic = unique("spark_columns")
    expected = publish_keyed(broker, topic, 12, partitions=2)
    df = (spark.read.format("danube").schema("offset long, value binary, topic string")
          .option("service_url", url(broker)).option("topic", topic).load())
    assert df.columns == ["offset", "value", "topic"]
    assert {(r.topic, r.offset): bytes(r.value) for r in df.collect()} == \
        {k: v[1] for k, v in expected.items()}
    for schema, problem in [("offset long, nope string", "column nope is not one of"),
                            ("offset string", "column offset is bigint in the danube source, "
                                              "not string")]:
        expect_error(lambda: spark.read.format("danube").schema(schema)
                     .option("service_url", url(broker)).option("topic", topic).load()
                     .collect(), problem)


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


def received_while(broker, topic, n, write):
    """Runs write() while a reliable subscription on `topic` (created first, at the live
    tail) is open; returns the n messages it receives. Checks the write path without the
    broker's TopicHistory. write() runs on this thread: Spark looks a Python data source up
    through the thread's active session, which only the main thread has."""
    subscribed = threading.Event()
    result = {}

    async def receive():
        async with DanubeClient(url(broker)) as client:
            # The topic exists as a reliable topic before the subscription, so the
            # subscription is reliable.
            producer = await client.create_producer(topic, "seed", reliable=True)
            await producer.close()
            consumer = await client.subscribe(topic, "c", "sub")
            subscribed.set()
            out = []
            for _ in range(n):
                msg = await consumer.receive(timeout=60)
                out.append(msg)
                await consumer.ack(msg)
            await consumer.close()
            return out

    def run():
        try:
            result["messages"] = asyncio.run(receive())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            result["error"] = exc
        finally:
            subscribed.set()

    receiver = threading.Thread(target=run, daemon=True)
    receiver.start()
    assert subscribed.wait(30), "the subscription was not created"
    if "error" in result:
        raise result["error"]
    write()
    receiver.join(90)
    if "error" in result:
        raise result["error"]
    return result["messages"]


def test_write_publishes_to_a_reliable_subscription(spark, broker):
    """Binary values, keys, attributes, and the topic from a topic column."""
    topic = unique("spark_write")
    data = [(topic, f"k{i}", bytes([i]) * 3, {"i": str(i)}) for i in range(20)]

    def write():
        df = spark.createDataFrame(
            data, "topic string, key string, value binary, attributes map<string,string>")
        df.write.format("danube").mode("append").option("service_url", url(broker)).save()

    msgs = received_while(broker, topic, len(data), write)
    got = sorted((m.routing_key, m.payload, dict(m.attributes)) for m in msgs)
    assert got == sorted((f"k{i}", bytes([i]) * 3, {"i": str(i)}) for i in range(20))
    assert all(m.msg_id.topic_name == topic for m in msgs)


def test_write_stream(spark, broker, tmp_path):
    """writeStream.format("danube"): a file stream's rows, Trigger.AvailableNow."""
    topic = unique("spark_write_stream")
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.json").write_text("".join(json.dumps({"value": f"v{i}"}) + "\n"
                                           for i in range(15)))

    def write():
        query = (spark.readStream.schema("value string").json(str(source))
                 .writeStream.format("danube").option("service_url", url(broker))
                 .option("topic", topic)
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    msgs = received_while(broker, topic, 15, write)
    assert sorted(m.payload for m in msgs) == sorted(f"v{i}".encode() for i in range(15))


def publish_more(broker, topic, first, n, partitions):
    async def run():
        async with DanubeClient(url(broker)) as client:
            producer = await client.create_producer(topic, f"more{first}",
                                                    partitions=partitions, reliable=True)
            for i in range(first, first + n):
                await producer.send(f"m-{i}".encode(), key=f"k{i % 7}")
            await producer.close()
    asyncio.run(run())


def test_stream_into_parquet_restarts_from_the_checkpoint(spark, broker, tmp_path):
    """readStream with maxOffsetsPerTrigger (PySpark >= 4.2) and Trigger.AvailableNow into a
    Parquet sink; a second run from the same checkpoint reads only what was published since:
    every message exactly once."""
    topic = unique("spark_stream")
    publish_keyed(broker, topic, 30, partitions=3)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def run_once():
        progress = []
        for attempt in range(3):
            reader = (spark.readStream.format("danube").option("service_url", url(broker))
                      .option("topic", topic).option("startingOffsets", "earliest"))
            if SPARK_4_2:
                reader = reader.option("maxOffsetsPerTrigger", "7")
            query = (reader.load()
                     .selectExpr("topic", "offset", "cast(value as string) as value")
                     .writeStream.format("parquet").option("path", str(sink))
                     .option("checkpointLocation", str(checkpoint))
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination(180)
            except Exception:  # noqa: BLE001 - the query's own exception is checked below
                pass
            failure = query.exception()
            progress += [p for p in query.recentProgress if p["numInputRows"] > 0]
            if failure is not None and CONNECT_BACK in str(failure) and attempt < 2:
                # Spark gives a Python worker a fixed 10 s to connect back, which a loaded
                # machine has missed; a user restarts the query from its checkpoint, and
                # the rows must still be there exactly once.
                continue
            assert failure is None, failure
            return progress

    batches = run_once()
    if SPARK_4_2:
        assert len(batches) >= 5 and all(p["numInputRows"] <= 7 for p in batches)
    publish_more(broker, topic, 30, 20, partitions=3)
    run_once()
    rows = spark.read.parquet(str(sink)).collect()
    assert len(rows) == 50
    assert sorted(r.value for r in rows) == sorted(f"m-{i}" for i in range(50))
    assert len({(r.topic, r.offset) for r in rows}) == 50


@pytest.mark.skipif(SPARK_4_2, reason="PySpark >= 4.2 gives a Python source a read limit")
def test_max_offsets_per_trigger_needs_pyspark_4_2(spark, broker, tmp_path):
    def run():
        query = (spark.readStream.format("danube").option("service_url", url(broker))
                 .option("topic", unique("spark_limit")).option("maxOffsetsPerTrigger", "7")
                 .load().writeStream.format("parquet").option("path", str(tmp_path / "sink"))
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()

    expect_error(run, "option maxOffsetsPerTrigger needs PySpark >= 4.2",
                 f"this is {pyspark.__version__}")


class Publisher(threading.Thread):
    """Publishes m-0, m-1, ... to a reliable partitioned topic, 10 every 20 ms, until stopped;
    `sent` counts what the broker acknowledged."""

    def __init__(self, broker, topic, partitions):
        super().__init__(daemon=True)
        self.broker, self.topic, self.partitions = broker, topic, partitions
        self.halt = threading.Event()
        self.started_sending = threading.Event()
        self.sent = 0
        self.error = None

    def run(self):
        try:
            asyncio.run(self._run())
        except Exception as exc:  # noqa: BLE001 - asserted by the test
            self.error = exc
        finally:
            self.started_sending.set()

    async def _run(self):
        async with DanubeClient(url(self.broker)) as client:
            producer = await client.create_producer(self.topic, "steady",
                                                    partitions=self.partitions, reliable=True)
            while not self.halt.is_set():
                await producer.send_many([f"m-{self.sent + i}".encode() for i in range(10)])
                self.sent += 10
                self.started_sending.set()
                await asyncio.sleep(0.02)
            await producer.close()


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_stream_stopped_and_restarted_while_publishing_is_exactly_once(spark, broker, tmp_path,
                                                                        round_):
    """A streaming query into a Parquet sink is stopped mid-stream and restarted from its
    checkpoint twice while a producer keeps publishing; after a last AvailableNow run drains
    the backlog, the sink holds every acknowledged message exactly once (the issue's restart
    test, three rounds)."""
    topic = unique(f"spark_restart{round_}")
    publisher = Publisher(broker, topic, partitions=3)
    publisher.start()
    assert publisher.started_sending.wait(30) and publisher.error is None
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start(**trigger):
        writer = (spark.readStream.format("danube").option("service_url", url(broker))
                  .option("topic", topic).option("startingOffsets", "earliest").load()
                  .selectExpr("topic", "offset", "cast(value as string) as value")
                  .writeStream.format("parquet").option("path", str(sink))
                  .option("checkpointLocation", str(checkpoint)))
        return (writer.trigger(**trigger) if trigger else writer).start()

    def failed_to_connect_back(query, attempt):
        # Spark's fixed 10 s for a Python worker to connect back, missed on a loaded
        # machine: the user's remedy, a restart from the checkpoint, is what this tests.
        return attempt < 2 and not query.isActive and CONNECT_BACK in str(query.exception())

    for _ in range(2):
        for attempt in range(3):
            query = start()
            deadline = time.monotonic() + 60
            # Stopped once it has committed a micro-batch with rows and another is likely
            # running.
            while time.monotonic() < deadline and query.isActive and not any(
                    p["numInputRows"] > 0 for p in query.recentProgress):
                time.sleep(0.1)
            if not failed_to_connect_back(query, attempt):
                break
        time.sleep(0.7)
        query.stop()
        assert query.exception() is None
    publisher.halt.set()
    publisher.join(30)
    assert publisher.error is None, publisher.error
    for attempt in range(3):
        query = start(availableNow=True)
        try:
            query.awaitTermination(180)
        except Exception:  # noqa: BLE001 - the query's own exception is checked below
            pass
        if not failed_to_connect_back(query, attempt):
            break
    assert query.exception() is None
    rows = spark.read.parquet(str(sink)).collect()
    values = [r.value for r in rows]
    assert publisher.sent > 0 and len(values) == publisher.sent, (len(values), publisher.sent)
    assert set(values) == {f"m-{i}" for i in range(publisher.sent)}
    assert len({(r.topic, r.offset) for r in rows}) == publisher.sent


def test_batch_read_of_history_only_the_durable_tier_holds(spark, tmp_path):
    """Tiered storage (fs) uploads sealed WAL segments and local retention (1 MB) deletes the
    uploaded ones; a batch read from `earliest` still returns every message, the deleted
    history coming from the durable tier."""
    from configured_broker import start_with_config
    from waiting import wait_for

    store = tmp_path / "store"
    store.mkdir()
    b = start_with_config(
        tmp_path,
        "storage:\n"
        "  mode: shared_fs\n"
        f"  durable: {{backend: fs, root: '{store}', upload_interval_seconds: 1}}\n"
        "  wal:\n"
        "    rotation: {max_bytes: 65536}\n"
        "  local_retention:\n"
        "    size_mb: 1\n"
        "    check_interval_minutes: 0.005\n")
    try:
        topic = "/default/spark_tiered"
        n = 3000

        async def publish_all():
            async with DanubeClient(url(b)) as client:
                producer = await client.create_producer(topic, "tiered", reliable=True)
                await producer.send_many([f"t-{i}".encode().ljust(1000, b".")
                                          for i in range(n)])
                await producer.close()
        asyncio.run(publish_all())
        wait_for(lambda: re.search(rf"retention deleted \d+ WAL segments of {topic}", b.log()),
                 timeout=60, what="local retention to delete uploaded segments")
        rows = read(spark, b, topic).select("offset", "value").collect()
        assert sorted(r.offset for r in rows) == list(range(n))
        assert all(bytes(r.value).rstrip(b".") == f"t-{r.offset}".encode() for r in rows)
    finally:
        b.stop()


# -- the read path against the protocol alone ------------------------------------------------

class FakeHistory:
    """A grpcio server with danube_ext.TopicHistory only, answering as DanubeExt.proto says:
    the connector's read path without the broker's implementation, including a broker that
    streams small batches and history gone from a partition."""

    TOPIC = "/default/fake"
    LATEST = {f"/default/fake-part-{i}": 5 + i for i in range(3)}
    EARLIEST = {"/default/fake-part-0": 0, "/default/fake-part-1": 0, "/default/fake-part-2": 2}

    def __init__(self):
        import grpc
        from concurrent import futures
        from danube_spark._proto import DanubeApi_pb2, DanubeExt_pb2

        self.api, self.ext = DanubeApi_pb2, DanubeExt_pb2
        self.reads = []
        ext = DanubeExt_pb2
        handlers = {
            "GetOffsets": grpc.unary_unary_rpc_method_handler(
                self.get_offsets, ext.OffsetsRequest.FromString,
                ext.OffsetsResponse.SerializeToString),
            "ReadRange": grpc.unary_stream_rpc_method_handler(
                self.read_range, ext.ReadRangeRequest.FromString,
                ext.ReadRangeBatch.SerializeToString),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        self.server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("danube_ext.TopicHistory", handlers)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def get_offsets(self, request, context):
        import grpc
        if request.topic == "/default/fake_non_reliable":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "non-reliable topic")
        if request.topic != self.TOPIC:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no topic {request.topic}")
        return self.ext.OffsetsResponse(partitioned=True, partitions=[
            self.ext.PartitionOffsets(topic=name, partition=i, earliest=self.EARLIEST[name],
                                      latest=latest)
            for i, (name, latest) in enumerate(self.LATEST.items())])

    def read_range(self, request, context):
        self.reads.append((request.topic, request.start_offset, request.end_offset))
        out = []
        for offset in range(request.start_offset,
                            min(request.end_offset, self.LATEST[request.topic])):
            msg = self.api.StreamMessage(payload=f"{request.topic}:{offset}".encode(),
                                         publish_time=1_700_000_000_000 + offset,
                                         producer_name="p", routing_key=f"k{offset}",
                                         attributes={"o": str(offset)}, schema_id=3,
                                         schema_version=1)
            msg.msg_id.topic_offset = offset
            out.append(msg)
            if len(out) == 2:
                yield self.batch(request, out)
                out = []
        if out:
            yield self.batch(request, out)

    def batch(self, request, messages):
        if not request.columnar:
            return self.ext.ReadRangeBatch(messages=[m.SerializeToString() for m in messages])
        return self.ext.ReadRangeBatch(columns=column_batch_of(self.ext, messages))


def column_batch_of(ext, messages):
    """A ColumnBatch as DanubeExt.proto describes it, written here from its text (Arrow
    buffers, little-endian) rather than by the broker's encoder."""
    import struct

    def var(values):
        bounds, at = [0], 0
        for v in values:
            at += len(v)
            bounds.append(at)
        return struct.pack(f"<{len(bounds)}i", *bounds), b"".join(values)

    def bitmap(present):
        if all(present):
            return b""
        bits = bytearray((len(present) + 7) // 8)
        for i, p in enumerate(present):
            if p:
                bits[i // 8] |= 1 << (i % 8)
        return bytes(bits)

    n = len(messages)
    entries = [list(m.attributes.items()) for m in messages]
    flat = [kv for e in entries for kv in e]
    counts = [0]
    for e in entries:
        counts.append(counts[-1] + len(e))
    c = ext.ColumnBatch(count=n)
    c.topic_offsets = struct.pack(f"<{n}q", *(m.msg_id.topic_offset for m in messages))
    c.publish_times = struct.pack(f"<{n}q", *(m.publish_time for m in messages))
    c.payload_offsets, c.payloads = var([m.payload for m in messages])
    c.routing_key_validity = bitmap([m.HasField("routing_key") for m in messages])
    c.routing_key_offsets, c.routing_keys = var([m.routing_key.encode() for m in messages])
    c.producer_name_offsets, c.producer_names = var([m.producer_name.encode()
                                                     for m in messages])
    c.attribute_offsets = struct.pack(f"<{n + 1}i", *counts)
    c.attribute_key_offsets, c.attribute_keys = var([k.encode() for k, _ in flat])
    c.attribute_value_offsets, c.attribute_values = var([v.encode() for _, v in flat])
    c.schema_id_validity = bitmap([m.HasField("schema_id") for m in messages])
    c.schema_ids = struct.pack(f"<{n}Q", *(m.schema_id for m in messages))
    c.schema_version_validity = bitmap([m.HasField("schema_version") for m in messages])
    c.schema_versions = struct.pack(f"<{n}I", *(m.schema_version for m in messages))
    return c


@pytest.fixture(scope="module")
def fake_history():
    fake = FakeHistory()
    yield fake
    fake.server.stop(0)


def read_fake(spark, fake, topic, **options):
    reader = (spark.read.format("danube").option("service_url", f"http://127.0.0.1:{fake.port}")
              .option("topic", topic))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_read_against_the_protocol(spark, fake_history):
    fake = fake_history
    df = read_fake(spark, fake, fake.TOPIC)
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted((r.topic, r.partition, r.offset) for r in rows) == sorted(
        (name, i, o) for i, name in enumerate(fake.LATEST)
        for o in range(fake.EARLIEST[name], fake.LATEST[name]))
    for r in rows:
        assert bytes(r.value) == f"{r.topic}:{r.offset}".encode()
        assert (r.key, r.attributes, r.producer) == (f"k{r.offset}", {"o": str(r.offset)}, "p")
        assert (r.schema_id, r.schema_version) == (3, 1)
        assert round(r.timestamp.timestamp() * 1000) == 1_700_000_000_000 + r.offset
    # [0, 5), [0, 6) and [2, 7) in ranges of at most 2 offsets: 3 + 3 + 3 tasks.
    split = read_fake(spark, fake, fake.TOPIC, maxOffsetsPerSplit=2)
    assert split.rdd.getNumPartitions() == 9 and split.count() == len(rows)


def test_read_of_history_gone(spark, fake_history):
    fake = fake_history
    start = json.dumps({"/default/fake-part-2": 0})
    expect_error(lambda: read_fake(spark, fake, fake.TOPIC, startingOffsets=start).collect(),
                 "offsets [0, 2) of /default/fake-part-2 are no longer available")
    df = read_fake(spark, fake, fake.TOPIC, startingOffsets=start, failOnDataLoss="false")
    assert df.count() == 5 + 6 + 5


def test_errors_against_the_protocol(spark, fake_history):
    fake = fake_history
    expect_error(lambda: read_fake(spark, fake, "/default/elsewhere").collect(),
                 "topic /default/elsewhere not found")
    expect_error(lambda: read_fake(spark, fake, "/default/fake_non_reliable").collect(),
                 "use a reliable topic", "/default/fake_non_reliable")
    expect_error(lambda: read_fake(spark, fake, fake.TOPIC,
                                   endingOffsets='{"/default/other-part-0": 1}').collect(),
                 "option endingOffsets names /default/other-part-0")


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


def test_publish_error_fails_the_write_with_the_brokers_message(spark, tmp_path):
    config = tmp_path / "small.yml"
    config.write_text("policies:\n  max_message_size: 1000\n")
    small = BrokerProcess("--config-file", str(config), data_dir=tmp_path / "data").start()
    try:
        df = spark.createDataFrame([("x" * 2000,)], "value string")
        expect_error(lambda: df.write.format("danube").mode("append")
                     .option("service_url", url(small)).option("topic", unique("too_big"))
                     .save(),
                     "publishing 1 messages to", "exceeds max_message_size (1000 bytes)")
    finally:
        small.stop()
