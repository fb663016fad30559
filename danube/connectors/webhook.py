"""source-webhook: HTTP POSTs -> Danube topics, path by path (upstream
danube-connectors/source-webhook: ``[server]``, ``[auth]``, ``[rate_limit]``, ``[[routes]]``).

A request is answered 200 only once the broker acknowledged its message, so a 2xx means
the event is stored; the sender retries anything else. Backpressure: 429 (with Retry-After)
when ``server.max_pending`` requests already wait for the broker or the rate limit is
exceeded, 503 when the broker is unreachable (upstream answers 200 as soon as the request
is queued, and a crash loses the queue). ``auth.type = "hmac"`` checks the signature of the
body (upstream leaves it a TODO); ``apikey`` compares a header with a secret; ``jwt``
checks a bearer token (HS256/384/512). Secrets come from the environment variable named
by ``auth.secret_env``, never from the file."""

import asyncio
import datetime
import hashlib
import hmac
import json
import logging
import os
import ssl
import time

from danube.connect import (ConfigError, Field, ProducerConfig, SourceConnector,
                            SourceRecord, Table, Tables)
from danube.connect.settings import topic_name
from danube.connectors._http1 import HttpServer

log = logging.getLogger("danube.connectors.webhook")

_HASHES = {"sha256": hashlib.sha256, "sha1": hashlib.sha1, "sha512": hashlib.sha512}


def _path(value):
    return None if value.startswith("/") and " " not in value else \
        f"{value!r} is not a URL path (/...)"


SERVER = {
    "host": Field(str, "0.0.0.0", env="WEBHOOK_HOST"),
    "port": Field(int, 8080, env="WEBHOOK_PORT", min=0, max=65535),
    "tls_cert_path": Field(str, None),
    "tls_key_path": Field(str, None),
    "timeout_seconds": Field(int, 30, min=1, max=3600),
    "max_body_size": Field(int, 1024 * 1024, min=1, max=64 * 1024 * 1024),
    # Ours: requests waiting for the broker before new ones get 429.
    "max_pending": Field(int, 10000, min=1, max=1_000_000),
}
AUTH = {
    "type": Field(str, "none", choices=("none", "apikey", "hmac", "jwt")),
    "secret_env": Field(str, None),
    "header": Field(str, None),
    "algorithm": Field(str, None),
}
RATE_LIMIT = {
    "requests_per_second": Field(int, 0, min=0),
    "burst_size": Field(int, 0, min=0),
    "per_ip_enabled": Field(bool, False, check=lambda v: "per-IP limits are not supported "
                            "(use a proxy in front)" if v else None),
    "per_ip_requests_per_second": Field(int, None),
}
ROUTE = {
    "from": Field(str, check=_path),
    "to": Field(str, check=topic_name),
    "partitions": Field(int, 0, min=0, max=1024),
    "reliable_dispatch": Field(bool, True),
}


