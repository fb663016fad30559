"""The danube-spark connector on a real Spark standalone cluster (a master and two workers,
each its own JVM, executors in separate JVMs with their own Python workers) against a real
3-broker Danube cluster on etcd with its durable tier on S3 (SeaweedFS) and the WAL root
shared by the brokers:

- a 6-partition topic is read in batch, each partition from the broker that owns it (the
  brokers' rpc counters: every broker served exactly the ReadRange calls of its own
  partitions), written back, and read as a stream with Trigger.AvailableNow and with a
  processing-time trigger into a checkpointed Parquet sink;
- failures, each with every row of the topic in the sink exactly once: kill -9 of a Spark
  worker (with its executor and Python workers) during a micro-batch, the query stopped and
  restarted from its checkpoint 3 times, kill -9 of a broker owning partitions during a
  streaming query while a producer publishes.

One Spark cluster and one Danube cluster for the module; the broker kill is the last test."""

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest

try:
    import danube_spark  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # a missing tool fails, it does not skip: bin/test installs both
    raise ImportError(f"{exc}: run `bash bin/test`, which installs pyspark[sql] and builds and "
                      f"installs connectors/spark") from exc

from cluster_failover import owner  # noqa: E402
from cluster_process import ClusterBrokers  # noqa: E402
from danube.client import DanubeClient  # noqa: E402
from danube.client import errors as client_errors  # noqa: E402
from etcd_process import EtcdProcess  # noqa: E402
from objstore_servers import durable_config  # noqa: E402
from spark_standalone import SparkStandalone, cluster_session, wait_executors  # noqa: E402
from waiting import wait_for  # noqa: E402

PARTITIONS = 6
SINK_SCHEMA = "topic string, offset long, value binary"
# A streaming query's progress waits on executors that a loaded machine starts slowly.
STREAM_TIMEOUT = 240

STORAGE = """\
storage:
  mode: object_store
  failover: shared_wal_root
  local_wal_root: "{wal}"
  durable: {durable}
"""


@pytest.fixture(scope="module")
def danube_cluster(tmp_path_factory, seaweedfs_server):
    """Three brokers on a fresh etcd, the durable tier on SeaweedFS, one WAL root for all
    (a partition that moves continues from the WAL its owner acknowledged from)."""
    etcd = EtcdProcess(tmp_path_factory.mktemp("etcd")).start()
    workdir = tmp_path_factory.mktemp("danube")
    durable = durable_config("s3", seaweedfs_server, name="spark-cluster",
                             upload_interval_seconds=1)
    brokers = ClusterBrokers(etcd, workdir, lease=3, storage=STORAGE.format(
        wal=workdir / "shared-wal", durable=json.dumps(durable)))
    try:
        brokers.start(3)
        yield brokers
    finally:
        brokers.stop()
        etcd.stop()


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    if not os.environ.get("JAVA_HOME") and subprocess.run(
            ["which", "java"], capture_output=True).returncode:
        pytest.fail("java is not installed; bin/test installs openjdk-17-jre-headless")
    # The executors' Python workers run this interpreter: it must have the wheel.
    check = subprocess.run([sys.executable, "-P", "-c", "import danube_spark, pyarrow, grpc"],
                           capture_output=True, text=True)
    assert check.returncode == 0, f"danube_spark is not installed for {sys.executable} " \
                                  f"(bin/test installs the wheel): {check.stderr}"
    # Its JVMs start while the Danube cluster does (the spark fixture waits for both).
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"),
                              workers=2).start_in_background()
    yield cluster
    try:
        cluster.wait_started()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def spark(standalone, danube_cluster):
    from danube_spark import DanubeDataSource
    standalone.wait_started()
    session = cluster_session(standalone, "danube-spark-cluster-tests",
                              # A task rerun after its executor died: not 4 tries of the
                              # same lost executor, but soon on the other one.
                              **{"spark.task.maxFailures": "8"})
    session.dataSource.register(DanubeDataSource)
    wait_executors(session, 2)
    yield session
    session.stop()


