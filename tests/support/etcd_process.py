"""A real etcd (Debian ``etcd-server``, installed by bin/test) on free 127.0.0.1 ports, for the
etcd metadata store and the cluster tests.

One single-member cluster per instance, with its data in its own directory. It can be
stopped (SIGTERM), killed (SIGKILL), paused (SIGSTOP: to its clients etcd hangs, as on a
network partition) and started again on the same ports with the same data. Short heartbeat
and election timeouts make etcd's minimum lease TTL one second (it is 1.5 election timeouts,
rounded up), so tests can use short leases. Every process started is stopped at teardown,
and at interpreter exit should a run be cut short.
"""

from __future__ import annotations

import atexit
import json
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ports import free_port

INSTALL_HINT = "etcd is not installed: run `bash bin/test` (it installs Debian etcd-server)"

_live: set = set()


@atexit.register
def _kill_leftovers():
    for etcd in list(_live):
        etcd.stop()


class EtcdProcess:
    def __init__(self, workdir, *, ready_timeout: float = 30.0, tls: dict | None = None,
                 auth_token_ttl: int | None = None):
        """``tls``: serve https with ``cert_file``/``key_file``; with ``ca_file`` too, ask
        clients for a certificate signed by it (``--client-cert-auth``), which this object
        presents from ``client_cert_file``/``client_key_file``. ``auth_token_ttl``: how
        long etcd keeps an unused authentication token (``enable_auth``)."""
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self.binary = shutil.which("etcd")
        if self.binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def endpoint(self) -> str:
        """``host:port``, the form of ``meta_store.etcd_endpoints``."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def _urlopen(self, path: str, data: bytes | None = None, timeout: float = 5,
                 token: str | None = None):
        context = None
        if self.tls:
            context = ssl.create_default_context(cafile=self.tls.get("ca_file"))
            if self.tls.get("client_cert_file"):
                context.load_cert_chain(self.tls["client_cert_file"],
                                        self.tls["client_key_file"])
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers)
        return urllib.request.urlopen(request, timeout=timeout, context=context)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls = []
        if self.tls:
            tls = ["--cert-file", self.tls["cert_file"], "--key-file", self.tls["key_file"]]
            if self.tls.get("ca_file"):
                tls += ["--trusted-ca-file", self.tls["ca_file"], "--client-cert-auth"]
        if self.auth_token_ttl is not None:
            tls += ["--auth-token-ttl", str(self.auth_token_ttl)]
        return [self.binary, *tls, "--name", "test", "--data-dir", str(self.workdir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}", "--initial-cluster-state", "new",
                "--heartbeat-interval", "20", "--election-timeout", "200",
                "--log-level", "warn", "--logger", "zap"]

    def start(self) -> EtcdProcess:
        if self.running:
            return self
        _live.add(self)
        self._log = open(self.workdir / "etcd.log", "ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                with self._urlopen("/health", timeout=1) as resp:
                    if json.load(resp).get("health") == "true":
                        return
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = exc
            time.sleep(0.05)
        raise RuntimeError(f"etcd not ready after {self.ready_timeout}s ({last}): "
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.workdir / "etcd.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.running:
            self.proc.send_signal(sig)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL and reap; ``start()`` brings it back with the same data."""
        if self.proc is not None:
            self.resume()
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()
        _live.discard(self)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def call(self, path: str, body: dict, token: str | None = None) -> dict:
        """One call to the JSON gateway (``/v3/...``)."""
        request = self._urlopen(path, json.dumps(body).encode(), token=token)
        with request as resp:
            return json.load(resp)

    def enable_auth(self, users: dict[str, str]) -> None:
        """Turn on etcd's authentication: user ``root`` (password ``root``) and each of
        ``users`` (name -> password) with read and write on every key."""
        everything = {"permType": "READWRITE", "key": "AA==", "range_end": "AA=="}
        self.call("/v3/auth/role/add", {"name": "root"})
        self.call("/v3/auth/user/add", {"name": "root", "password": "root"})
        self.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        self.call("/v3/auth/role/add", {"name": "readwrite"})
        self.call("/v3/auth/role/grant", {"name": "readwrite", "perm": everything})
        for name, password in users.items():
            self.call("/v3/auth/user/add", {"name": name, "password": password})
            self.call("/v3/auth/user/grant", {"user": name, "role": "readwrite"})
        self.call("/v3/auth/enable", {})

    def wipe(self) -> None:
        """Delete every key (between tests sharing one etcd)."""
        body = json.dumps({"key": "AA==", "range_end": "AA=="}).encode()  # "\0".."\0": all
        with self._urlopen("/v3/kv/deleterange", body):
            pass
