"""What every `danube admin` group shares: the global --endpoint (accepted before or after the
group and subcommand, as upstream's clap `global = true` flag), --output json, upstream's
topic-name rule, and running one command against the admin port so that a failure is one
line on stderr and exit status 1, never a traceback."""

import argparse
import asyncio
import functools
import os
import sys

from danube.client.admin import DEFAULT_ENDPOINT, ENDPOINT_ENV

PROG = "danube admin"
ENV_NOTE = (f"env:\n  {ENDPOINT_ENV} (default {DEFAULT_ENDPOINT})\n"
            "  DANUBE_ADMIN_TOKEN, DANUBE_ADMIN_TLS, DANUBE_ADMIN_DOMAIN, DANUBE_ADMIN_CA, "
            "DANUBE_ADMIN_CERT, DANUBE_ADMIN_KEY")


class CommandError(Exception):
    """A problem found before or after the call (bad topic name, missing --confirm, a
    response without the expected part): exit status 1, as upstream's anyhow errors."""

    exit_status = 1


class UsageError(CommandError):
    """A combination of flags argparse cannot express (clap's `requires`): exit status 2."""

    exit_status = 2


def _whole(bits):
    top = 2 ** bits - 1

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not 0 <= value <= top:
            raise argparse.ArgumentTypeError(f"{value} is out of range (0 to {top})")
        return value

    parse.__name__ = f"u{bits}"
    return parse


# argparse types for upstream's unsigned flags
u32 = _whole(32)
u64 = _whole(64)


def add_endpoint(parser):
    # SUPPRESS: a level that was not given the flag leaves the value of an outer level alone.
    parser.add_argument("--endpoint", default=argparse.SUPPRESS, metavar="URL",
                        help=f"admin API URL (env {ENDPOINT_ENV}, default {DEFAULT_ENDPOINT})")


def add_group(groups, name, help, examples=""):
    p = groups.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                          epilog=_epilog(examples),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    add_endpoint(p)
    return p.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def add_command(cmds, name, handler, help, examples="", aliases=()):
    p = cmds.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".",
                        epilog=_epilog(examples), aliases=list(aliases),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_endpoint(p)
    p.set_defaults(func=functools.partial(run, handler))
    return p


def add_output(parser, default="table"):
    parser.add_argument("--output", choices=("json",),
                        help=f"output format: json (default: {default})")


def _epilog(examples):
    return f"examples:\n{examples.rstrip()}\n\n{ENV_NOTE}" if examples else ENV_NOTE


def normalize_topic(name, namespace=None):
    """upstream's rule: "/ns/topic" as it is; "ns/topic" gets its leading slash; a bare
    "topic" takes --namespace."""
    text = name.strip()
    if text.startswith("/"):
        parts = text.split("/")
        if len(parts) == 3 and all(part and _name_chars(part) for part in parts[1:]):
            return text
        raise CommandError(f"wrong topic format {text!r}, should be /namespace/topic")
    parts = text.split("/")
    if len(parts) == 2:
        return "/" + text
    if len(parts) == 1:
        if not namespace:
            raise CommandError(f"missing --namespace for topic {text!r} without namespace")
        return f"/{namespace}/{text}"
    raise CommandError(f"wrong topic format {text!r}, should be /namespace/topic")


def _name_chars(part):
    return all(c.isalnum() or c in "_-" for c in part)


def add_topic(parser):
    parser.add_argument("topic", help="topic name: '/ns/topic', or 'topic' with --namespace")
    parser.add_argument("--namespace", help="namespace of a topic given without one")


def run(handler, args):
    """Run ``await handler(admin, args)`` with an AdminClient on the chosen endpoint."""
    from danube.client.errors import DanubeError

    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")
    try:
        return asyncio.run(_call(handler, args)) or 0
    except (DanubeError, CommandError) as exc:
        return fail(exc, getattr(exc, "exit_status", 1))
    except BrokenPipeError:
        # the reader (`| head`) left: no message, and none when Python flushes at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        what = f"cannot read {exc.filename}" if exc.filename else "I/O error"
        return fail(f"{what}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130


async def _call(handler, args):
    from danube.client.admin import AdminClient, endpoint_from_env

    endpoint = endpoint_from_env(getattr(args, "endpoint", None))
    ssl, domain = _tls(endpoint)
    token = os.environ.get("DANUBE_ADMIN_TOKEN") or os.environ.get("DANUBE_ADMIN_API_KEY")
    async with AdminClient(endpoint, ssl=ssl, token=token) as admin:
        if ssl is not None:
            # upstream verifies the broker's certificate for this name, "localhost" unless set
            admin.channel.server_hostname = domain
        return await handler(admin, args)


def _tls(endpoint):
    """upstream's TLS settings: on for https:// or DANUBE_ADMIN_TLS=true; DANUBE_ADMIN_CA,
    DANUBE_ADMIN_CERT with DANUBE_ADMIN_KEY (mTLS) and DANUBE_ADMIN_DOMAIN."""
    from danube.rpc.client import client_ssl_context

    env = os.environ
    if not (endpoint.startswith("https://") or env.get("DANUBE_ADMIN_TLS") == "true"):
        return None, None
    for name in ("DANUBE_ADMIN_CA", "DANUBE_ADMIN_CERT", "DANUBE_ADMIN_KEY"):
        if env.get(name) and not os.path.isfile(env[name]):
            raise CommandError(f"{name}: no such file: {env[name]}")
    cert, key = env.get("DANUBE_ADMIN_CERT"), env.get("DANUBE_ADMIN_KEY")
    ssl = client_ssl_context(ca_file=env.get("DANUBE_ADMIN_CA") or None,
                             cert_file=cert if cert and key else None,
                             key_file=key if cert and key else None)
    return ssl, env.get("DANUBE_ADMIN_DOMAIN") or "localhost"


def fail(message, status=1):
    text = " ".join(str(message).split())   # one line, whatever the server's message holds
    print(f"{PROG}: error: {text}", file=sys.stderr)
    sys.stderr.flush()
    return status