def service_url(cluster):
    return ",".join(f"http://{b.client_addr}" for b in cluster.live)


def unique(name):
    return f"/default/{name}_{uuid.uuid4().hex[:8]}"


def publish(cluster, topic, payloads, partitions=PARTITIONS):
    """Reliable, keyed publish through the project's client with every broker as a service
    URL; returns how many were acknowledged."""
    async def run():
        async with DanubeClient(service_url(cluster)) as client:
            producer = await client.create_producer(topic, "pub", partitions=partitions,
                                                    reliable=True)
            for i, payload in enumerate(payloads):
                await producer.send(payload, {"i": str(i)}, key=f"k{i}")
            await producer.close()
    asyncio.run(run())


def read(spark, cluster, topic, **options):
    reader = (spark.read.format("danube").option("service_url", service_url(cluster))
              .option("topic", topic))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def topic_rows(spark, cluster, topic):
    """{(partition name, offset): payload} of everything the topic holds now."""
    rows = read(spark, cluster, topic).select("topic", "offset", "value").collect()
    return {(r.topic, r.offset): bytes(r.value) for r in rows}


def sink_rows(spark, path):
    """[(partition name, offset, payload)] of a streaming Parquet sink (through its commit
    log, as Spark's file source reads it: files of uncommitted batches are not data)."""
    if not os.path.isdir(os.path.join(path, "_spark_metadata")):
        return []
    return [(r.topic, r.offset, bytes(r.value))
            for r in spark.read.schema(SINK_SCHEMA).parquet(path).collect()]


def committed_payloads(path):
    """The payloads of a streaming Parquet sink's committed files, read without Spark (a
    cheap poll while a query runs): the files its _spark_metadata log adds, from the latest
    compacted entry on, as Spark's file source picks them."""
    import pyarrow.parquet as pq
    meta = os.path.join(path, "_spark_metadata")
    if not os.path.isdir(meta):
        return []
    logs = {}
    for name in os.listdir(meta):
        head = name.split(".")[0]
        if head.isdigit():
            logs[int(head)] = name
    compacts = [n for n, name in logs.items() if name.endswith(".compact")]
    first = max(compacts) if compacts else 0
    files = set()
    for n in sorted(b for b in logs if b >= first):
        try:
            lines = open(os.path.join(meta, logs[n])).read().splitlines()[1:]
        except FileNotFoundError:
            continue            # compacted away meanwhile: the next poll sees the compact
        for line in lines:
            entry = json.loads(line)
            (files.add if entry.get("action", "add") == "add" else files.discard)(
                entry["path"])
    out = []
    for uri in files:
        local = uri[len("file:"):] if uri.startswith("file:") else uri
        out += pq.read_table(local, columns=["value"]).column("value").to_pylist()
    return out


def assert_exactly_once(sink, expected):
    keys = [(t, o) for t, o, _ in sink]
    duplicated = len(keys) - len(set(keys))
    lost = set(expected) - set(keys)
    assert duplicated == 0 and not lost, f"{len(lost)} lost, {duplicated} duplicated"
    assert {(t, o): v for t, o, v in sink} == expected


