"""Admin calls about a topic another broker of the cluster serves, forwarded to that broker.

Calls that need a topic's live state (its subscriptions, dispatchers, statistics) can only be
answered by the broker serving it. Rather than have the caller find that broker, the broker
asked sends the same request on to the owner's admin port and returns its answer (or its
error status). One hop only: a forwarded call carries ``x-danube-forwarded-by``, and a broker
that receives one for a topic it does not serve (it moved meanwhile) answers UNAVAILABLE
naming the owner, as without forwarding. The caller's ``authorization`` goes along, so the
owner authorizes the caller, not the forwarding broker.

Not forwarded: when the admin port serves TLS (``admin_tls``: the owner's certificate would
need a client side this broker does not configure), and when the topic has no owner yet.
"""

from __future__ import annotations

import functools
import logging

from danube.broker.errors import TopicElsewhere
from danube.rpc.client import Channel
from danube.rpc.status import RpcError, StatusCode

log = logging.getLogger("danube.admin")

FORWARDED_BY = "x-danube-forwarded-by"
#: The longest a forwarded call may take (less if the caller's deadline is nearer).
FORWARD_TIMEOUT = 10.0
CONNECT_TIMEOUT = 3.0


def _target(core, exc: TopicElsewhere, context) -> str | None:
    """The owner's admin address to forward to, or None to answer ``exc`` as it is."""
    addr = getattr(exc, "admin_addr", None)
    if not addr or core.cluster is None or (core.cfg.admin_tls and
                                            core.cfg.auth_mode == "tls"):
        return None
    if any(key == FORWARDED_BY for key, _ in context.invocation_metadata()):
        return None
    return addr


async def _forward(core, addr, path, request, response_type, context):
    metadata = [(k, v) for k, v in context.invocation_metadata() if k == "authorization"]
    metadata.append((FORWARDED_BY, str(core.broker_id)))
    remaining = context.time_remaining()
    timeout = FORWARD_TIMEOUT if remaining is None else min(FORWARD_TIMEOUT, remaining)
    channel = Channel(addr, connect_timeout=CONNECT_TIMEOUT)
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
