"""Serving the console: a listening socket bound before the server starts (so port 0 works
and the URL printed is the real one), uvicorn on the running uvloop loop, and a clean stop on
Ctrl-C or SIGTERM."""

import asyncio
import contextlib
import signal
import socket
import sys
import threading

import uvicorn

from danube.client import errors
from danube.client.admin import AdminClient
from danube.console.app import build_app
from danube.console.backend import Backend


def parse_listen(text):
    """(host, port) from HOST:PORT, [IPv6]:PORT or :PORT (all interfaces)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def bind(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def url_of(sock):
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


async def serve(sock, endpoint, *, request_timeout, cache_ttl, cors_allow_origin=None,
                on_ready=None, ssl=None, server_hostname=None, token=None, wrap_app=None):
    """Serve the console on ``sock`` until a signal; ``on_ready(url)`` once it accepts.
    ``wrap_app(app, admin)`` may put other endpoints in front of the console (the UI API of
    danube.adminui), sharing its admin client."""
    admin = AdminClient(endpoint, timeout=request_timeout, ssl=ssl, token=token,
                        connect_timeout=min(request_timeout, 5.0))
    if server_hostname:
        admin.channel.server_hostname = server_hostname
    app = build_app(Backend(admin, cache_ttl), cors_allow_origin=cors_allow_origin)
    if wrap_app is not None:
        app = wrap_app(app, admin)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=3)
    server = _Server(config)
    probes = []

    def ready():
        if on_ready is not None:
            on_ready(url_of(sock))
        probes.append(asyncio.create_task(_probe(admin)))
    server.on_ready = ready
    try:
        await server.serve(sockets=[sock])
    finally:
        for task in probes:
            task.cancel()


async def _probe(admin):
    """One call at start-up, so a wrong --broker-endpoint shows in the terminal too, not
    only on the pages."""
    try:
        await admin.call("BrokerAdmin", "GetLeaderBroker", what="first contact")
    except errors.DanubeError as exc:
        print(f"danube admin serve: warning: the broker's admin API at {admin.endpoint} does "
              f"not answer yet ({exc}); the pages say so until it does",
              file=sys.stderr, flush=True)


class _Server(uvicorn.Server):
    on_ready = None

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn raises a caught SIGINT/SIGTERM again once it has shut down (a
        # KeyboardInterrupt traceback, or death by SIGTERM); a console stopped on purpose
        # exits with status 0 instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
