"""bench.spark: the danube-spark connector (issue 19) against Spark's own file sources, in one
SparkSession (local[2]) and one run.

    python -m bench.spark [--quick] [--messages N] [--rate R] [--stream-seconds S]

1. A standalone broker (`bench.e2e.runner.Broker`); a 4-partition reliable topic gets N
   messages of 100 bytes (default 1,000,000) through the project's client, batched.
2. Batch: the topic is read by the connector into a `noop` sink (every row materialized, as a
   count cannot skip it) and into Parquet; the same rows, saved once as Parquet and as JSON
   lines (schema given, no inference), are read the same two ways. Best of three rounds,
   each round timing every source in turn.
   The broker's CPU per message is sampled over the connector's reads. A fourth source is the
   ceiling of any Python data source: the connector's own Arrow record batches of the same
   rows, saved once to Arrow IPC files, handed to Spark by a Python data source that only
   memory-maps and yields them (no broker, no network, no decoding).
3. Streaming: `readStream.format("danube")` with the default trigger into a `foreachBatch`
   sink, while a producer publishes at R msgs/s (default 10,000); latency = the time a row
   reaches the sink minus its publish time (same clock).

4. Standalone cluster (issue 40; skipped with --no-standalone): a Spark standalone master and
   two workers (each its own JVM, tests/support/spark_standalone.py), one 1-core executor per
   worker; the same topic read by the connector into `noop`, best of three, against the
   local[2] figure of step 2 (the same data, the same 2 cores). The broker's CPU per row is
   reported for both.

Reported, not asserted: targets are a topic read >= 0.5x the Parquet read and >= the JSON read,
>= 0.9x the Python source ceiling, a p50 publish-to-sink latency under 1 s, and the standalone
cluster's read within 0.8x of local[2]'s."""

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from pathlib import Path

from bench._proc import proc_cpu, system_busy
from bench.e2e.runner import Broker

SUPPORT = Path(__file__).resolve().parents[2] / "tests" / "support"

TOPIC = "/default/spark_bench"
STREAM_TOPIC = "/default/spark_stream"
PARTITIONS = 4
ROUNDS = 3


def publish(url, topic, count, *, partitions=PARTITIONS, size=100):
    from danube.client import DanubeClient

    async def run():
        async with DanubeClient(url) as client:
            producer = await client.create_producer(topic, "bench", partitions=partitions,
                                                    reliable=True)
            payload = b"x" * size
            sent = 0
            while sent < count:
                n = min(50_000, count - sent)
                await producer.send_many([payload] * n)
                sent += n
            await producer.close()
    asyncio.run(run())


