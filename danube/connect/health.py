"""The connector's HTTP endpoint on ``processing.metrics_host:metrics_port``:
``/metrics`` (Prometheus), ``/health/live`` (200 while the process and its event loop run)
and ``/health/ready`` (200 when the broker and the external system were reachable on the
last try, else 503 with the reason). A small HTTP/1.1 server of its own: a request line and
headers of at most 8 KiB, one request per connection, so no peer can hold memory."""

import asyncio
import json
import logging

log = logging.getLogger("danube.connect.health")

MAX_HEAD = 8192
READ_TIMEOUT = 10.0


class Health:
    """What ready means: every named condition is ok."""

    def __init__(self, metrics):
        self.metrics = metrics
        self._problems = {"starting": "the connector is starting"}
        self._update()

    def set(self, what, problem=None):
        if problem is None:
            self._problems.pop(what, None)
        else:
            self._problems[what] = problem
        self._update()

    @property
    def ready(self):
        return not self._problems

    def problems(self):
        return dict(self._problems)

    def _update(self):
        self.metrics.health.labels(self.metrics.connector).set(1 if self.ready else 0)


class HealthServer:
    def __init__(self, health, host, port):
        self.health = health
        self.host = host
        self.port = port
        self._server = None

    async def start(self):
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("connector metrics and health listening on http://%s:%d", self.host,
                 self.port, extra={"metrics_port": self.port})
        return self

    async def close(self):
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            method, path = self._request_line(head)
            status, ctype, body = self._answer(method, path)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        except (asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        try:
            writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % (status, _REASONS[status].encode(),
                                                         ctype.encode(), len(body)) + body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    @staticmethod
    def _request_line(head):
        first = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(first) != 3:
            raise ValueError("request line")
        return first[0], first[1].split("?", 1)[0]

    def _answer(self, method, path):
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.health.metrics.render()
        if path in ("/health", "/health/live"):
            return 200, "application/json", b'{"status":"live"}\n'
        if path == "/health/ready":
            if self.health.ready:
                return 200, "application/json", b'{"status":"ready"}\n'
            return 503, "application/json", json.dumps(
                {"status": "not ready", "problems": self.health.problems()}).encode() + b"\n"
        return 404, "text/plain", b"not found\n"


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}
