"""Calls to etcd's v3 JSON gateway through ``etcd3gw``, off the event loop, with retries.

etcd3gw is synchronous (``requests`` underneath), so every call runs in a small thread pool
and the loop only awaits its future. Each worker thread has its own etcd3gw client, because
a ``requests.Session`` is not meant to be shared between threads.

What is retried: a call that never reached etcd (connection refused, connect timeout) is
always safe to send again, to the next endpoint, with exponential backoff, until
``retry_for`` seconds have passed. A call that may have reached etcd (the connection broke
mid-request, a read timeout, etcd answering UNAVAILABLE while it has no leader) is retried
only when the caller says it is idempotent; otherwise it surfaces at once as
``MetadataUnavailable`` ("may or may not have been applied", as the store contract says).
Every failure and retry is counted, and ``available`` tells health and metrics whether the
last call got through.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import http.client
import logging
import ssl
import threading
import time
from typing import Any

import etcd3gw
import requests
import urllib3

from danube.metadata._etcd_auth import UNAUTHENTICATED, EtcdAuth, TokenRejected, with_token
from danube.metadata.errors import MetadataError, MetadataUnavailable

log = logging.getLogger("danube.metadata.etcd")

#: gRPC status codes etcd's gateway answers with when the call can be tried again.
_RETRYABLE_CODES = {4, 14}          # DEADLINE_EXCEEDED, UNAVAILABLE
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0
WORKERS = 8


def b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def unb64(data: str | None) -> str:
    return "" if not data else base64.b64decode(data).decode("utf-8")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (optionally ``http://`` or ``https://host:port``) into its parts, or a
    clear ValueError."""
    text = endpoint.strip()
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme not in ("http", "https"):
            raise ValueError(f"etcd endpoint {endpoint!r}: expected http:// or https://")
    host, sep, port = text.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def endpoints_scheme(endpoints: list[str], tls) -> str:
    """"https" or "http" for all the endpoints: the scheme they name, else https with
    ``tls`` (``meta_store.etcd_tls``) and http without."""
    schemes = {e.strip().split("://", 1)[0] for e in endpoints if "://" in e}
    if len(schemes) > 1:
        raise ValueError(f"etcd endpoints {endpoints}: mix http:// and https://")
    scheme = schemes.pop() if schemes else ("https" if tls is not None else "http")
    if scheme == "http" and tls is not None:
        raise ValueError(f"etcd endpoints {endpoints} are http:// but meta_store.etcd_tls is "
                         "set: use https:// (or no scheme)")
    return scheme


class _NotSent(Exception):
    """The request never reached etcd."""


class _Ambiguous(Exception):
    """The request may have reached etcd; whether it was applied is unknown."""


