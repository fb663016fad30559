"""Default deny, tested directly: a method registered on a server without a row in
permissions.RULES is refused to every principal but a super admin, whatever roles it holds
and wherever they are bound. Every served RPC has a row today, so only a method added here
(unary, server-streaming and client-streaming, the three shapes the guard wraps) reaches the
fallback. A real `Server` with the real `Guard` and `Rbac`, called by grpcio with real JWTs."""

import asyncio
import collections

import grpc
import pytest

from danube.metadata.memory import MemoryStore
from danube.rpc.server import Kind, Server
from danube.security.guard import Guard
from danube.security.rbac import PERMISSIONS, SCOPES, Rbac
from danube.security.tokens import TokenVerifier, mint_token

SECRET = "default-deny-secret-default-deny-secret!"
SUPER = "root"
UNARY = "/test.Unlisted/Call"
STREAM = "/test.Unlisted/Watch"
UPLOAD = "/test.Unlisted/Upload"
# Registered after the guard was put on the server: guarded all the same.
LATE = "/test.Unlisted/Late"


def _token(name, ptype="service_account"):
    return mint_token(name, secret_key=SECRET, ttl=600, principal_type=ptype)


def _principals():
    """(principal type, name) of every kind of grant short of super admin: each permission
    alone and all of them together, bound at each scope (topic and namespace bindings on
    the names a request would most likely carry), as a user and as a service account."""
    roles = {f"only-{p}": [p] for p in PERMISSIONS}
    roles["everything"] = list(PERMISSIONS)
    grants = []
    for ptype in ("user", "service_account"):
        for role in roles:
            for scope in SCOPES:
                grants.append((ptype, f"{ptype}-{role}-{scope}", role, scope))
    return roles, grants


@pytest.fixture
async def guarded():
    calls = collections.Counter()

    async def unary(request, context):
        calls[UNARY] += 1
        return b"ran"

    async def late(request, context):
        calls[LATE] += 1
        return b"ran"

    async def stream(request, context):
        calls[STREAM] += 1
        yield b"ran"

    async def upload(requests, context):
        calls[UPLOAD] += 1
        async for _ in requests:
            pass
        return b"ran"

    store = MemoryStore()
    rbac = Rbac(store, super_admins=[SUPER])
    await rbac.start()
    roles, grants = _principals()
    for name, perms in roles.items():
        await rbac.put_role({"name": name, "permissions": perms, "system": False})
    for i, (ptype, name, role, scope) in enumerate(grants):
        resource = {"cluster": "", "namespace": "default", "topic": "/default/t"}[scope]
        await rbac.put_binding({"id": f"b{i}", "principal_type": ptype, "principal_name": name,
                                "role_names": [role], "scope": scope,
                                "resource_name": resource})
    server = Server()
    server.add_method(UNARY, Kind.UNARY_UNARY, unary)
    server.add_method(STREAM, Kind.UNARY_STREAM, stream)
    server.add_method(UPLOAD, Kind.STREAM_UNARY, upload)
    guard = Guard(TokenVerifier(secret_key=SECRET), rbac, core=None)
    guard.protect(server)
    server.add_method(LATE, Kind.UNARY_UNARY, late)
    port = await server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, calls, grants, guard
    finally:
        channel.close()
        await server.stop(grace=1)
        await rbac.stop()
        await store.close()


def _call(channel, path, token):
    """(status code, first response or None) of one call of each shape."""
    metadata = [] if token is None else [("authorization", f"Bearer {token}")]
    ident = lambda b: b  # noqa: E731 - raw bytes both ways
    try:
        if path in (UNARY, LATE):
            fn = channel.unary_unary(path, request_serializer=ident,
                                     response_deserializer=ident)
            return grpc.StatusCode.OK, fn(b"x", metadata=metadata, timeout=30)
        if path == STREAM:
            fn = channel.unary_stream(path, request_serializer=ident,
                                      response_deserializer=ident)
            return grpc.StatusCode.OK, list(fn(b"x", metadata=metadata, timeout=30))[0]
        fn = channel.stream_unary(path, request_serializer=ident, response_deserializer=ident)
        return grpc.StatusCode.OK, fn(iter([b"x"]), metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


@pytest.mark.parametrize("path", [UNARY, STREAM, UPLOAD, LATE])
async def test_a_method_without_a_row_is_refused_to_every_role(guarded, path):
    channel, calls, grants, guard = guarded
    for ptype, name, role, scope in grants:
        code, details = await asyncio.to_thread(_call, channel, path, _token(name, ptype))
        assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
        assert name in details, details
    assert calls[path] == 0, "a refused call reached the handler"
    # Without a token: not even authenticated.
    code, _ = await asyncio.to_thread(_call, channel, path, None)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert calls[path] == 0
    assert sum(guard.denied.values()) == len(grants)


@pytest.mark.parametrize("path", [UNARY, STREAM, UPLOAD])
async def test_a_method_without_a_row_is_open_to_a_super_admin(guarded, path):
    channel, calls, _, _ = guarded
    for ptype in ("user", "service_account"):
        code, answer = await asyncio.to_thread(_call, channel, path, _token(SUPER, ptype))
        assert (code, answer) == (grpc.StatusCode.OK, b"ran")
    assert calls[path] == 2
