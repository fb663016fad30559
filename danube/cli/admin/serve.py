"""`danube admin serve`, as upstream's `danube-admin serve`: --mode ui serves the web console
(danube.console) and upstream's /ui/v1 JSON API for its admin UI (danube.adminui), with
metrics from Prometheus (--prometheus-url); --mode mcp runs the MCP server
(danube.mcp_server) on standard input and output; --mode all both. The HTTP side listens on
127.0.0.1 unless told otherwise: it has write actions and no login."""

import argparse
import asyncio
import os
import sys

from danube.client.admin import ENDPOINT_ENV, endpoint_from_env

LISTEN_ENV = "DANUBE_ADMIN_LISTEN_ADDR"
MODE_ENV = "DANUBE_ADMIN_MODE"
MCP_CONFIG_ENV = "DANUBE_MCP_CONFIG"
DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_PROMETHEUS = "http://localhost:9090"


def add_parser(groups):
    p = groups.add_parser(
        "serve", aliases=["server"],      # upstream's alias
        help="run the web console, upstream's /ui/v1 API and MCP server",
        description="Serve the web console (dashboard, topics with live statistics, "
                    "subscriptions and their failure policies, schemas) and upstream "
                    "danube-admin's /ui/v1 JSON API for its admin UI (--mode ui, the "
                    "default), upstream's MCP server on standard input/output (--mode mcp), "
                    "or both (--mode all). The HTTP side has write actions and no "
                    "authentication, so it listens on 127.0.0.1 by default; expose it on "
                    "another address only behind something that authenticates.")
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
                   help=f"ui: the web console and the /ui/v1 API of upstream's admin UI; "
                        f"mcp: the MCP server on standard input/output; all: both (env "
                        f"{MODE_ENV}, default ui)")
    p.add_argument("--config", metavar="FILE",
                   help=f"MCP config file (env {MCP_CONFIG_ENV}): broker_endpoint, "
                        "prometheus_url and the deployment whose logs the log tools read")
    p.add_argument("--cors-allow-origin", metavar="ORIGIN[,ORIGIN]",
                   help="let pages from these origins use the JSON endpoints (/api/ reads; "
                        "/ui/v1 reads and actions; '*' for any origin on /ui/v1). Without "
                        "it /ui/v1 answers pages from localhost only")
    p.add_argument("--prometheus-url", metavar="URL", default=None,
                   help="the Prometheus HTTP API the /ui/v1 pages and the MCP metrics tools "
                        f"read (default {DEFAULT_PROMETHEUS}; in mcp mode the config file's "
                        "prometheus_url when this is not given)")
    p.add_argument("--metrics-timeout-ms", type=_positive, default=5000, metavar="MS",
                   help="deadline of each Prometheus query (default 5000)")
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
    if mode == "mcp":
        return run_mcp(args)
    return run_http(args, with_mcp=mode == "all")


def prometheus_queries(url, args):
    from danube.promql.client import PrometheusClient
    from danube.promql.queries import Queries
    return Queries(PrometheusClient(url or DEFAULT_PROMETHEUS,
                                    timeout=args.metrics_timeout_ms / 1000))


def mcp_setup(args, endpoint):
    """(McpConfig, Queries) for the MCP server, or raises ValueError/ImportError."""
    from danube.mcp_server.config import ConfigError, McpConfig
    path = args.config or os.environ.get(MCP_CONFIG_ENV)
    try:
        config = McpConfig.from_file(path) if path else McpConfig.minimal(endpoint)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return config, prometheus_queries(args.prometheus_url or config.prometheus_url, args)


def _mcp_missing():
    return _fail("--mode mcp needs the MCP Python SDK: pip install 'danube-broker-py[mcp]'", 2)


def run_mcp(args):
    import uvloop

    try:
        from danube.mcp_server.server import run_stdio
    except ImportError:
        return _mcp_missing()
    endpoint = broker_endpoint(args)
    try:
        config, queries = mcp_setup(args, endpoint)
        tls = tls_settings(args, config.broker_endpoint)
        admin = _admin_client(config.broker_endpoint, args, tls)
    except ValueError as exc:
        return _fail(str(exc), 2)
    print(f"danube admin MCP server on standard input/output (broker admin API "
          f"{config.broker_endpoint})", file=sys.stderr, flush=True)

    async def main():
        try:
            await run_stdio(admin, queries, config)
        finally:
            await admin.close()
    try:
        uvloop.run(main())
    except KeyboardInterrupt:
        pass
    return 0


def _admin_client(endpoint, args, tls):
    from danube.client import errors
    from danube.client.admin import AdminClient
    timeout = args.request_timeout_ms / 1000
    try:
        admin = AdminClient(endpoint, timeout=timeout, ssl=tls["ssl"], token=tls["token"],
                            connect_timeout=min(timeout, 5.0))
    except errors.DanubeError as exc:
        raise ValueError(str(exc)) from None
    if tls["server_hostname"]:
        admin.channel.server_hostname = tls["server_hostname"]
    return admin


def run_http(args, with_mcp=False):
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
        queries = prometheus_queries(args.prometheus_url, args)
    except ValueError as exc:
        return _fail(str(exc), 2)
    if with_mcp:
        try:
            from danube.mcp_server.server import run_stdio
        except ImportError:
            return _mcp_missing()
        try:
            mcp_config, mcp_queries = mcp_setup(args, endpoint)
        except ValueError as exc:
            return _fail(str(exc), 2)
    try:
        sock = server.bind(host, port)
    except OSError as exc:
        return _fail(f"cannot listen on {listen}: {exc.strerror or exc}", 1)

    from danube.adminui.app import with_ui_api
    from danube.adminui.state import UiState

    mcp = None

    def wrap(app, admin):
        if with_mcp:
            nonlocal mcp
            mcp = run_stdio(admin, mcp_queries, mcp_config)
        return with_ui_api(app, UiState(admin, queries, args.cache_ttl_ms / 1000),
                           args.cors_allow_origin)

    # with the MCP server on stdout, the console's lines go to stderr
    out = sys.stderr if with_mcp else sys.stdout

    def ready(url):
        print(f"danube admin console listening on {url} (broker admin API {endpoint}; "
              f"upstream's admin UI API at {url}ui/v1/)", file=out, flush=True)

    async def main():
        http = server.serve(sock, endpoint, request_timeout=args.request_timeout_ms / 1000,
                            cache_ttl=args.cache_ttl_ms / 1000,
                            cors_allow_origin=args.cors_allow_origin, on_ready=ready,
                            wrap_app=wrap, **tls)
        if not with_mcp:
            await http
            return
        # The HTTP side runs until a signal, the MCP server until its input ends (as
        # upstream, the HTTP side stays up after); a signal stops both.
        task = asyncio.ensure_future(http)
        while mcp is None and not task.done():
            await asyncio.sleep(0.01)
        mcp_task = asyncio.ensure_future(mcp) if mcp is not None else None
        await task
        if mcp_task is not None and not mcp_task.done():
            # The SDK reads standard input in a worker thread that no cancellation reaches
            # (the task would wait for a line that may never come): a stopped console ends
            # the process here, its HTTP side closed and the broker connection with it.
            print("danube admin console stopped", file=out, flush=True)
            os._exit(0)

    try:
        uvloop.run(main())
    except errors.DanubeError as exc:
        return _fail(str(exc), 2)
    finally:
        sock.close()
    print("danube admin console stopped", file=out, flush=True)
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