class EtcdConnection:
    """The endpoints of one etcd cluster and the thread pool that talks to them."""

    def __init__(self, endpoints: list[str], *, timeout: float = 5.0, retry_for: float = 10.0,
                 tls=None, auth: tuple[str, str] | None = None):
        """``tls``: an object with ``ca_file``, ``cert_file``, ``key_file`` (each may be
        None), for https; None for http, unless the endpoints say https://. ``auth``:
        (user, password) for an etcd with authentication enabled."""
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint (host:port)")
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self.scheme = endpoints_scheme(endpoints, tls)
        self.tls = tls
        self.auth = EtcdAuth(*auth) if auth is not None else None
        self._ssl_context: ssl.SSLContext | None = None
        self.timeout = timeout
        self.retry_for = retry_for
        self._current = 0
        self._local = threading.local()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=WORKERS, thread_name_prefix="etcd")
        self.available = True
        self.failures_total = 0
        self.retries_total = 0
        self.last_error = ""

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.endpoints[self._current % len(self.endpoints)]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def call(self, path: str, body: dict, *, idempotent: bool = True) -> dict:
        """POST ``body`` to ``/v3/<path>`` and return the decoded answer."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.retry_for
        backoff = FIRST_BACKOFF
        while True:
            endpoint = self.endpoint
            try:
                answer = await loop.run_in_executor(self._executor, self._post, endpoint,
                                                    path, body)
            except RuntimeError as exc:     # the pool was shut down by close()
                raise MetadataUnavailable(f"etcd connection closed: {exc}") from None
            except (_NotSent, _Ambiguous) as exc:
                self.failures_total += 1
                self.available = False
                self.last_error = f"{endpoint[0]}:{endpoint[1]}: {exc}"
                if isinstance(exc, _NotSent):
                    self._current += 1      # another endpoint may be up
                elif not idempotent:
                    raise MetadataUnavailable(
                        f"etcd call {path} failed and may or may not have been applied: "
                        f"{exc}") from None
                if time.monotonic() + backoff > deadline:
                    raise MetadataUnavailable(
                        f"etcd unreachable for {self.retry_for:g}s: {self.last_error}") from None
                self.retries_total += 1
                log.warning("etcd call %s failed (%s); retrying in %.2fs", path, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
                continue
            if not self.available:
                log.info("etcd reachable again at %s:%d", *endpoint)
            self.available = True
            return answer

    def _client(self, endpoint: tuple[str, int]) -> etcd3gw.Etcd3Client:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(endpoint)
        if client is None:
            # The API path is fixed: etcd >= 3.4 serves /v3/, and discovering it would cost
            # a request per thread.
            tls = self.tls
            client = clients[endpoint] = etcd3gw.Etcd3Client(
                host=endpoint[0], port=endpoint[1], protocol=self.scheme,
                ca_cert=tls and tls.ca_file, cert_cert=tls and tls.cert_file,
                cert_key=tls and tls.key_file, timeout=self.timeout, api_path="/v3/")
            # Proxies, .netrc and CA bundles from the environment are not for etcd (the
            # watch streams, on http.client, never used them either), and looking them up
            # was a fifth of the CPU of every call: a cluster broker makes several a second.
            client.session.trust_env = False
        return client

    def open_stream(self, endpoint: tuple[str, int]) -> http.client.HTTPConnection:
        """An HTTP(S) connection to ``endpoint`` for a watch stream."""
        if self.scheme == "http":
            return http.client.HTTPConnection(endpoint[0], endpoint[1], timeout=self.timeout)
        if self._ssl_context is None:
            tls = self.tls
            context = ssl.create_default_context(cafile=tls and tls.ca_file)
            if tls is not None and tls.cert_file:
                context.load_cert_chain(tls.cert_file, tls.key_file)
            self._ssl_context = context
        return http.client.HTTPSConnection(endpoint[0], endpoint[1], timeout=self.timeout,
                                           context=self._ssl_context)

    def _post(self, endpoint: tuple[str, int], path: str, body: dict) -> dict:
        """In a worker thread: one request, with a token if etcd wants one."""
        return with_token(self.auth, lambda token: self._send(endpoint, path, body, token),
                          lambda creds: self._send(endpoint, "auth/authenticate", creds))

    def stream_token(self, endpoint: tuple[str, int]) -> str | None:
        """In a watch thread: the token for a new stream (None without authentication);
        a failure to get one is an OSError, which the stream retries."""
        if self.auth is None:
            return None
        try:
            return self.auth.token(
                lambda creds: self._send(endpoint, "auth/authenticate", creds))
        except (_NotSent, _Ambiguous, MetadataError) as exc:
            raise ConnectionError(f"no etcd token: {exc}") from None

    def _send(self, endpoint: tuple[str, int], path: str, body: dict,
              token: str | None = None) -> dict:
        """One HTTP request, its failure classified."""
        client = self._client(endpoint)
        headers = {"Authorization": token} if token else None
        try:
            resp = client.session.post(client.get_url(path), json=body, timeout=self.timeout,
                                       headers=headers,
                                       verify=(self.tls and self.tls.ca_file) or True)
        except requests.exceptions.ConnectTimeout as exc:
            raise _NotSent(f"connect timeout: {exc}") from None
        except requests.exceptions.SSLError as exc:
            # A certificate etcd or this broker refuses: trying again changes nothing.
            raise MetadataUnavailable(f"TLS to etcd at {endpoint[0]}:{endpoint[1]} failed: "
                                      f"{exc}") from None
        except requests.exceptions.ConnectionError as exc:
            reason = exc.args[0] if exc.args else None
            if isinstance(reason, urllib3.exceptions.MaxRetryError) and isinstance(
                    reason.reason, urllib3.exceptions.NewConnectionError):
                raise _NotSent("connection refused") from None
            raise _Ambiguous(f"connection lost: {exc}") from None
        except requests.exceptions.RequestException as exc:
            raise _Ambiguous(f"request failed: {exc}") from None
        try:
            answer = resp.json()
        except ValueError:
            answer = {"message": resp.text[:200]}
        if resp.status_code == 200:
            return answer
        code = answer.get("code") if isinstance(answer, dict) else None
        message = answer.get("message") or answer.get("error") or resp.reason
        if code in _RETRYABLE_CODES or resp.status_code in (502, 503, 504):
            raise _Ambiguous(f"etcd unavailable: {message}")
        if token and code == UNAUTHENTICATED:
            raise TokenRejected(message)
        if "user name is empty" in str(message):
            message = f"{message} (etcd wants a user: set meta_store.etcd_auth)"
        raise MetadataError(f"etcd refused {path}: {message}")

    def stream_target(self) -> tuple[str, int]:
        """The endpoint a new watch stream should connect to."""
        return self.endpoint

    def stream_failed(self, endpoint: tuple[str, int], exc: BaseException) -> None:
        """A watch stream lost ``endpoint``: count it and move on to the next endpoint."""
        self.failures_total += 1
        self.last_error = f"{endpoint[0]}:{endpoint[1]}: watch stream: {exc}"
        if self.endpoint == endpoint:
            self._current += 1
