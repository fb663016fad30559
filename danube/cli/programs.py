"""Upstream's three executables, `danube-broker`, `danube-cli` and `danube-admin`, as entry
points into the one `danube` command (pip console scripts), and the choice among them by the
name a program was started under (the single executable, linked under each name, as
busybox is)."""

import argparse
import os
import sys

from danube import __version__


def broker_main(argv=None):
    """`danube-broker`: upstream's broker binary, its flags (`--config-file`, `--mode`,
    `--broker-addr`, `--admin-addr`, `--prom-exporter`, `--advertised-addr`,
    `--connect-url`, `--data-dir`, `--raft-addr`, `--seed-nodes`, `--join`) as
    `danube broker` takes them."""
    from danube.cli.main import main

    return main(["broker", *(sys.argv[1:] if argv is None else argv)])


def cli_main(argv=None):
    """`danube-cli`: upstream's client tool, its subcommands `produce`, `consume` and
    `schema` with their flags."""
    from danube.cli.consume import add_parser as add_consume
    from danube.cli.produce import add_parser as add_produce
    from danube.cli.schema import add_parser as add_schema

    parser = argparse.ArgumentParser(
        prog="danube-cli", description="A command-line tool to interact with Danube service")
    parser.add_argument("--version", action="version", version=f"danube-cli {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_produce(sub)
    add_consume(sub)
    add_schema(sub)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return args.func(args)


def admin_main(argv=None):
    from danube.cli.admin import main

    return main(argv)


def danube_main(argv=None):
    from danube.cli.main import main

    return main(argv)


#: Program name -> its main; any other name is the `danube` command.
PROGRAMS = {"danube-broker": broker_main, "danube-cli": cli_main,
            "danube-admin": admin_main}


def main_for(argv0):
    """The main of the program started as ``argv0`` (a path; a `.exe` suffix ignored)."""
    name = os.path.basename(argv0 or "")
    name = name[:-4] if name.endswith(".exe") else name
    return PROGRAMS.get(name, danube_main)
