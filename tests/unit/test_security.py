"""danube.security in-process: the token cache's bounds, the RBAC decision across scopes, and
changes made through another writer of the store reaching the snapshot through its watch."""

import asyncio
import time

import jwt
import pytest

from danube.metadata import keys
from danube.metadata.memory import MemoryStore
from danube.security import rbac as r
from danube.security.tokens import (Principal, TokenError, TokenVerifier, mint_token,
                                    parse_ttl, principal_from_claims)

SECRET = "unit-secret-unit-secret-unit-secret!"


class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


def test_cache_is_bounded_and_least_recently_used_goes_first():
    v = TokenVerifier(secret_key=SECRET, cache_size=3)
    headers = [b"Bearer " + mint_token(f"s{i}", secret_key=SECRET).encode() for i in range(4)]
    for h in headers[:3]:
        v.verify_header(h)
    v.verify_header(headers[0])          # now the most recently used
    v.verify_header(headers[3])
    assert len(v._cache) == 3
    assert headers[1] not in v._cache and headers[0] in v._cache


def test_cache_never_outlives_the_token():
    clock = Clock()
    v = TokenVerifier(secret_key=SECRET, clock=clock, leeway=0)
    tok = mint_token("s", secret_key=SECRET, ttl=5, now=clock.now)
    header = b"Bearer " + tok.encode()
    assert v.verify_header(header).name == "s"
    _, valid_until = v._cache[header]
    assert valid_until <= clock.now + 5
    clock.now += 6
    # The cached entry has lapsed; the token itself is checked again (pyjwt reads the real
    # clock, by which it has not expired yet, so the entry is renewed but still bounded).
    v.verify_header(header)
    assert v._cache[header][1] <= tok_exp(tok)


def tok_exp(tok):
    return jwt.decode(tok, options={"verify_signature": False})["exp"]


def test_cache_entries_last_thirty_seconds_at_most():
    clock = Clock()
    v = TokenVerifier(secret_key=SECRET, clock=clock)
    header = b"Bearer " + mint_token("s", secret_key=SECRET, ttl=3600).encode()
    v.verify_header(header)
    assert v._cache[header][1] == pytest.approx(clock.now + 30)


def test_a_refused_token_is_remembered_briefly_and_boundedly():
    clock = Clock()
    v = TokenVerifier(secret_key=SECRET, clock=clock, cache_size=8)
    bad = b"Bearer " + mint_token("s", secret_key="another-secret-another-secret!!!").encode()
    calls = []
    real = v.verify
    v.verify = lambda token: calls.append(token) or real(token)
    for _ in range(3):
        with pytest.raises(TokenError, match="signature"):
            v.verify_header(bad)
    assert len(calls) == 1
    clock.now += 6
    with pytest.raises(TokenError):
        v.verify_header(bad)
    assert len(calls) == 2
    for i in range(10):
        with pytest.raises(TokenError):
            v.verify_header(b"Bearer x%d" % i)
    assert len(v._refused) == 2


def test_principal_types_and_names():
    assert principal_from_claims({"sub": "a", "principal_type": "user",
                                  "principal_name": "b", "exp": 5}) == Principal("user", "b", 5)
    assert principal_from_claims({"sub": "a", "principal_type": "root"}).type == \
        "service_account"
    with pytest.raises(TokenError):
        principal_from_claims({"sub": ""})


def test_issuer_is_checked_only_when_configured():
    tok = mint_token("s", secret_key=SECRET, issuer="other")
    assert TokenVerifier(secret_key=SECRET).verify(tok).name == "s"
    with pytest.raises(TokenError, match="issuer"):
        TokenVerifier(secret_key=SECRET, issuer="danube-auth").verify(tok)


def test_ttl_syntax():
    assert parse_ttl("8760h") == 8760 * 3600 and parse_ttl("365d") == 365 * 86400
    assert parse_ttl("90") == 90
    for bad in ("", "h", "-1d", "0h", "1y", "1.5h"):
        with pytest.raises(ValueError):
            parse_ttl(bad)


# -- RBAC -------------------------------------------------------------------------------------

def _binding(bid, name, roles, scope, resource="", ptype="service_account"):
    return {"id": bid, "principal_type": ptype, "principal_name": name, "role_names": roles,
            "scope": scope, "resource_name": resource}


@pytest.fixture
async def store():
    s = MemoryStore()
    yield s
    await s.close()


