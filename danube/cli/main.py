"""The `danube` command."""

import argparse
import importlib
import logging
import os
import sys

from danube import __version__

# Each command's module (its add_parser) in `danube --help`'s order; None: this module's.
# Only the command run is imported: a broker does not load the client and admin tools, and
# each is ~0.1 s of start-up (every CLI call and broker start pays it).
COMMANDS = {"broker": None, "produce": "danube.cli.produce", "consume": "danube.cli.consume",
            "schema": "danube.cli.schema", "admin": "danube.cli.admin",
            "cluster": "danube.cli.cluster", "connect": "danube.cli.connectors"}


def _add_broker(sub):
    p = sub.add_parser("broker", help="run a broker",
                       description="Run a Danube-compatible broker.")
    p.add_argument("--config-file", help="broker YAML (upstream danube_broker.yml keys)")
    p.add_argument("--mode", choices=("standalone", "cluster", "edge"),
                   help="standalone: single broker with embedded metadata, no config file "
                        "needed; cluster (the default, as upstream) requires --config-file; "
                        "edge: an MQTT gateway replicating to a cluster, requires "
                        "--data-dir and --edge-config")
    p.add_argument("--edge-config", metavar="FILE",
                   help="edge mode: upstream's edge.yaml (edge, replicator and mqtt sections)")
    p.add_argument("--edge-token", metavar="TOKEN",
                   help="edge mode: the JWT sent to the cluster (overrides edge.token)")
    p.add_argument("--data-dir", help="directory for all broker state")
    p.add_argument("--broker-addr", metavar="HOST:PORT",
                   help="client gRPC address (default 127.0.0.1:6650)")
    p.add_argument("--admin-addr", metavar="HOST:PORT",
                   help="admin gRPC address (default 127.0.0.1:50051)")
    p.add_argument("--prom-exporter", metavar="HOST:PORT",
                   help="serve Prometheus metrics on this address")
    p.add_argument("--advertised-addr", metavar="HOST:PORT",
                   help="address clients are told to connect to (broker_url and connect_url)")
    p.add_argument("--connect-url", metavar="HOST:PORT",
                   help="address clients dial, if it differs from the advertised broker URL")
    p.add_argument("--etcd-endpoints", metavar="H1:P1,H2:P2",
                   help="cluster mode: the etcd cluster holding the shared metadata "
                        "(meta_store.etcd_endpoints); without it a cluster-mode broker is a "
                        "one-broker cluster on the embedded store")
    p.add_argument("--etcd-ca-file", metavar="PEM",
                   help="https to etcd: the CA that signed etcd's certificate "
                        "(meta_store.etcd_tls.ca_file)")
    p.add_argument("--etcd-cert-file", metavar="PEM",
                   help="https to etcd: this broker's client certificate "
                        "(meta_store.etcd_tls.cert_file)")
    p.add_argument("--etcd-key-file", metavar="PEM",
                   help="https to etcd: the client certificate's key "
                        "(meta_store.etcd_tls.key_file)")
    p.add_argument("--raft-addr", metavar="HOST:PORT",
                   help="upstream's Raft address; accepted and ignored (clusters share etcd)")
    p.add_argument("--seed-nodes", metavar="H1:P1,H2:P2",
                   help="upstream's Raft seed nodes; accepted and ignored")
    p.add_argument("--join", action="store_true",
                   help="upstream's Raft join; accepted and ignored")
    p.add_argument("--insecure-allow-unauthenticated", action="store_true",
                   help="with auth.mode tls, serve TLS but check no token (JWT) and no "
                        "permission: every call is accepted. Without this flag, tls mode "
                        "needs auth.jwt.secret_key or auth.jwt.public_key_file")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=_run_broker)


