"""Admin calls about a topic another broker of the cluster serves, forwarded to that broker.

Calls that need a topic's live state (its subscriptions, dispatchers, statistics) can only be
answered by the broker serving it. Rather than have the caller find that broker, the broker
asked sends the same request on to the owner's admin port and returns its answer (or its
error status). One hop only: a forwarded call carries ``x-danube-forwarded-by``, and a broker
that receives one for a topic it does not serve (it moved meanwhile) answers UNAVAILABLE
naming the owner, as without forwarding. The caller's ``authorization`` goes along, so the
owner authorizes the caller, not the forwarding broker.

When the admin ports serve TLS (``admin_tls``), the forwarding broker checks the owner's
certificate against ``auth.tls.ca_file`` (the system's CAs without one) and, when the ports
ask for client certificates (``auth.tls.require_client_cert``), presents its own. An owner
registered with a wildcard admin host (``--admin-addr 0.0.0.0:50051``) is reached on the
host of its advertised broker URL. Not forwarded: when the topic has no owner yet.
"""

from __future__ import annotations

import functools
import logging

from danube.broker.errors import TopicElsewhere
from danube.rpc.client import Channel, client_ssl_context
from danube.rpc.status import RpcError, StatusCode
from danube.rpc.target import parse_target

log = logging.getLogger("danube.admin")

FORWARDED_BY = "x-danube-forwarded-by"
#: The longest a forwarded call may take (less if the caller's deadline is nearer).
FORWARD_TIMEOUT = 10.0
CONNECT_TIMEOUT = 3.0


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def _target(core, exc: TopicElsewhere, context) -> str | None:
    """The owner's admin address to forward to, or None to answer ``exc`` as it is."""
    addr = getattr(exc, "admin_addr", None)
    if not addr or not core.placement.spans_brokers:
        return None
    if any(key == FORWARDED_BY for key, _ in context.invocation_metadata()):
        return None
    try:
        host, port, secure = parse_target(addr)
        if host in WILDCARD_HOSTS:
            host = parse_target(getattr(exc, "broker_url", None) or "")[0]
    except ValueError:
        return None                 # nothing to reach it by: answer where it is
    scheme = "https" if secure else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _tls(cfg):
    """The client side of TLS to another broker's admin port, from this broker's own TLS
    files. Made per call (forwarded calls are rare), so reloaded files count at once."""
    mutual = cfg.tls_require_client_cert
    return client_ssl_context(ca_file=cfg.tls_ca_file,
                              cert_file=cfg.tls_cert_file if mutual else None,
                              key_file=cfg.tls_key_file if mutual else None)


async def _forward(core, addr, path, request, response_type, context):
    metadata = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]
    metadata.append((FORWARDED_BY, str(core.broker_id)))
    remaining = context.time_remaining()
    timeout = FORWARD_TIMEOUT if remaining is None else min(FORWARD_TIMEOUT, remaining)
    try:
        ssl = _tls(core.cfg) if addr.startswith("https://") else None
    except (OSError, ValueError) as exc:       # ssl.SSLError is an OSError
        raise RpcError(StatusCode.UNAVAILABLE, f"TLS to {addr}: {exc}") from None
    channel = Channel(addr, ssl=ssl, connect_timeout=CONNECT_TIMEOUT)
    try:
        call = channel.unary_unary(path, lambda m: m.SerializeToString(),
                                   response_type.FromString)
        return await call(request, timeout=timeout, metadata=metadata)
    finally:
        await channel.close()


def forwarded(response_type):
    """Decorator (inside ``maps_errors``) for an admin method of a service with ``.core``:
    a TopicElsewhere naming the owner's admin port becomes the owner's own answer."""
    def wrap(fn):
        @functools.wraps(fn)
        async def method(self, request, context):
            try:
                return await fn(self, request, context)
            except TopicElsewhere as exc:
                addr = _target(self.core, exc, context)
                if addr is None:
                    raise
                path = context.method.name
                try:
                    return await _forward(self.core, addr, path, request, response_type,
                                          context)
                except RpcError as failure:
                    if failure.code not in (StatusCode.UNAVAILABLE,
                                            StatusCode.DEADLINE_EXCEEDED):
                        raise               # the owner's answer
                    log.warning("forwarding %s to %s failed: %s", path, addr, failure)
                    raise TopicElsewhere(f"{exc} (forwarding failed: {failure.details})") \
                        from None
        return method
    return wrap
