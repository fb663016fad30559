"""`danube connect run --config FILE` as a real child process: its JSON log lines, its
metrics and health endpoint (port read from the log), SIGTERM and SIGKILL."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid

from waiting import wait_for

LISTENING = re.compile(r"listening on http://[\d.]+:(\d+)")


def runtime_toml(kind, service_url, name, *, dlq=None, max_backoff_ms=1000, **processing):
    """The runtime's part of a connector's TOML, as the connector tests use it: the
    connector, broker and name (and a dead-letter topic), fast retries (2, from 100 ms), and
    ``[processing]`` with ``processing``'s keys (e.g. batch_size=200, batch_timeout_ms=200),
    metrics on a free port of 127.0.0.1. The connector's own tables follow it."""
    lines = [f'connector = "{kind}"', f'danube_service_url = "{service_url}"',
             f'connector_name = "{name}"']
    if dlq:
        lines.append(f'dead_letter_topic = "{dlq}"')
    lines += ["", "[retry]", "max_retries = 2", "retry_backoff_ms = 100",
              f"max_backoff_ms = {max_backoff_ms}", "", "[processing]"]
    lines += [f"{key} = {value}" for key, value in processing.items()]
    lines += ["metrics_port = 0", 'metrics_host = "127.0.0.1"', ""]
    return "\n".join(lines) + "\n"


class Collector:
    """A Danube consumer in the test's loop (exclusive, acking each message), collecting
    what a connector published to ``topic``. ``create_topic``: make it a reliable topic
    first, so the subscription sees everything published after start()."""

    def __init__(self, client, topic, create_topic=False):
        self.client, self.topic = client, topic
        self.create_topic = create_topic
        self.messages = []
        self._task = None

    async def start(self):
        if self.create_topic:
            await self.client.create_producer(self.topic, f"mk-{uuid.uuid4().hex[:6]}",
                                              reliable=True)
        self.consumer = await self.client.subscribe(self.topic, f"c-{uuid.uuid4().hex[:6]}",
                                                    "test", "exclusive")
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self):
        async for msg in self.consumer.messages():
            self.messages.append(msg)
            await self.consumer.ack(msg)

    def payloads(self):
        return [m.payload for m in self.messages]

    def events(self):
        """The payloads as JSON documents."""
        return [json.loads(m.payload) for m in self.messages]

    async def stop(self):
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.close()


class ConnectorProcess:
    def __init__(self, config_path, env=None):
        self.config_path = config_path
        self.env = env or {}
        self.proc = None
        self.lines = []
        self.port = None

    def start(self, ready=True, timeout=60):
        env = dict(os.environ, **self.env)
        # -P: the source tree's danube/ (no compiled modules) must not shadow the install.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "danube", "connect", "run", "--config",
             str(self.config_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env)
        threading.Thread(target=self._pump, daemon=True).start()
        try:
            wait_for(lambda: self.port or self._died(), timeout, what="the connector's port")
            if ready:
                wait_for(lambda: self.ready() or self._died(), timeout,
                         what="connector ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; health {self.get('/health/ready')}; log:\n"
                                 f"{self.log()}") from None
        return self

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"connector exited {self.proc.returncode}:\n{self.log()}")
        return False

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = LISTENING.search(line)
            if m and self.port is None:
                self.port = int(m.group(1))

    def log(self):
        return "".join(self.lines)

    def records(self):
        """The JSON log lines, parsed."""
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return None, ""

    def ready(self):
        return self.get("/health/ready")[0] == 200

    def metric(self, name, **labels):
        """The sum of ``name``'s samples whose labels include ``labels``."""
        status, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def sigkill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout=60):
        """SIGTERM; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def run_to_exit(self, timeout=60):
        env = dict(os.environ, **self.env)
        return subprocess.run([sys.executable, "-P", "-m", "danube", "connect", "run",
                               "--config", str(self.config_path)], capture_output=True,
                              text=True, env=env, timeout=timeout)