def rpc_counts(broker, method="read_range"):
    """{status code name: count} of the ReadRange calls a broker has finished
    (danube_broker_rpc_total, "OK" for the ones that succeeded)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    counts = {}
    pattern = re.compile(r'^danube_broker_rpc_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
    for labels, value in pattern.findall(text):
        if f'method="{method}"' in labels:
            code = re.search(r'code="(\w+)"', labels).group(1)
            counts[code] = counts.get(code, 0) + float(value)
    return counts


def owners_of(cluster, topic):
    """{partition name: broker process owning it}."""
    return {f"{topic}-part-{n}": owner(cluster, f"{topic}-part-{n}") for n in range(PARTITIONS)}


def stream(spark, cluster, topic, sink, checkpoint, trigger, transform=None):
    df = (spark.readStream.format("danube").option("service_url", service_url(cluster))
          .option("topic", topic).option("startingOffsets", "earliest")
          .option("ownerWaitMs", "120000").load()
          .select("topic", "offset", "value"))
    if transform is not None:
        df = transform(df)
    for attempt in range(4):
        query = (df.writeStream.format("parquet").option("path", sink)
                 .option("checkpointLocation", checkpoint).trigger(**trigger).start())
        # Spark gives the Python process of a streaming source 10 s (not configurable) to
        # connect back; a loaded machine has taken longer, and the query then ends while
        # INITIALIZING, before it planned anything. Started again from the same checkpoint.
        if not wait_for(lambda: _initialized(query), timeout=STREAM_TIMEOUT, interval=0.2,
                        what="the streaming query initializing") == "failed to connect back":
            return query
    return query


def _initialized(query):
    if query.isActive:
        return query.status["message"] != "Initializing sources" or query.lastProgress
    error = query.exception()
    if error is not None and "Python worker failed to connect back" in str(error) and \
            "Current State: INITIALIZING" in str(error):
        return "failed to connect back"
    return True       # ended (availableNow done, or failed: the test sees the exception)


# ------------------------------------------------------------------------- end to end


def test_batch_read_of_six_partitions_each_from_its_owner(spark, danube_cluster):
    topic = unique("cluster_read")
    payloads = [f"m-{i}".encode() for i in range(600)]
    publish(danube_cluster, topic, payloads)
    owners = owners_of(danube_cluster, topic)
    # The fair strategy spreads 6 partitions over the 3 brokers.
    assert len(set(b.client_port for b in owners.values())) == 3
    before = {b.client_port: rpc_counts(b) for b in danube_cluster.live}

    df = read(spark, danube_cluster, topic)
    assert df.rdd.getNumPartitions() == PARTITIONS
    rows = df.select("topic", "partition", "offset", "value").collect()

    assert sorted(bytes(r.value) for r in rows) == sorted(payloads)
    assert len({(r.topic, r.offset) for r in rows}) == len(payloads)
    for broker in danube_cluster.live:
        now, then = rpc_counts(broker), before[broker.client_port]
        delta = {code: n - then.get(code, 0) for code, n in now.items()}
        owned = sum(1 for b in owners.values() if b.client_port == broker.client_port)
        # Each broker served the ReadRange of every partition it owns (more than once only
        # if Spark ran a task again), and was never asked for one it does not own: that
        # answers UNAVAILABLE "served by broker N" (NOT_FOUND while nobody owns it).
        assert delta.get("OK", 0) >= owned
        assert delta.get("UNAVAILABLE", 0) == 0 and delta.get("NOT_FOUND", 0) == 0, delta


def test_write_back_to_a_partitioned_topic(spark, danube_cluster):
    source, target = unique("cluster_src"), unique("cluster_dst")
    payloads = [f"w-{i}".encode() for i in range(300)]
    publish(danube_cluster, source, payloads)
    publish(danube_cluster, target, [], partitions=PARTITIONS)    # created, empty

    (read(spark, danube_cluster, source).selectExpr("key", "upper(cast(value as string)) as value")
     .write.format("danube").mode("append").option("service_url", service_url(danube_cluster))
     .option("topic", target).save())

    back = read(spark, danube_cluster, target).select("topic", "value").collect()
    assert sorted(bytes(r.value) for r in back) == sorted(p.upper() for p in payloads)
    # Keyed rows went to the partition their key hashes to, on its owner.
    assert len({r.topic for r in back}) == PARTITIONS


def test_streaming_available_now_into_a_checkpointed_sink(spark, danube_cluster, tmp_path):
    topic = unique("cluster_now")
    publish(danube_cluster, topic, [f"a-{i}".encode() for i in range(400)])
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    query = stream(spark, danube_cluster, topic, sink, checkpoint, {"availableNow": True})
    assert query.awaitTermination(STREAM_TIMEOUT), "availableNow query did not finish"
    assert query.exception() is None
    expected = topic_rows(spark, danube_cluster, topic)
    assert len(expected) == 400
    assert_exactly_once(sink_rows(spark, sink), expected)


def test_streaming_processing_time_trigger(spark, danube_cluster, tmp_path):
    topic = unique("cluster_trigger")
    publish(danube_cluster, topic, [f"p-{i}".encode() for i in range(200)])
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    query = stream(spark, danube_cluster, topic, sink, checkpoint,
                   {"processingTime": "1 second"})
    try:
        wait_for(lambda: len(committed_payloads(sink)) >= 200, timeout=STREAM_TIMEOUT,
                 interval=0.5, what="the first 200 rows in the sink")
        # Published while the query runs: read by a later trigger.
        publish(danube_cluster, topic, [f"q-{i}".encode() for i in range(200)])
        wait_for(lambda: len(committed_payloads(sink)) >= 400, timeout=STREAM_TIMEOUT,
                 interval=0.5, what="all 400 rows in the sink")
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly_once(sink_rows(spark, sink), topic_rows(spark, danube_cluster, topic))


# ------------------------------------------------------------------------- failures


def _gate(marks, release):
    """A mapInArrow function that records each task attempt's start (a file in ``marks``)
    and holds its rows until ``release`` exists: the test knows a micro-batch is running on
    both executors before it kills one."""
    def gate(batches):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        name = f"{ctx.partitionId()}-{ctx.attemptNumber()}-{os.getpid()}"
        open(os.path.join(marks, name), "w").close()
        deadline = time.monotonic() + 600
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        yield from batches
    return gate


def test_worker_killed_mid_batch_loses_and_duplicates_nothing(spark, danube_cluster,
                                                              standalone, tmp_path):
    topic = unique("cluster_kill_worker")
    publish(danube_cluster, topic, [f"k-{i}".encode() for i in range(600)])
    marks, release = tmp_path / "marks", str(tmp_path / "release")
    marks.mkdir()
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    gate = _gate(str(marks), release)
    query = stream(spark, danube_cluster, topic, sink, checkpoint, {"availableNow": True},
                   transform=lambda df: df.mapInArrow(gate, df.schema))
    try:
        # Both executors hold a task of the micro-batch: one task on each worker.
        wait_for(lambda: len({p.name.rsplit("-", 1)[1] for p in marks.iterdir()}) >= 2,
                 timeout=STREAM_TIMEOUT, interval=0.2, what="tasks started on both executors")
        victim = standalone.worker_running_executor()
        assert victim is not None
        # The worker, its executor and Python workers: a machine that dies.
        os.killpg(victim.proc.pid, 9)
        victim.proc.wait()
        open(release, "w").close()
        assert query.awaitTermination(STREAM_TIMEOUT), "the query did not finish"
        assert query.exception() is None
    finally:
        open(release, "w").close()
        if query.isActive:
            query.stop()
    assert_exactly_once(sink_rows(spark, sink), topic_rows(spark, danube_cluster, topic))
    # Back to two workers for what follows (the master gives the application an executor on
    # the new one).
    standalone.workers.remove(victim)
    standalone.add_worker()
    standalone.wait_workers(2)
    wait_executors(spark, 2)


class Publisher(threading.Thread):
    """Publishes ``count`` payloads, paced, through the project's client with every broker
    as a service URL (it carries on when a broker dies); ``acked`` the acknowledged ones."""

    def __init__(self, cluster, topic, count, per_second=400, prefix="s"):
        super().__init__(daemon=True)
        self.prefix = prefix
        self.url = service_url(cluster)
        self.topic, self.count, self.per_second = topic, count, per_second
        self.acked = []
        self.resends = 0
        self.error = None

    def run(self):
        try:
            asyncio.run(self._run())
        except Exception as exc:  # noqa: BLE001 - the test reports it
            self.error = exc

    async def _run(self):
        async with DanubeClient(self.url) as client:
            producer = await client.create_producer(self.topic, "paced", partitions=PARTITIONS,
                                                    reliable=True)
            for i in range(self.count):
                payload = f"{self.prefix}-{i}".encode()
                deadline = time.monotonic() + STREAM_TIMEOUT
                while True:
                    try:
                        await producer.send(payload, key=f"k{i}")
                        break
                    except client_errors.DanubeError:
                        # The owner died: the client's retries are spent before the
                        # partition has a new owner; sent again (at-least-once).
                        if time.monotonic() > deadline:
                            raise
                        self.resends += 1
                        await asyncio.sleep(0.1)
                self.acked.append(payload)
                if i % 20 == 19:
                    await asyncio.sleep(20 / self.per_second)
            await producer.close()


def test_query_restarted_from_its_checkpoint_three_times(spark, danube_cluster, tmp_path):
    topic = unique("cluster_restart")
    publish(danube_cluster, topic, [f"r-{i}".encode() for i in range(60)])
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    for run in range(3):
        # Each run has new messages coming in while it runs, and is stopped wherever it is
        # (mid-batch or between batches) once it has committed one micro-batch.
        publisher = Publisher(danube_cluster, topic, 300, per_second=200, prefix=f"r{run}")
        publisher.start()
        seen = len(committed_payloads(sink))
        query = stream(spark, danube_cluster, topic, sink, checkpoint,
                       {"processingTime": "500 milliseconds"})
        try:
            wait_for(lambda: len(committed_payloads(sink)) > seen, timeout=STREAM_TIMEOUT,
                     interval=0.2, what=f"progress of run {run + 1}")
        finally:
            query.stop()
        assert query.exception() is None
        publisher.join(STREAM_TIMEOUT)
        assert publisher.error is None and len(publisher.acked) == 300
    # A last run from the checkpoint takes what is left.
    query = stream(spark, danube_cluster, topic, sink, checkpoint, {"availableNow": True})
    assert query.awaitTermination(STREAM_TIMEOUT)
    assert query.exception() is None
    expected = topic_rows(spark, danube_cluster, topic)
    assert len(expected) >= 960
    assert_exactly_once(sink_rows(spark, sink), expected)


def test_broker_owning_partitions_killed_during_a_streaming_query(spark, danube_cluster,
                                                                  tmp_path):
    topic = unique("cluster_kill_broker")
    publish(danube_cluster, topic, [f"b-{i}".encode() for i in range(60)])
    publisher = Publisher(danube_cluster, topic, 2000, per_second=300)
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")
    query = stream(spark, danube_cluster, topic, sink, checkpoint,
                   {"processingTime": "500 milliseconds"})
    try:
        publisher.start()
        wait_for(lambda: len(committed_payloads(sink)) >= 200, timeout=STREAM_TIMEOUT,
                 interval=0.5, what="the query reading")
        victim = owner(danube_cluster, f"{topic}-part-0")
        danube_cluster.kill(victim)
        publisher.join(STREAM_TIMEOUT)
        assert publisher.error is None, publisher.error
        assert not publisher.is_alive()
        acked = set(publisher.acked)
        wait_for(lambda: acked <= set(committed_payloads(sink)),
                 timeout=STREAM_TIMEOUT, interval=0.5, what="every acknowledged row in the sink")
        assert query.exception() is None
        assert query.isActive
    finally:
        query.stop()
    # The sink holds what the topic holds, each once (a publish retried by the client after
    # the kill may be in the topic twice, at two offsets: that is the producer's
    # at-least-once, and the sink has it twice too).
    assert_exactly_once(sink_rows(spark, sink), topic_rows(spark, danube_cluster, topic))
