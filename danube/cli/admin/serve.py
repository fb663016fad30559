"""`danube admin serve`: the web console (danube.console) over the admin API, as upstream's
`danube-admin serve --mode ui`. It listens on 127.0.0.1 unless told otherwise: the console
has write actions (create topic, unsubscribe, set a failure policy) and no login."""

import argparse
import os
import sys

from danube.client.admin import ENDPOINT_ENV, endpoint_from_env

LISTEN_ENV = "DANUBE_ADMIN_LISTEN_ADDR"
MODE_ENV = "DANUBE_ADMIN_MODE"
DEFAULT_LISTEN = "127.0.0.1:8080"


def add_parser(groups):
    p = groups.add_parser(
        "serve", help="run the web console",
        description="Serve the web console: dashboard, topics with live statistics, "
                    "subscriptions and their failure policies, schemas. It has write "
                    "actions and no authentication, so it listens on 127.0.0.1 by default; "
                    "expose it on another address only behind something that authenticates.")
    p.add_argument("--listen", "--listen-addr", dest="listen", metavar="HOST:PORT",
                   default=None,
                   help=f"address to serve on (env {LISTEN_ENV}, default {DEFAULT_LISTEN}; "
                        "port 0 picks a free one)")
    p.add_argument("--broker-endpoint", metavar="URL",
                   help=f"the broker's admin API (overrides --endpoint and {ENDPOINT_ENV})")
    p.add_argument("--request-timeout-ms", type=_positive, default=5000, metavar="MS",
                   help="deadline of each call to the broker (default 5000)")
    p.add_argument("--cache-ttl-ms", type=_non_negative, default=3000, metavar="MS",
                   help="how long list answers (topics, namespaces, brokers, subjects) are "
                        "reused (default 3000; 0: never)")
    p.add_argument("--mode", default=None, metavar="ui|mcp|all",
                   help=f"what to serve (env {MODE_ENV}, default ui); only ui is built")
    p.add_argument("--cors-allow-origin", metavar="ORIGIN",
                   help="let pages from this origin read the /api/ JSON endpoints")
    tls = p.add_argument_group(
        "TLS to the broker", "as upstream's serve; each falls back to the environment "
        "`danube admin` reads (DANUBE_ADMIN_TLS, _DOMAIN, _CA, _CERT, _KEY; the token from "
        "DANUBE_ADMIN_TOKEN or DANUBE_ADMIN_API_KEY). An https:// endpoint turns TLS on")
    tls.add_argument("--grpc-enable-tls", nargs="?", const="true", metavar="true|false",
                     help="TLS to the broker's admin API")
    tls.add_argument("--grpc-domain", metavar="NAME",
                     help="the name the broker's certificate is checked for (default "
                          "localhost)")
    tls.add_argument("--grpc-ca", metavar="FILE", help="CA bundle for the broker's certificate")
    tls.add_argument("--grpc-cert", metavar="FILE", help="client certificate (mTLS)")
    tls.add_argument("--grpc-key", metavar="FILE", help="client key (mTLS)")
    p.set_defaults(func=run)


def _positive(text):
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


def _non_negative(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must not be negative")
    return value


def run(args):
    mode = (args.mode or os.environ.get(MODE_ENV) or "ui").lower()
    if mode not in ("ui", "mcp", "all"):
        return _fail(f"--mode {mode!r}: use ui, mcp or all", 2)
    if mode != "ui":
        return _fail(f"--mode {mode}: the MCP server is not available in this build; "
                     "use --mode ui (the web console)", 2)

    import uvloop

    from danube.client import errors
    from danube.console import server

    listen = args.listen or os.environ.get(LISTEN_ENV) or DEFAULT_LISTEN
    try:
        host, port = server.parse_listen(listen)
    except ValueError as exc:
        return _fail(str(exc), 2)
    endpoint = broker_endpoint(args)
    try:
        tls = tls_settings(args, endpoint)
    except ValueError as exc:
        return _fail(str(exc), 2)
    try:
        sock = server.bind(host, port)
    except OSError as exc:
        return _fail(f"cannot listen on {listen}: {exc.strerror or exc}", 1)

    def ready(url):
        print(f"danube admin console listening on {url} (broker admin API {endpoint})",
              flush=True)

    try:
        uvloop.run(server.serve(sock, endpoint, request_timeout=args.request_timeout_ms / 1000,
                                cache_ttl=args.cache_ttl_ms / 1000,
                                cors_allow_origin=args.cors_allow_origin, on_ready=ready,
                                **tls))
    except errors.DanubeError as exc:
        return _fail(str(exc), 2)
    finally:
        sock.close()
    print("danube admin console stopped", flush=True)
    return 0


def broker_endpoint(args):
    """--broker-endpoint, else the admin command's --endpoint, else the environment."""
    return endpoint_from_env(args.broker_endpoint or getattr(args, "endpoint", None))


def tls_settings(args, endpoint):
    """{ssl, server_hostname, token} for the AdminClient: the --grpc-* flags, else upstream's
    DANUBE_ADMIN_* environment."""
    env = os.environ
    token = env.get("DANUBE_ADMIN_TOKEN") or env.get("DANUBE_ADMIN_API_KEY") or None
    enabled = (args.grpc_enable_tls or env.get("DANUBE_ADMIN_TLS") or "").lower()
    if enabled not in ("", "true", "false"):
        raise ValueError(f"--grpc-enable-tls {enabled!r}: true or false")
    if not (endpoint.startswith("https://") or enabled == "true"):
        return {"ssl": None, "server_hostname": None, "token": token}
    files = {}
    for flag, name in (("grpc_ca", "DANUBE_ADMIN_CA"), ("grpc_cert", "DANUBE_ADMIN_CERT"),
                       ("grpc_key", "DANUBE_ADMIN_KEY")):
        path = getattr(args, flag) or env.get(name)
        if path and not os.path.isfile(path):
            raise ValueError(f"--{flag.replace('_', '-')} ({name}): no such file: {path}")
        files[flag] = path or None
    if bool(files["grpc_cert"]) != bool(files["grpc_key"]):
        raise ValueError("--grpc-cert and --grpc-key go together (mTLS)")
    from danube.rpc.client import client_ssl_context
    try:
        ssl = client_ssl_context(ca_file=files["grpc_ca"], cert_file=files["grpc_cert"],
                                 key_file=files["grpc_key"])
    except OSError as exc:
        raise ValueError(f"TLS files: {exc}") from None
    domain = args.grpc_domain or env.get("DANUBE_ADMIN_DOMAIN") or "localhost"
    return {"ssl": ssl, "server_hostname": domain, "token": token}


def _fail(message, status):
    print(f"danube admin serve: {message}", file=sys.stderr)
    return status