class Paced(threading.Thread):
    """Publishes `rate` msgs/s in batches of rate/100 every 10 ms until stopped."""

    def __init__(self, url, topic, rate):
        super().__init__(daemon=True)
        self.url, self.topic, self.rate = url, topic, rate
        self.stop_flag = threading.Event()
        self.ready = threading.Event()
        self.sent = 0
        self.error = None

    def run(self):
        try:
            asyncio.run(self._run())
        except Exception as exc:  # noqa: BLE001 - reported in the results
            self.error = exc
            self.ready.set()

    async def _run(self):
        from danube.client import DanubeClient
        async with DanubeClient(self.url) as client:
            producer = await client.create_producer(self.topic, "paced", partitions=PARTITIONS,
                                                    reliable=True)
            self.ready.set()
            per_tick = max(1, self.rate // 100)
            payload = b"y" * 100
            t = time.monotonic()
            while not self.stop_flag.is_set():
                await producer.send_many([payload] * per_tick)
                self.sent += per_tick
                t += 0.01
                await asyncio.sleep(max(0.0, t - time.monotonic()))
            await producer.close()


def save_record_batches(url, topic, directory):
    """The connector's record batches of every partition of ``topic``, as Arrow IPC files."""
    import pyarrow as pa
    from danube_spark.columns import record_batches
    from danube_spark.rpc import Broker
    from danube_spark.schema import ARROW_SCHEMA

    paths = []
    with Broker(url) as broker:
        for part in broker.offsets(topic):
            path = os.path.join(directory, f"part-{part.partition}.arrow")
            batches = broker.read_columns(part.topic, part.earliest, part.latest, 8192)
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
                for batch in record_batches(batches, part.topic, part.partition, part.earliest,
                                            part.latest, True):
                    writer.write_batch(batch)
            paths.append(path)
    return paths


def arrow_ceiling_source():
    """A Python data source that yields record batches already made: what Spark's Python
    Data Source API costs by itself. Defined here (in __main__) so that Spark pickles it by
    value to its workers."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from danube_spark.schema import SCHEMA

    class Reader(DataSourceReader):
        def __init__(self, paths):
            self.paths = paths

        def partitions(self):
            return [InputPartition(p) for p in self.paths]

        def read(self, partition):
            import pyarrow as pa
            with pa.memory_map(partition.value) as source:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)

    class ArrowCeiling(DataSource):
        @classmethod
        def name(cls):
            return "arrow_ceiling"

        def schema(self):
            return SCHEMA

        def reader(self, schema):
            return Reader(self.options["paths"].split(","))

    return ArrowCeiling


def standalone_read(broker, scratch):
    """The connector's noop read of TOPIC on a Spark standalone cluster of two workers, best
    of ROUNDS after a warm-up, with the broker's CPU over the timed reads."""
    sys.path.insert(0, str(SUPPORT))
    from spark_standalone import SparkStandalone, cluster_session, wait_executors
    from danube_spark import DanubeDataSource

    print("[standalone] starting a master and 2 workers ...", flush=True)
    t0 = time.perf_counter()
    cluster = SparkStandalone(os.path.join(scratch, "standalone"), workers=2).start()
    try:
        # Executors with the JVM's full JIT, as local[2]'s driver JVM has.
        spark = cluster_session(cluster, "bench.spark-standalone", quick_start=False)
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(DanubeDataSource)
        wait_executors(spark, 2)
        start_s = time.perf_counter() - t0

        def df():
            return (spark.read.format("danube").option("service_url", broker.url)
                    .option("topic", TOPIC).load())
        rows = df().count()
        df().write.format("noop").mode("overwrite").save()
        times, cpu = [], 0.0
        for r in range(ROUNDS):
            print(f"[standalone] round {r + 1} of {ROUNDS} ...", flush=True)
            cpu0 = proc_cpu(broker.pid)
            t1 = time.perf_counter()
            df().write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t1)
            cpu += proc_cpu(broker.pid) - cpu0
        spark.stop()
    finally:
        cluster.stop()
    return {"rows": rows, "noop_s": min(times), "parquet_s": float("nan"), "broker_cpu_s": cpu,
            "reads": ROUNDS, "start_s": start_s}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200,000 messages, 10 s of streaming")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--rate", type=int, default=10_000, help="streaming publish rate, msgs/s")
    ap.add_argument("--stream-seconds", type=float, default=None)
    ap.add_argument("--no-standalone", action="store_true",
                    help="skip the read on a Spark standalone cluster")
    args = ap.parse_args(argv)
    count = args.messages or (200_000 if args.quick else 1_000_000)
    stream_s = args.stream_seconds or (10.0 if args.quick else 30.0)

    # Spark's Python workers run `python3` from PATH unless told: they need this
    # environment's, which has the connector.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from danube_spark import DanubeDataSource

    scratch = tempfile.mkdtemp(prefix="danube-spark-bench-")
    broker = Broker(os.path.join(scratch, "data"), os.path.join(scratch, "broker.log"))
    results = {}
    try:
        print(f"publishing {count:,} x 100 B to {TOPIC} ({PARTITIONS} partitions) ...",
              flush=True)
        t0 = time.perf_counter()
        publish(broker.url, TOPIC, count)
        print(f"  {count / (time.perf_counter() - t0):,.0f} msgs/s", flush=True)

        spark = (SparkSession.builder.master("local[2]").appName("bench.spark")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "4")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(DanubeDataSource)

        def danube():
            return (spark.read.format("danube").option("service_url", broker.url)
                    .option("topic", TOPIC).load())

        spark.dataSource.register(arrow_ceiling_source())
        arrow_paths = save_record_batches(broker.url, TOPIC, scratch)

        parquet_path = os.path.join(scratch, "rows.parquet")
        json_path = os.path.join(scratch, "rows.json")
        danube().write.mode("overwrite").parquet(parquet_path)
        danube().write.mode("overwrite").json(json_path)
        schema = spark.read.parquet(parquet_path).schema
        sources = {
            "danube topic (connector)": danube,
            "Parquet file": lambda: spark.read.parquet(parquet_path),
            "JSON lines file": lambda: spark.read.schema(schema).json(json_path),
            "Python source ceiling": lambda: (spark.read.format("arrow_ceiling")
                                              .option("paths", ",".join(arrow_paths)).load()),
        }
        # Rounds interleave the sources, so that none is timed on a colder JVM than another
        # (the JIT warms up over the first reads, whichever source makes them).
        out = os.path.join(scratch, "out.parquet")
        ways = {"noop_s": lambda df: df().write.format("noop").mode("overwrite").save(),
                "parquet_s": lambda df: df().write.mode("overwrite").parquet(out)}
        for label, df in sources.items():
            print(f"[batch] warming up: {label} ...", flush=True)
            results[label] = {"rows": df().count(), "noop_s": [], "parquet_s": [],
                              "broker_cpu_s": 0.0, "reads": 0, "cores": []}
            ways["noop_s"](df)
        for r in range(ROUNDS):
            print(f"[batch] round {r + 1} of {ROUNDS} ...", flush=True)
            for way, run in ways.items():
                for label, df in sources.items():
                    cpu0, busy0 = proc_cpu(broker.pid), system_busy()
                    t0 = time.perf_counter()
                    run(df)
                    took = time.perf_counter() - t0
                    results[label][way].append(took)
                    results[label]["broker_cpu_s"] += proc_cpu(broker.pid) - cpu0
                    results[label]["reads"] += 1
                    if way == "noop_s":
                        # How many of the machine's cores the read kept busy: a source
                        # that already fills both leaves no room for a broker's work.
                        results[label]["cores"].append((system_busy() - busy0) / took)
        for r in results.values():
            best = r["noop_s"].index(min(r["noop_s"]))
            r["cores"] = r["cores"][best]           # of the best noop read
            r["noop_s"], r["parquet_s"] = min(r["noop_s"]), min(r["parquet_s"])

        print(f"[stream] {args.rate:,} msgs/s for {stream_s:g} s, default trigger, "
              f"foreachBatch ...", flush=True)
        latencies = []
        paced = Paced(broker.url, STREAM_TOPIC, args.rate)
        paced.start()
        paced.ready.wait(30)

        def sink(batch_df, batch_id):
            now = time.time()
            latencies.extend(now - r[0].timestamp() for r in batch_df.select("timestamp")
                             .collect())

        query = (spark.readStream.format("danube").option("service_url", broker.url)
                 .option("topic", STREAM_TOPIC).option("startingOffsets", "latest").load()
                 .writeStream.foreachBatch(sink)
                 .option("checkpointLocation", os.path.join(scratch, "ckpt")).start())
        time.sleep(stream_s)
        paced.stop_flag.set()
        paced.join(30)
        time.sleep(2)
        query.stop()
        spark.stop()
        if not args.no_standalone:
            results["standalone"] = standalone_read(broker, scratch)
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    print()
    print(f"{'source':<26} {'rows':>10} {'noop s':>8} {'rows/s':>11} {'parquet s':>10} "
          f"{'rows/s':>11}  broker us/msg  cores busy")
    for label, r in results.items():
        cores = f"{r['cores']:.2f}" if "cores" in r else "-"
        us = (f"{r['broker_cpu_s'] * 1e6 / (r['rows'] * r['reads']):.2f}"
              if label.startswith("danube") or label == "standalone" else "-")
        print(f"{label:<26} {r['rows']:>10,} {r['noop_s']:>8.2f} "
              f"{r['rows'] / r['noop_s']:>11,.0f} {r['parquet_s']:>10.2f} "
              f"{r['rows'] / r['parquet_s']:>11,.0f}  {us:>13}  {cores}")
    print(f"(best of {ROUNDS} rounds, each timing every source in turn; broker CPU over the "
          f"connector's timed reads; cores busy: the whole machine's busy CPU seconds over the "
          f"best noop read's seconds, of {os.cpu_count()})")
    d = results["danube topic (connector)"]
    p, j = results["Parquet file"], results["JSON lines file"]
    ratio_p = p["noop_s"] / d["noop_s"]
    ratio_j = j["noop_s"] / d["noop_s"]
    print()
    print("targets:")
    print(f"  [{'met' if ratio_p >= 0.5 else 'NOT met'}] topic read >= 0.5x Parquet read "
          f"({ratio_p:.2f}x)")
    print(f"  [{'met' if ratio_j >= 1.0 else 'NOT met'}] topic read >= JSON lines read "
          f"({ratio_j:.2f}x)")
    c = results["Python source ceiling"]
    print(f"  (the ceiling of a Python data source is {p['noop_s'] / c['noop_s']:.2f}x the "
          f"Parquet read; the topic read is {c['noop_s'] / d['noop_s']:.2f}x the ceiling)")
    ratio_c = c["noop_s"] / d["noop_s"]
    print(f"  [{'met' if ratio_c >= 0.9 else 'NOT met'}] topic read >= 0.9x the Python source "
          f"ceiling ({ratio_c:.2f}x)")
    st = results.get("standalone")
    if st is not None:
        ratio_s = d["noop_s"] / st["noop_s"]
        print(f"  [{'met' if ratio_s >= 0.8 else 'NOT met'}] standalone cluster (2 workers, 1-core "
              f"executors) read >= 0.8x local[2] ({ratio_s:.2f}x: {st['noop_s']:.2f} s vs "
              f"{d['noop_s']:.2f} s, {st['rows'] / st['noop_s']:,.0f} rows/s; broker "
              f"{st['broker_cpu_s'] * 1e6 / (st['rows'] * st['reads']):.2f} us/row; cluster "
              f"start {st['start_s']:.0f} s, not in the figure)")
    if latencies:
        lat = sorted(latencies)
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"  [{'met' if p50 < 1.0 else 'NOT met'}] streaming p50 publish-to-sink < 1 s "
              f"(p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, {len(lat):,} rows of "
              f"{paced.sent:,} sent)")
    else:
        print(f"  [NOT met] streaming: no rows reached the sink ({paced.error or 'no error'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
