"""`danube connect run --config FILE` (one connector per process, as upstream's connector
binaries), `danube connect list` (what is registered) and `danube connect check --config
FILE` (validate the file and exit)."""

import sys


def add_parser(sub):
    p = sub.add_parser("connect", help="run source and sink connectors (Danube Connect)",
                       description="Danube Connect: run a source or sink connector. "
                                   "See docs/connect.md.")
    cmds = p.add_subparsers(dest="connect_command", required=True)
    run = cmds.add_parser("run", help="run one connector until SIGTERM")
    run.add_argument("--config", metavar="FILE",
                     help="connector TOML (default: $CONNECTOR_CONFIG_PATH)")
    run.add_argument("--connector", metavar="NAME",
                     help="the registered connector (default: the file's `connector` key)")
    run.set_defaults(func=_run)
    check = cmds.add_parser("check", help="validate a connector configuration and exit")
    check.add_argument("--config", metavar="FILE")
    check.add_argument("--connector", metavar="NAME")
    check.set_defaults(func=_check)
    lst = cmds.add_parser("list", help="the registered connectors")
    lst.set_defaults(func=_list)


def _run(args):
    from danube.connect.runtime import main
    return main(args.config, args.connector)


def _check(args):
    from danube.connect.errors import ConfigError
    from danube.connect.runtime import prepare
    try:
        cls, core, _own = prepare(args.config, args.connector)
    except ConfigError as exc:
        print(f"danube connect: {exc}", file=sys.stderr)
        return 2
    print(f"ok: {core.connector} ({cls.kind}) as {core.connector_name} -> "
          f"{core.danube_service_url}")
    return 0


def _list(args):
    from danube.connect import registry
    for name, ep in sorted(registry.available().items()):
        try:
            cls = ep.load()
            kind = getattr(cls, "kind", "?")
            note = ""
        except ImportError as exc:
            kind, note = "?", f"  (not installed: {exc.name or exc})"
        print(f"{name:20s} {kind:7s} {ep.value}{note}")
    return 0
