"""etcd's user/password authentication on its JSON gateway, which ``etcd3gw`` does not do.

With authentication enabled (``etcdctl auth enable``) every request carries a token in its
``Authorization`` header, obtained from ``/v3/auth/authenticate``. etcd forgets a simple token
after ``--auth-token-ttl`` seconds without use (and at a restart), and then answers
UNAUTHENTICATED: the token is dropped and the request sent once more with a new one. One
token serves every thread and watch of a connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from danube.metadata.errors import MetadataError

#: gRPC's UNAUTHENTICATED, as etcd's gateway reports a token it does not know.
UNAUTHENTICATED = 16


class TokenRejected(Exception):
    """etcd did not accept the token a request carried."""


class EtcdAuth:
    def __init__(self, user: str, password: str):
        self.user = user
        self.password = password
        self._token: str | None = None
        self._lock = threading.Lock()
        self.tokens_total = 0           # tokens fetched: the first, then one per expiry

    def token(self, authenticate: Callable[[dict], dict]) -> str:
        """The current token; ``authenticate(body)`` (a call to auth/authenticate) fetches
        one when there is none. Refused credentials raise a MetadataError naming the user."""
        with self._lock:
            if self._token is None:
                try:
                    answer = authenticate({"name": self.user, "password": self.password})
                except MetadataError as exc:
                    raise MetadataError(f"etcd refused the credentials of user {self.user!r} "
                                        f"(meta_store.etcd_auth): {exc}") from None
                token = answer.get("token") if isinstance(answer, dict) else None
                if not token:
                    raise MetadataError("etcd answered auth/authenticate without a token: is "
                                        "authentication enabled (etcdctl auth enable)?")
                self._token = token
                self.tokens_total += 1
            return self._token

    def rejected(self, token: str) -> None:
        """``token`` was refused: the next request authenticates again (unless another
        thread already has)."""
        with self._lock:
            if self._token == token:
                self._token = None


def with_token(auth: EtcdAuth | None, send: Callable, authenticate: Callable):
    """``send(token)`` with the current token (None without authentication), and once more
    with a new token if etcd rejected it."""
    if auth is None:
        return send(None)
    token = auth.token(authenticate)
    try:
        return send(token)
    except TokenRejected:
        auth.rejected(token)
    token = auth.token(authenticate)
    try:
        return send(token)
    except TokenRejected as exc:
        auth.rejected(token)
        raise MetadataError(f"etcd rejected a new token of user {auth.user!r}: {exc}") from None