def _run_broker(args):
    import uvloop

    from danube.process.app import Broker
    from danube.config import ConfigError, apply_overrides, load_config

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.mode == "edge":
        return _run_edge(args)
    try:
        if args.mode is None:
            args.mode = "cluster"
        if args.mode == "cluster" and not args.config_file:
            raise ConfigError("cluster mode (the default) requires --config-file; "
                              "use --mode standalone for a single broker")
        cfg = apply_overrides(load_config(args.config_file), args)
    except ConfigError as exc:
        print(f"danube broker: {exc}", file=sys.stderr)
        return 2
    _warn_unbuilt(cfg, args)
    from danube.security.tokens import KeyConfigError
    from danube.metadata.errors import MetadataError
    from danube.storage.errors import TieredStartupError

    try:
        broker = Broker(cfg)
    except KeyConfigError as exc:
        print(f"danube broker: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(broker.run())
    except (OSError, TieredStartupError, MetadataError) as exc:
        print(f"danube broker: cannot start: {exc}", file=sys.stderr)
        return 1
    _exit_now(0)
    return 0


def _exit_now(status):
    """End a broker that has stopped: everything it keeps was made durable by its own
    syncs, so the interpreter's teardown (freeing a hundred thousand topics' objects one by
    one: seconds) is skipped, and SIGTERM ends the process as soon as the broker stopped."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _run_edge(args):
    """Upstream's checks (args_parse.rs): edge mode takes neither --config-file nor --join,
    and needs --data-dir and --edge-config."""
    import uvloop

    from danube.config_errors import ConfigError

    problem = None
    if args.config_file:
        problem = "--mode edge cannot be used together with --config-file"
    elif args.join:
        problem = "--mode edge cannot be used together with --join"
    elif not args.data_dir:
        problem = "--mode edge requires --data-dir"
    elif not args.edge_config:
        problem = "--mode edge requires --edge-config"
    if problem:
        print(f"danube broker: {problem}", file=sys.stderr)
        return 2
    from danube.edge import config as edge_config
    from danube.edge.app import EdgeBroker
    from danube.metadata.errors import MetadataError

    try:
        cfg = edge_config.load(args.edge_config)
    except ConfigError as exc:
        print(f"danube broker: {exc}", file=sys.stderr)
        return 2
    try:
        uvloop.run(EdgeBroker(cfg, args.data_dir, args.edge_token).run())
    except (OSError, MetadataError) as exc:
        print(f"danube broker: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def _warn_unbuilt(cfg, args):
    from danube.config_keys import unbuilt_warning

    log = logging.getLogger("danube.config")
    flags = [f for f, given in (("--raft-addr", args.raft_addr), ("--seed-nodes",
             args.seed_nodes), ("--join", args.join)) if given]
    line = unbuilt_warning(cfg.unbuilt_keys + flags)
    if line:
        log.warning("%s", line)
    if cfg.failover_is_lossy:
        log.warning("storage.failover: lossy_local_wal: a reliable topic's acknowledged "
                    "messages not yet uploaded are only on its owner's disk; if that broker "
                    "is lost, the next owner continues without them (they are kept aside if "
                    "the disk comes back: `danube admin topics republish-orphaned`). "
                    "write_buffer, uploaded or shared_wal_root lose nothing (docs/cluster.md)")
    elif cfg.failover is not None:
        log.info("storage.failover: %s (acknowledged messages outlive their owner)",
                 cfg.failover)
    if cfg.mode == "cluster" and not cfg.etcd_endpoints:
        # Upstream's cluster mode with no seed nodes is a single-node Raft cluster; ours
        # without etcd is the same broker on the embedded store.
        log.warning("cluster mode without meta_store.etcd_endpoints: serving as a "
                    "single-node cluster on the embedded store")
    if cfg.policies.max_subscription_dispatch_rate:
        # As upstream: a non-reliable subscription keeps nothing to pace, so it is not.
        log.info("policies.max_subscription_dispatch_rate %d/s paces reliable "
                 "subscriptions; non-reliable ones are not paced",
                 cfg.policies.max_subscription_dispatch_rate)
    if cfg.auth_mode == "tls" and cfg.insecure_allow_unauthenticated:
        log.warning("auth.mode tls with --insecure-allow-unauthenticated: TLS only, every "
                    "call is accepted without a token")


def build_parser(command=None):
    """The `danube` parser; with ``command`` (one of COMMANDS), only that command's."""
    parser = argparse.ArgumentParser(prog="danube", description="Danube-compatible broker")
    parser.add_argument("--version", action="version", version=f"danube {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        if command is None or name == command:
            add = _add_broker if module is None else importlib.import_module(module).add_parser
            add(sub)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    # The first argument names the command unless it is an option (--help, --version) or
    # unknown: then the whole parser answers, with every command in its usage.
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
