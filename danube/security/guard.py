"""The guard in front of every method of a server when `auth.mode` is tls: the call's JWT is
checked (tokens.py), then the permission its row of permissions.RULES names, on the resource
the request names (rbac.py), before the handler runs. A refused call never reaches the
handler, so nothing of it touches the broker's state.

Streams (ReceiveMessages, ReadRange) are checked when they open and then watched: a stream
ends with UNAUTHENTICATED when its token expires (exp plus the leeway), and with
PERMISSION_DENIED as soon as a change of roles or bindings takes its permission away. A
consumer's client then has to come back with a valid token and a binding that allows it.
"""

import collections
import logging
import time

from danube.rpc.method import Kind
from danube.rpc.status import RpcError, StatusCode
from danube.security.permissions import RULES
from danube.security.rbac import CLUSTER
from danube.security.tokens import MISSING, TokenError

log = logging.getLogger("danube.security")

_AUTHORIZATION = b"authorization"
LOG_EVERY = 10.0        # seconds between two warnings of the same kind


class _Throttled:
    """One warning per LOG_EVERY seconds per kind; what was held back is counted in the
    next one, so a flood of bad calls cannot flood the log."""

    def __init__(self):
        self.last = {}
        self.held = collections.Counter()

    def warn(self, kind, fmt, *args):
        now = time.monotonic()
        last = self.last.get(kind)
        if last is not None and now - last < LOG_EVERY:
            self.held[kind] += 1
            return
        self.last[kind] = now
        held = self.held.pop(kind, 0)
        suffix = f" ({held} more like it since the last warning)" if held else ""
        log.warning(fmt + suffix, *args)


class Guard:
    def __init__(self, verifier, rbac, core, rules=RULES):
        self.verifier = verifier
        self.rbac = rbac
        self.core = core
        self.rules = rules
        self.allowed = collections.Counter()     # (scope, permission) -> calls
        self.denied = collections.Counter()
        self.unauthenticated = 0
        self.streams = {}                        # context -> (principal, permission, resource)
        self._expiry = {}                        # context -> timer handle
        self._log = _Throttled()
        rbac.listeners.append(self.recheck_streams)

    def protect(self, server):
        """Put the guard in front of every method registered on `server`, now and later."""
        for method in server.methods.values():
            method.handler = self._wrap(method)
        server.method_wrapper = self._wrap

    # -- the checks ---------------------------------------------------------------------

    def authenticate(self, context):
        value = None
        for name, field in context.head.fields:
            if name == _AUTHORIZATION:
                value = field
                break
        if value is None:
            self._refused(context, MISSING)
            raise RpcError(StatusCode.UNAUTHENTICATED, MISSING)
        try:
            return self.verifier.verify_header(value)
        except TokenError as exc:
            self._refused(context, str(exc))
            raise RpcError(StatusCode.UNAUTHENTICATED, str(exc)) from None

    def _refused(self, context, why):
        self.unauthenticated += 1
        self._log.warn("unauthenticated", "refused an unauthenticated call to %s from %s: %s",
                       context.method.name, context.peer(), why)

    def authorize(self, principal, permission, resource):
        if self.rbac.grant(principal, permission, resource) is not None:
            self.allowed[resource.scope, permission] += 1
            return
        _, reason = self.rbac.decide(principal, permission, resource)
        self.denied[resource.scope, permission] += 1
        self._log.warn("denied", "authorization denied: %s", reason)
        raise RpcError(StatusCode.PERMISSION_DENIED, reason)

    def check(self, request, context, rule):
        principal = self.authenticate(context)
        if rule is None:
            # Default deny: a method without a row is for super admins only.
            self.authorize(principal, f"call {context.method.name}", CLUSTER)
            return principal, None, None
        if rule.permission is None:
            return principal, None, None
        resource = rule.resource(request, self.core)
        self.authorize(principal, rule.permission, resource)
        return principal, rule.permission, resource

    # -- wrapping handlers ----------------------------------------------------------------

    def _wrap(self, method):
        handler = method.handler
        rule = self.rules.get(method.name)
        guard = self

        if method.kind is Kind.UNARY_UNARY:
            async def unary(request, context):
                guard.check(request, context, rule)
                return await handler(request, context)
            return unary

        if method.kind is Kind.UNARY_STREAM:
            async def server_stream(request, context):
                principal, permission, resource = guard.check(request, context, rule)
                guard.opened(context, principal, permission, resource)
                try:
                    result = handler(request, context)
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            await context.write(item)
                    else:
                        await result
                finally:
                    guard.closed(context)
            return server_stream

        # Client-streaming calls: the request is not read yet, so the resource is the
        # cluster (none is registered today; this keeps a future one closed by default).
        async def client_stream(requests, context):
            principal = guard.authenticate(context)
            guard.authorize(principal, rule.permission if rule and rule.permission
                            else f"call {method.name}", CLUSTER)
            result = handler(requests, context)
            if hasattr(result, "__aiter__"):
                async for item in result:
                    await context.write(item)
                return None
            return await result
        return client_stream

    # -- open streams -------------------------------------------------------------------

    def opened(self, context, principal, permission, resource):
        self.streams[context] = (principal, permission, resource)
        if principal.expires_at is not None:
            loop = context.conn.loop
            delay = principal.expires_at + self.verifier.leeway - time.time()
            self._expiry[context] = loop.call_at(loop.time() + max(0.0, delay),
                                                 self._expired, context)

    def closed(self, context):
        self.streams.pop(context, None)
        timer = self._expiry.pop(context, None)
        if timer is not None:
            timer.cancel()

    def _expired(self, context):
        self._expiry.pop(context, None)
        if self.streams.pop(context, None) is not None:
            log.info("ending %s from %s: its token expired", context.method.name,
                     context.peer())
            context.fail_early(StatusCode.UNAUTHENTICATED,
                               "Invalid token: expired while the stream was open")

    def recheck_streams(self):
        """After any change of roles or bindings: end the streams it no longer allows."""
        for context, (principal, permission, resource) in list(self.streams.items()):
            if permission is None:
                continue
            if self.rbac.grant(principal, permission, resource) is None:
                _, reason = self.rbac.decide(principal, permission, resource)
                self.closed(context)
                log.info("ending %s from %s: %s", context.method.name, context.peer(), reason)
                context.fail_early(StatusCode.PERMISSION_DENIED,
                                   f"{reason} (revoked while the stream was open)")
