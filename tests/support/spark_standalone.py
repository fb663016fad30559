"""A Spark standalone cluster for tests and benchmarks: a master and workers, each its own JVM
started with the PySpark distribution's `spark-class` (org.apache.spark.deploy.master.Master,
...worker.Worker), on free ports, logs kept in the work directory, stopped (or killed) at
the end. The executors the workers launch run Python workers with ``python`` (the
interpreter that has danube_spark installed: the driver's spark.pyspark.python names it, and
the workers' PYSPARK_PYTHON too).

Sized for a small shared machine: each worker offers 1 core and 1 GiB, an application takes
one executor of 1 core and 512 MiB per worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from ports import free_port
from waiting import wait_for

# Daemons and executors do little computing: the C1 compiler alone and the serial collector
# start them sooner and keep their threads few on 2 shared cores.
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Starting a JVM takes a few seconds on an idle machine; the suite runs 4 at once on 2 cores.
START_TIMEOUT = 180


def _wait(predicate, what):
    """wait_for with the daemons' logs in the failure (``what`` is called only then)."""
    try:
        wait_for(predicate, timeout=START_TIMEOUT, interval=0.5, what="Spark")
    except AssertionError:
        raise AssertionError(f"timed out after {START_TIMEOUT} s waiting for {what()}") from None


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


def spark_env(python: str) -> dict:
    env = dict(os.environ)
    env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python,
               # The daemons' own heap: the executors get theirs from the application.
               SPARK_DAEMON_MEMORY="256m", SPARK_NO_DAEMONIZE="1",
               SPARK_DAEMON_JAVA_OPTS=JVM_OPTS,
               # No REST submission server: it would take the fixed port 6066.
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    return env


class JvmProcess:
    """One `spark-class` daemon, its output in ``log``."""

    def __init__(self, name: str, args: list[str], workdir: Path, env: dict):
        self.name = name
        self.args = args
        self.log = workdir / f"{name}.log"
        self.env = env
        self.proc = None

    def start(self):
        with open(self.log, "ab") as out:
            # Its own process group: a stop takes the executors it launched too.
            self.proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *self.args],
                stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """kill -9 of the daemon alone (what a crashed machine's worker looks like to the
        master; its executor notices the worker is gone and exits)."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class SparkStandalone:
    """``master_url`` (spark://...) for SparkSession.builder.master()."""

    def __init__(self, workdir, *, workers: int = 2, python: str = sys.executable,
                 worker_cores: int = 1, worker_memory: str = "1g"):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.env = spark_env(python)
        self.n_workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.port = free_port()
        self.ui_port = free_port()
        self.master = JvmProcess("master", [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port)],
            self.workdir, self.env)
        self.workers: list[JvmProcess] = []
        self._started = 0

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def _state_or_none(self):
        try:
            return self.state()
        except OSError:
            return None

    def alive_workers(self) -> list[dict]:
        try:
            return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def add_worker(self) -> JvmProcess:
        self._started += 1
        name = f"worker{self._started}"
        work = self.workdir / name
        work.mkdir(exist_ok=True)
        worker = JvmProcess(name, [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--port", str(free_port()), "--webui-port", str(free_port()),
            "--cores", str(self.worker_cores), "--memory", self.worker_memory,
            "--work-dir", str(work), self.master_url], self.workdir, self.env)
        worker.start()
        self.workers.append(worker)
        return worker

    def start(self) -> SparkStandalone:
        self.master.start()
        try:
            _wait(lambda: self.master.alive and "elected leader" in self.master.tail(50),
                  lambda: f"the Spark master to answer; its log:\n{self.master.tail()}")
            for _ in range(self.n_workers):
                self.add_worker()
            self.wait_workers(self.n_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def start_in_background(self) -> SparkStandalone:
        """start() on a thread, so that a caller starts other servers meanwhile;
        ``wait_started()`` joins it (and raises what it raised)."""
        def run():
            try:
                self.start()
            except BaseException as exc:  # noqa: BLE001 - raised again by wait_started
                self._failure = exc
        self._failure = None
        self._starter = threading.Thread(target=run, daemon=True)
        self._starter.start()
        return self

    def wait_started(self) -> SparkStandalone:
        self._starter.join()
        if self._failure is not None:
            raise self._failure
        return self

    def wait_workers(self, n: int):
        _wait(lambda: len(self.alive_workers()) >= n,
              lambda: f"{n} Spark workers to register; their logs:\n" + "\n".join(
                  w.tail(10) for w in self.workers))

    def worker_running_executor(self) -> JvmProcess | None:
        """A live worker whose executor is up (its work directory has the app's stderr)."""
        for worker in self.workers:
            if worker.alive and any((self.workdir / worker.name).glob("app-*/*/stderr")):
                return worker
        return None

    def stop(self):
        for worker in self.workers:
            worker.stop()
        self.master.stop()


def cluster_session(standalone: SparkStandalone, app: str, *, quick_start: bool = True,
                    **conf):
    """A SparkSession on the standalone cluster: one 1-core, 512 MiB executor per worker,
    the Python workers run with the cluster's interpreter; ``conf`` adds settings.
    ``quick_start``: executors with the C1 compiler alone (JVM_OPTS), which start sooner but
    run long jobs slower: tests want it, a benchmark does not."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = standalone.python
    os.environ["PYSPARK_DRIVER_PYTHON"] = standalone.python
    builder = (SparkSession.builder.master(standalone.master_url).appName(app)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "512m")
               .config("spark.executor.memory", "512m")
               .config("spark.executor.cores", "1")
               .config("spark.cores.max", str(standalone.n_workers))
               .config("spark.pyspark.python", standalone.python)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               # A Python worker connecting back to its executor, and an executor to the
               # driver, are slow when the machine is loaded.
               .config("spark.python.authenticate.socketTimeout", "120s")
               .config("spark.network.timeout", "300s")
               .config("spark.executor.heartbeatInterval", "20s"))
    if quick_start:
        builder = (builder.config("spark.executor.extraJavaOptions", JVM_OPTS)
                   .config("spark.driver.extraJavaOptions", JVM_OPTS))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    return session


def wait_executors(session, n: int, timeout: float = START_TIMEOUT):
    """Until ``n`` executors (besides the driver) are registered with the application."""
    sc = session.sparkContext

    def registered():
        # getExecutorInfos includes the driver.
        return len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1 >= n
    wait_for(registered, timeout=timeout, interval=0.5,
             what=f"{n} executors to register with the application")
