"""HAProxy as the ingress of proxy mode (upstream's CHANGELOG #195).

Brokers advertise the ingress as their `connect_url` and themselves as `broker_url`; a
client that looked a topic up sends every call for it to the ingress with the header
`x-danube-broker-url: <broker_url>`, and the ingress routes the call to that broker. Calls
without the header (lookups, the first call of a client) go to any live broker, which can
answer them all: a lookup names the owner, and the client's next call carries its header.

Upstream's scripts/haproxy.cfg balances TCP connections round robin, which cannot route a
call by a header: here HAProxy speaks HTTP/2 on both sides (gRPC is HTTP/2) and picks the
backend per request.
"""

from __future__ import annotations

import re

HEADER = "x-danube-broker-url"

_TEMPLATE = """\
# danube proxy mode: HTTP/2 ingress routing gRPC calls on {header}
global
    maxconn {maxconn}
{global_extra}
defaults
    mode http
    timeout connect 2s
    # ReceiveMessages streams stay open while a consumer waits for messages.
    timeout client 1h
    timeout server 1h
    timeout http-request 10s
    # A broker that stops answering is marked down at once: by its health check, or by
    # the first connection to it that fails.
    default-server proto h2 check inter {check_ms} fall 1 rise 1 observe layer4 error-limit 1 on-error mark-down

frontend danube_clients
    bind {bind} proto h2
    acl health_check path /danube.HealthCheck/HealthCheck
{routes}
    default_backend danube_any

# Calls without the header: any live broker (they all answer lookups and partitions).
backend danube_any
    balance roundrobin
    retries 2
    option redispatch 1
{any_servers}
{named_backends}"""


def backend_name(broker_url: str) -> str:
    """A backend name HAProxy accepts, derived from the broker URL."""
    return "broker_" + re.sub(r"[^A-Za-z0-9]+", "_", broker_url.split("://", 1)[-1])


def _hostport(broker_url: str) -> str:
    hostport = broker_url.split("://", 1)[-1].rstrip("/")
    if not re.fullmatch(r"[\w.\-\[\]:]+:\d+", hostport):
        raise ValueError(f"broker URL {broker_url!r}: expected [http://]HOST:PORT")
    return hostport


def haproxy_config(bind: str, broker_urls: list[str], *, check_ms: int = 250,
                   maxconn: int = 4096, global_extra: str = "") -> str:
    """The HAProxy configuration of an ingress listening on ``bind`` (HOST:PORT) in front
    of brokers advertising ``broker_urls`` (plain-text ``http://HOST:PORT``; the header
    carries these exact strings). A call whose header names no known broker goes to any
    live broker, which answers it as upstream does (the header is ignored)."""
    if not broker_urls:
        raise ValueError("an ingress needs at least one broker")
    routes, any_servers, named = [], [], []
    for i, url in enumerate(broker_urls):
        name, hostport = backend_name(url), _hostport(url)
        # A health check for a broker that is down goes to a live one, which answers CLOSE
        # (it knows no such producer or consumer): the official consumer resubscribes,
        # through a lookup, only on CLOSE. Every other call for it fails (503, which gRPC
        # clients see as UNAVAILABLE) and the clients retry and look the topic up again.
        routes.append(f"    acl to_b{i} req.hdr({HEADER}) -m str {url}\n"
                      f"    acl b{i}_up nbsrv({name}) gt 0\n"
                      f"    use_backend danube_any if to_b{i} !b{i}_up health_check\n"
                      f"    use_backend {name} if to_b{i}")
        any_servers.append(f"    server b{i} {hostport}")
        named.append(f"backend {name}\n    server b{i} {hostport}\n")
    return _TEMPLATE.format(header=HEADER, maxconn=maxconn, global_extra=global_extra,
                            check_ms=check_ms, bind=bind, routes="\n".join(routes),
                            any_servers="\n".join(any_servers), named_backends="\n".join(named))