class TokenBucket:
    def __init__(self, rate, burst):
        self.rate, self.capacity = rate, max(burst, rate, 1)
        self.tokens, self.at = float(self.capacity), time.monotonic()

    def take(self):
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class WebhookSource(SourceConnector):
    CONFIG = {"server": Table(SERVER), "auth": Table(AUTH), "rate_limit": Table(RATE_LIMIT),
              "routes": Tables(ROUTE, min_items=1)}

    def __init__(self, context):
        super().__init__(context)
        c = self.config
        self.routes = {}
        for route in c.routes:
            if getattr(route, "from") in self.routes:
                raise ConfigError(f"routes: path {getattr(route, 'from')!r} appears twice")
            self.routes[getattr(route, "from")] = route
        auth = c.auth
        self.secret = None
        if auth.type != "none":
            if not auth.secret_env:
                raise ConfigError(f"auth.secret_env: required for auth.type {auth.type!r} "
                                  f"(the environment variable holding the secret)")
            self.secret = os.environ.get(auth.secret_env)
            if not self.secret:
                raise ConfigError(f"auth.secret_env: environment variable {auth.secret_env} "
                                  f"is not set")
        if auth.type == "hmac" and (auth.algorithm or "sha256") not in _HASHES:
            raise ConfigError(f"auth.algorithm: {auth.algorithm!r} is not one of "
                              f"{', '.join(_HASHES)}")
        if auth.type == "jwt" and (auth.algorithm or "HS256") not in ("HS256", "HS384",
                                                                      "HS512"):
            raise ConfigError("auth.algorithm: jwt supports HS256, HS384 and HS512")
        if bool(c.server.tls_cert_path) != bool(c.server.tls_key_path):
            raise ConfigError("server.tls_key_path: TLS needs both tls_cert_path and "
                              "tls_key_path")
        rl = c.rate_limit
        self.bucket = TokenBucket(rl.requests_per_second, rl.burst_size) \
            if rl.requests_per_second else None
        self.queue = None
        self.server = None

    def producer_configs(self):
        return [ProducerConfig(r.to, r.partitions, r.reliable_dispatch)
                for r in self.routes.values()]

    async def initialize(self):
        s = self.config.server
        self.queue = asyncio.Queue(s.max_pending)
        from prometheus_client import Gauge
        metrics = self.context.metrics
        self.pending = Gauge("danube_connector_webhook_pending_requests",
                             "Requests waiting to be taken for publishing (429 at "
                             "server.max_pending)", ("connector",),
                             registry=metrics.registry).labels(metrics.connector)
        context = None
        if s.tls_cert_path:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                context.load_cert_chain(s.tls_cert_path, s.tls_key_path)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"server.tls_cert_path: cannot load: {exc}") from None
        self.server = HttpServer(self._handle, s.host, s.port, max_body=s.max_body_size,
                                 timeout=s.timeout_seconds, precheck=self._precheck)
        try:
            await self.server.start()
        except OSError as exc:
            raise ConfigError(f"server.port: cannot listen on {s.host}:{s.port}: "
                              f"{exc.strerror}") from None
        log.info("webhook server listening on http://%s:%d", s.host, self.server.port,
                 extra={"webhook_port": self.server.port})

    # -- HTTP ---------------------------------------------------------------------------

    def _precheck(self, method, path, headers):
        route = self.routes.get(path)
        if route is None:
            return 404, {}, json.dumps({"error": f"no route for {path}"}).encode()
        if method != "POST":
            return 405, {"Allow": "POST"}, b'{"error":"POST only"}'
        if self.bucket is not None and not self.bucket.take():
            return 429, {"Retry-After": "1"}, b'{"error":"rate limit exceeded"}'
        problems = self.context.health.problems()
        if "broker" in problems:
            return 503, {"Retry-After": "5"}, json.dumps(
                {"error": problems["broker"]}).encode()
        if self.queue.full():
            return 429, {"Retry-After": "1"}, b'{"error":"too many requests waiting for ' \
                                              b'the broker"}'
        return None

    def _authorized(self, request):
        auth = self.config.auth
        if auth.type == "none":
            return None
        if auth.type == "apikey":
            header = (auth.header or "x-api-key").lower()
            given = request.headers.get(header)
            if given is None:
                return f"missing {header} header"
            return None if hmac.compare_digest(given.encode(), self.secret.encode()) \
                else f"wrong {header}"
        if auth.type == "hmac":
            header = (auth.header or "x-signature").lower()
            given = request.headers.get(header)
            if given is None:
                return f"missing {header} header"
            if "=" in given:
                given = given.split("=", 1)[1]
            want = hmac.new(self.secret.encode(), request.body,
                            _HASHES[auth.algorithm or "sha256"]).hexdigest()
            return None if hmac.compare_digest(given.strip().lower(), want) \
                else "signature does not match the body"
        import jwt
        value = request.headers.get("authorization", "")
        if not value.startswith("Bearer "):
            return "missing Authorization: Bearer header"
        try:
            jwt.decode(value[7:], self.secret, algorithms=[auth.algorithm or "HS256"])
        except jwt.PyJWTError as exc:
            return f"invalid token: {exc}"
        return None

    async def _handle(self, request):
        route = self.routes[request.path]
        problem = self._authorized(request)
        if problem:
            self.context.metrics.error("webhook_unauthorized")
            return 401, {}, json.dumps({"error": problem}).encode()
        ctype = request.headers.get("content-type", "")
        if "json" not in ctype:
            return 415, {}, b'{"error":"Content-Type must be application/json"}'
        try:
            json.loads(request.body)
        except ValueError as exc:
            return 400, {}, json.dumps({"error": f"invalid JSON: {exc}"}).encode()
        attributes = {"webhook.source": self.core.connector_name,
                      "webhook.endpoint": request.path,
                      "webhook.timestamp": datetime.datetime.now(datetime.timezone.utc)
                      .isoformat(), "webhook.ip": request.peer,
                      "webhook.content_type": ctype}
        if "user-agent" in request.headers:
            attributes["webhook.user_agent"] = request.headers["user-agent"]
        done = asyncio.get_running_loop().create_future()
        record = SourceRecord(route.to, request.body, attributes, token=done)
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            return 429, {"Retry-After": "1"}, b'{"error":"too many requests waiting"}'
        self.pending.set(self.queue.qsize())
        try:
            await asyncio.wait_for(asyncio.shield(done), self.config.server.timeout_seconds)
        except asyncio.TimeoutError:
            return 503, {"Retry-After": "5"}, \
                b'{"error":"the broker did not acknowledge in time; retry"}'
        if record.rejected:
            return 422, {}, json.dumps({"error": record.rejected}).encode()
        if done.result() is not True:
            return 503, {"Retry-After": "5"}, json.dumps({"error": done.result()}).encode()
        return 200, {}, json.dumps({"status": "accepted", "endpoint": request.path,
                                    "topic": route.to}).encode()

    # -- the connector ------------------------------------------------------------------

    async def poll(self, max_records):
        queue = self.queue
        if queue.empty():
            try:
                first = await asyncio.wait_for(
                    queue.get(), self.core.processing.poll_interval_ms / 1000.0)
            except asyncio.TimeoutError:
                return []
            records = [first]
        else:
            records = []
        while len(records) < max_records and not queue.empty():
            records.append(queue.get_nowait())
        self.pending.set(queue.qsize())
        return records

    async def commit(self, records):
        for record in records:
            if not record.token.done():
                record.token.set_result(True)

    async def shutdown(self):
        # Requests queued but never published: their senders get 503 and retry.
        while self.queue is not None and not self.queue.empty():
            record = self.queue.get_nowait()
            if not record.token.done():
                record.token.set_result("the connector is stopping")
        if self.server is not None:
            await self.server.close()
