"""Real redis-server processes (Debian's redis-server) for the write buffer's tests: a
primary and replicas (``--replicaof``) on ephemeral 127.0.0.1 ports, each with its own data
directory and an append-only file, so a primary killed with SIGKILL and started again on the
same port comes back with every write it answered (Redis writes the AOF before it replies).
Every server started is stopped at teardown, and at interpreter exit."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
import time

from ports import free_port



_live: set = set()
_lock = threading.Lock()


@atexit.register
def _kill_leftovers():
    with _lock:
        servers = list(_live)
    for server in servers:
        server.stop()


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def client(port: int):
    """A synchronous redis-py client: the tests' own view of a server."""
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)


class _PortTaken(Exception):
    pass


class RedisServer:
    """``start()``, ``kill()`` (SIGKILL), ``start()`` again on the same port and data."""

    def __init__(self, base_dir: str, name: str, replica_of: RedisServer | None = None,
                 appendonly: bool = True, cluster: bool = False):
        self.dir = os.path.join(base_dir, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.replica_of = replica_of
        self.appendonly = appendonly
        self.cluster = cluster
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.dir, "redis.log")
        self.started_once = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        # A port picked free can be taken by another process before redis-server binds it
        # (the suite runs on several workers): a first start tries fresh ports; a restart
        # keeps its port, which the tests reconnect to.
        for attempt in range(5):
            if not self.started_once and os.path.exists(self.log_path):
                os.remove(self.log_path)        # the last attempt's "Address already in use"
            try:
                return self._start()
            except _PortTaken:
                if self.started_once or attempt == 4:
                    raise RuntimeError(f"redis-server on {self.port} did not start: "
                                       f"{self.log_tail()}") from None
                self.port = free_port()
                if self.cluster:
                    self.bus_port = free_port()
        raise AssertionError("unreachable")

    def _start(self) -> RedisServer:
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", "everysec",
                "--save", "", "--daemonize", "no", "--protected-mode", "no",
                "--logfile", self.log_path,
                # A primary starts a replica's full sync at once (by default it waits 5 s
                # for more replicas to share the transfer), and SIGTERM stops a server at
                # once (by default a primary waits up to 10 s for a missing replica, and a
                # replica still writing its first append-only file refuses to stop).
                "--repl-diskless-sync-delay", "0", "--shutdown-on-sigterm", "nosave now force"]
        if self.cluster:
            # The bus port explicitly: the default (port + 10000) may be taken or too high.
            if not hasattr(self, "bus_port"):
                self.bus_port = free_port()
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000", "--cluster-port", str(self.bus_port)]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with _lock:
            _live.add(self)
        deadline = time.monotonic() + 30
        while True:
            try:
                with client(self.port) as c:
                    if c.ping():
                        break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if self.proc.poll() is not None and "Address already in use" in self.log_tail():
                with _lock:
                    _live.discard(self)
                raise _PortTaken()
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start: "
                                   f"{self.log_tail()}")
            time.sleep(0.05)
        self.started_once = True
        return self

    def client(self):
        return client(self.port)

    def info(self, section: str = "replication") -> dict:
        with self.client() as c:
            return c.info(section)

    def wait_linked(self, timeout: float = 30) -> None:
        """A replica: until its link to the primary is up and synced."""
        deadline = time.monotonic() + timeout
        while self.info().get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise AssertionError(f"replica {self.port} never linked: {self.log_tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        with _lock:
            _live.discard(self)

    def log_tail(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""


class RedisPair:
    """A primary and ``replicas`` replicas, started and linked."""

    def __init__(self, base_dir: str, replicas: int = 1, appendonly: bool = True):
        self.primary = RedisServer(base_dir, "primary", appendonly=appendonly).start()
        self.replicas = [RedisServer(base_dir, f"replica{i}", self.primary,
                                     appendonly=appendonly).start()
                         for i in range(replicas)]
        for r in self.replicas:
            r.wait_linked()

    @property
    def url(self) -> str:
        return self.primary.url

    def stop(self) -> None:
        for s in (*self.replicas, self.primary):
            s.stop()


class RedisClusterServers:
    """A Redis Cluster of ``primaries`` primaries with one replica each, created by
    ``redis-cli --cluster create`` (Debian's redis-tools, beside redis-server)."""

    def __init__(self, base_dir: str, primaries: int = 3):
        self.servers = [RedisServer(base_dir, f"node{i}", appendonly=False,
                                    cluster=True).start() for i in range(primaries * 2)]
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        out = subprocess.run([shutil.which("redis-cli"), "--cluster", "create", *nodes,
                              "--cluster-replicas", "1", "--cluster-yes"],
                             capture_output=True, text=True, timeout=120)
        if out.returncode:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout[-2000:]}"
                               f"{out.stderr[-2000:]}")
        deadline = time.monotonic() + 60
        while True:
            states = []
            for s in self.servers:
                with s.client() as c:
                    info = c.execute_command("CLUSTER", "INFO")
                    if isinstance(info, bytes):
                        info = info.decode()
                    states.append("cluster_state:ok" in str(info))
            replicas_up = all(s.info().get("master_link_status", "up") == "up"
                              for s in self.servers)
            if all(states) and replicas_up:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the Redis Cluster did not become ready")
            time.sleep(0.2)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers[:3]]

    def primaries(self) -> list[RedisServer]:
        return [s for s in self.servers if s.info().get("role") == "master"]

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
