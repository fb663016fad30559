"""`danube connect run` in a child process for bench.connect's cases: its ports (read from its
JSON log), readiness, processed counter, the timed run, an optional py-spy profile
(BENCH_CONNECT_PROFILE=folder), and the runtime's part of the TOML (``core``)."""

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid


class Connector:
    def __init__(self, workdir, text, env=None, profile=False):
        self.path = os.path.join(workdir, f"c-{uuid.uuid4().hex[:6]}.toml")
        with open(self.path, "w") as fh:
            fh.write(text)
        self.log = open(self.path + ".log", "w+")
        command = [sys.executable, "-P", "-m", "danube", "connect", "run", "--config",
                   self.path]
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        self.profiler = None
        folder = os.environ.get("BENCH_CONNECT_PROFILE")
        if folder and profile:
            # py-spy's collapsed stacks of the timed run; it ends when the connector does.
            self.profiler = subprocess.Popen(
                [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record",
                 "--format", "raw", "--rate", "200", "--nonblocking", "--pid",
                 str(self.proc.pid), "-o",
                 os.path.join(folder, os.path.basename(self.path) + ".txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.port = self._field("metrics_port")

    def _field(self, name, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.log.seek(0)
            for line in self.log:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if name in doc:
                    return doc[name]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.log.seek(0)
        raise RuntimeError(f"connector: no {name}:\n{self.log.read()}")

    def processed(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            total = 0.0
            for line in r.read().decode().splitlines():
                if line.startswith("danube_connector_messages_processed_total{"):
                    total += float(line.rsplit(" ", 1)[1])
            return total

    def ready(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/ready",
                                        timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def timed_until(self, n, timeout=600, interval=0.05):
        """Seconds from the first processed record to the n-th, sampled every ``interval``
        (each sample costs the connector a /metrics rendering, so a finer sampling slows
        it: the MQTT source, done with 30,000 messages in a few hundred ms, is sampled
        every 10 ms, where 50 ms made its figure vary by half)."""
        deadline = time.monotonic() + timeout
        first = None
        while time.monotonic() < deadline:
            done = self.processed()
            now = time.monotonic()
            if done and first is None:
                first = (now, done)
                if done >= n:
                    raise RuntimeError(f"all {n} records were processed before the first "
                                       f"sample: too few to time; ask for more")
            if done >= n:
                # The first sample saw `first[1]` already done: count from the start of
                # the rest.
                return (now - first[0]) * n / max(1.0, n - first[1])
            time.sleep(interval)
        raise RuntimeError(f"connector processed {self.processed()} of {n}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        if self.profiler is not None:
            self.profiler.wait(60)


def core(broker, name, kind, batch):
    return f'''connector = "{kind}"
danube_service_url = "{broker.url}"
connector_name = "{name}"
[processing]
batch_size = {batch}
batch_timeout_ms = 50
poll_interval_ms = 20
metrics_port = 0
metrics_host = "127.0.0.1"
log_level = "info"
'''


def backlog_for_sink(broker, workdir, topic, text, rows):
    """``rows`` as JSON published to ``topic`` while a sink's subscription waits for them:
    the sink (``text``) is started once to create its subscription, then stopped."""
    async def fill():
        from danube.client import DanubeClient
        async with DanubeClient(broker.url) as client:
            p = await client.create_producer(topic, "bench", reliable=True)
            conn = Connector(workdir, text)
            while not conn.ready():
                await asyncio.sleep(0.05)
            conn.stop()          # the subscription exists: the records wait for it
            await p.send_many([json.dumps(r, separators=(",", ":")).encode() for r in rows])
    asyncio.run(fill())