async def test_decision_across_scopes(store):
    rb = r.Rbac(store, super_admins=["root"])
    await rb.start()
    try:
        alice = Principal("user", "alice")
        await rb.put_role({"name": "prod", "permissions": ["Produce"], "system": False})
        await rb.put_binding(_binding("t", "alice", ["prod"], "topic", "/ns/a", "user"))
        assert rb.decide(alice, "Produce", r.topic("/ns/a"))[0]
        assert not rb.decide(alice, "Produce", r.topic("/ns/b"))[0]
        assert not rb.decide(alice, "Consume", r.topic("/ns/a"))[0]
        assert not rb.decide(alice, "Produce", r.namespace("ns"))[0]
        # The same name as a service account is another principal.
        assert not rb.decide(Principal("service_account", "alice"), "Produce",
                             r.topic("/ns/a"))[0]
        await rb.put_binding(_binding("n", "alice", ["prod"], "namespace", "ns", "user"))
        assert rb.decide(alice, "Produce", r.topic("/ns/b"))[0]
        assert rb.decide(alice, "Produce", r.topic("/ns/b-part-3"))[0]
        assert not rb.decide(alice, "Produce", r.topic("/other/b"))[0]
        await rb.put_binding(_binding("c", "alice", ["prod"], "cluster", "ignored", "user"))
        assert rb.decide(alice, "Produce", r.topic("/other/b"))[0]
        assert rb.binding("cluster", "", "c")["resource_name"] == ""
        # Roles are read at decision time: a binding to a missing role grants nothing.
        await rb.delete_role("prod")
        assert not rb.decide(alice, "Produce", r.topic("/ns/a"))[0]
        assert rb.decide(Principal("user", "root"), "ManageCluster", r.CLUSTER)[0]
        assert rb.decide(Principal("broker_internal", "b1"), "ManageCluster", r.CLUSTER)[0]
        allowed, reason = rb.decide(alice, "Consume", r.topic("/ns/a"))
        assert not allowed and "user:alice" in reason and "Consume" in reason \
            and "'/ns/a'" in reason
    finally:
        await rb.stop()


async def test_partition_binding_does_not_cover_the_base_or_siblings(store):
    rb = r.Rbac(store)
    await rb.start()
    try:
        bob = Principal("service_account", "bob")
        await rb.put_role({"name": "c", "permissions": ["Consume"], "system": False})
        await rb.put_binding(_binding("p", "bob", ["c"], "topic", "/ns/t-part-0"))
        assert rb.decide(bob, "Consume", r.topic("/ns/t-part-0"))[0]
        assert not rb.decide(bob, "Consume", r.topic("/ns/t-part-1"))[0]
        assert not rb.decide(bob, "Consume", r.topic("/ns/t"))[0]
    finally:
        await rb.stop()


async def test_a_change_by_another_writer_arrives_through_the_watch(store):
    rb = r.Rbac(store)
    await rb.start()
    changed = asyncio.Event()
    rb.listeners.append(changed.set)
    try:
        carol = Principal("service_account", "carol")
        await asyncio.sleep(0.05)            # the watch is open
        await store.put(keys.auth_role("look"), {"name": "look", "permissions": ["Lookup"],
                                                 "system": False})
        await store.put(keys.auth_binding("cluster", "", "x"),
                        _binding("x", "carol", ["look"], "cluster"))
        for _ in range(100):
            if rb.decide(carol, "Lookup", r.topic("/a/b"))[0]:
                break
            await asyncio.sleep(0.02)
        assert rb.decide(carol, "Lookup", r.topic("/a/b"))[0]
        assert changed.is_set()
        await store.delete(keys.auth_binding("cluster", "", "x"))
        for _ in range(100):
            if not rb.decide(carol, "Lookup", r.topic("/a/b"))[0]:
                break
            await asyncio.sleep(0.02)
        assert not rb.decide(carol, "Lookup", r.topic("/a/b"))[0]
    finally:
        await rb.stop()


def test_binding_keys_follow_upstreams_layout():
    assert keys.auth_binding("cluster", "", "b") == "/auth/bindings/cluster/b"
    assert keys.auth_binding("namespace", "ns", "b") == "/auth/bindings/namespace/ns/b"
    assert keys.auth_binding("topic", "/ns/t", "b") == "/auth/bindings/topic/ns/t/b"
    with pytest.raises(ValueError):
        keys.auth_binding("topic", "/ns/t", "a/b")
    with pytest.raises(ValueError):
        keys.auth_binding("topic", "", "b")


def test_every_rpc_of_every_served_service_has_a_permission_row():
    """A method without a row is refused to all but super admins: correct, but a service
    added without a row is then unusable for ordinary principals, so each must have one."""
    from danube.proto import (DanubeAdmin_pb2, DanubeApi_pb2, DanubeExt_pb2, EdgeReplicator_pb2,
                              SchemaRegistry_pb2)
    from danube.security.permissions import RULES

    paths = {f"/{svc.full_name}/{method.name}"
             for module in (DanubeApi_pb2, DanubeAdmin_pb2, DanubeExt_pb2, SchemaRegistry_pb2,
                            EdgeReplicator_pb2)
             for svc in module.DESCRIPTOR.services_by_name.values()
             for method in svc.methods}
    assert not paths - set(RULES), sorted(paths - set(RULES))
    assert not set(RULES) - paths, sorted(set(RULES) - paths)
