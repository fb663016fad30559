"""`danube admin`: upstream danube-admin's command line (reference f.2) against a broker's
admin port: one module per subcommand group, each with an ``add_parser(sub)`` that registers
its group and sets ``func`` on its leaves. `serve` runs the web console (danube.console)."""

import argparse

from danube.client.admin import DEFAULT_ENDPOINT, ENDPOINT_ENV

GROUPS = ("brokers", "cluster", "namespaces", "topics", "schemas", "security", "serve")


def add_parser(sub):
    import importlib

    p = sub.add_parser(
        "admin", help="manage a broker through its admin API (upstream danube-admin)",
        description="Manage brokers, namespaces, topics and schemas through the admin API, "
                    "as upstream's danube-admin does; `serve` opens a web console.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help=f"admin API URL (env {ENDPOINT_ENV}, default {DEFAULT_ENDPOINT})")
    groups = p.add_subparsers(dest="admin_group", required=True, metavar="GROUP")
    for name in GROUPS:
        importlib.import_module(f"danube.cli.admin.{name}").add_parser(groups)


def main(argv=None):
    """The `danube-admin` console script: the same command as `danube admin ...`, so that
    upstream's scripts calling danube-admin work unchanged."""
    import sys

    parser = argparse.ArgumentParser(prog="danube")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["admin", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
