"""JWT authentication on a real broker in auth.mode tls (issue 22): every call on both ports
needs a valid token; each kind of bad token is refused with UNAUTHENTICATED naming why, and
never reaches the broker's data."""

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time

import grpc
import jwt
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from secure_broker import (Caller, SECRET, SUPER, Security, broker_fixture, broker_yaml,
                            start_secure, token)
from secure_broker import admin, client  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)

LOOKUP = "/danube.Discovery/TopicLookup"
LIST_NS = "/danube_admin.BrokerAdmin/ListNamespaces"
NS_TOPICS = "/danube_admin.NamespaceAdmin/GetNamespaceTopics"


broker = broker_fixture("auth")


def _lookup(client, **kwargs):
    return client.code(LOOKUP, pb.TopicLookupRequest(request_id=1, topic="/default/t"),
                       pb.TopicLookupResponse, **kwargs)


def _now():
    return int(time.time())


def _hs(claims, key=SECRET, **kwargs):
    return jwt.encode(claims, key, algorithm="HS256", **kwargs)


def _claims(**over):
    claims = {"iss": "danube-auth", "exp": _now() + 3600, "sub": SUPER,
              "principal_type": "user", "principal_name": SUPER}
    claims.update(over)
    return {k: v for k, v in claims.items() if v is not None}


def test_a_valid_token_is_accepted_on_both_ports(client, admin):
    code, resp = _lookup(client, token=token(SUPER))
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND), resp
    code, resp = admin.code(LIST_NS, adm.Empty(), adm.NamespaceListResponse, token=token(SUPER))
    assert code == grpc.StatusCode.OK and "default" in resp.namespaces


def test_lowercase_bearer_is_accepted(client):
    code, _ = _lookup(client, raw_header=f"bearer {token(SUPER)}")
    assert code != grpc.StatusCode.UNAUTHENTICATED


def test_missing_token_is_refused_with_upstreams_message(client, admin):
    assert _lookup(client) == (grpc.StatusCode.UNAUTHENTICATED,
                               "Authentication credentials are missing")
    assert admin.code(LIST_NS, adm.Empty(), adm.NamespaceListResponse) == (
        grpc.StatusCode.UNAUTHENTICATED, "Authentication credentials are missing")
    health = client.code("/danube.HealthCheck/HealthCheck",
                         pb.HealthCheckRequest(request_id=1, client=0, id=1),
                         pb.HealthCheckResponse)
    assert health[0] == grpc.StatusCode.UNAUTHENTICATED


def _none_token():
    header = base64.urlsafe_b64encode(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    body = base64.urlsafe_b64encode(json.dumps(_claims()).encode())
    return f"{header.decode().rstrip('=')}.{body.decode().rstrip('=')}."


def _b64(data):
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _hmac_signed(claims, key):
    """HS256 signed by hand: pyjwt itself refuses a PEM key as an HMAC secret."""
    import hashlib
    import hmac
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    signing = f"{header}.{_b64(json.dumps(claims).encode())}"
    sig = hmac.new(key, signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{_b64(sig)}"


def _rs256_token():
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(_claims(), key, algorithm="RS256")


BAD_TOKENS = {
    "expired": (lambda: _hs(_claims(exp=_now() - 3600)), "expired"),
    "not yet valid": (lambda: _hs(_claims(nbf=_now() + 3600)), "not yet valid"),
    "wrong secret": (lambda: _hs(_claims(), key="another-secret-another-secret-xx"),
                     "signature"),
    "alg none": (_none_token, "algorithm 'none' is not accepted"),
    "HS384 (not pinned)": (lambda: jwt.encode(_claims(), SECRET, algorithm="HS384"),
                           "algorithm 'HS384' is not accepted"),
    "RS256 without a public key configured": (_rs256_token, "algorithm 'RS256'"),
    "truncated": (lambda: token(SUPER)[:-10], "Invalid token"),
    "only a header": (lambda: token(SUPER).split(".")[0], "malformed"),
    "no exp": (lambda: _hs(_claims(exp=None)), "'exp' claim is missing"),
    "wrong issuer": (lambda: _hs(_claims(iss="someone-else")), "issuer"),
    "garbage": (lambda: "not-a-jwt", "malformed"),
    "oversize": (lambda: "A" * 10_000, "longer than"),
}


@pytest.mark.parametrize("kind", list(BAD_TOKENS))
def test_bad_tokens_are_unauthenticated_and_say_why(client, admin, kind):
    make, why = BAD_TOKENS[kind]
    bad = make()
    code, details = _lookup(client, token=bad)
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
    assert why in details
    # The admin port too, and a write refused there changes nothing.
    code, details = admin.code("/danube_admin.NamespaceAdmin/CreateNamespace",
                               adm.NamespaceRequest(name="never"), adm.NamespaceResponse,
                               token=bad)
    assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)


def test_no_refused_call_reached_the_data(admin):
    code, resp = admin.code(LIST_NS, adm.Empty(), adm.NamespaceListResponse, token=token(SUPER))
    assert code == grpc.StatusCode.OK and "never" not in resp.namespaces


def test_ten_thousand_random_bytes_as_the_token(broker, client, certs):
    # Not even a valid header value for grpcio: sent raw over HTTP/2 (h2), the broker must
    # answer UNAUTHENTICATED and keep serving.
    import h2.config
    import h2.connection
    ctx = ssl.create_default_context(cafile=certs.ca_file)
    ctx.set_alpn_protocols(["h2"])
    raw = os.urandom(10_000)
    with socket.create_connection(("127.0.0.1", broker.client_port), timeout=5) as sock:
        with ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            conn = h2.connection.H2Connection(h2.config.H2Configuration(
                client_side=True, header_encoding=None, validate_outbound_headers=False,
                normalize_outbound_headers=False))
            conn.initiate_connection()
            request = pb.TopicLookupRequest(request_id=1, topic="/default/t").SerializeToString()
            conn.send_headers(1, [(b":method", b"POST"), (b":scheme", b"https"),
                                  (b":path", LOOKUP.encode()), (b":authority", b"x"),
                                  (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                                  (b"authorization", raw)])
            conn.send_data(1, b"\0" + len(request).to_bytes(4, "big") + request,
                           end_stream=True)
            tls.sendall(conn.data_to_send())
            status = _grpc_status(conn, tls)
    assert status[0] == b"16", status      # UNAUTHENTICATED
    assert _lookup(client, token=token(SUPER))[0] != grpc.StatusCode.UNAVAILABLE


def _grpc_status(conn, tls):
    deadline = time.time() + 10
    while time.time() < deadline:
        data = tls.recv(65536)
        if not data:
            break
        for event in conn.receive_data(data):
            headers = getattr(event, "headers", None)
            if headers:
                fields = dict(headers)
                if b"grpc-status" in fields:
                    return fields[b"grpc-status"], fields.get(b"grpc-message", b"")
        tls.sendall(conn.data_to_send())
    return None, b""


def test_plaintext_against_the_tls_port_fails_cleanly(broker, client):
    channel = grpc.insecure_channel(broker.client_addr)
    fn = channel.unary_unary(LOOKUP, request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=pb.TopicLookupResponse.FromString)
    with pytest.raises(grpc.RpcError) as info:
        fn(pb.TopicLookupRequest(request_id=1, topic="/default/t"),
           metadata=[("authorization", f"Bearer {token(SUPER)}")], timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()
    # Only the handshake failed: no handler error in the log, and the port still serves.
    assert "Traceback" not in broker.log()
    assert _lookup(client, token=token(SUPER))[0] != grpc.StatusCode.UNAVAILABLE


def test_a_token_is_cached_but_never_past_its_expiry(tmp_path, certs):
    b = start_secure(tmp_path, certs, jwt_extra="leeway_seconds: 0\n")
    c = Caller(b.client_addr, certs)
    try:
        short = token(SUPER, ttl=2)
        assert _lookup(c, token=short)[0] != grpc.StatusCode.UNAUTHENTICATED
        time.sleep(3.2)
        code, details = _lookup(c, token=short)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "expired" in details
    finally:
        c.close()
        assert b.stop() == 0


def test_public_key_tokens_es256(tmp_path, certs):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from danube.security.tokens import mint_token
    key = ec.generate_private_key(ec.SECP256R1())
    pub = tmp_path / "jwt.pub"
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    b = start_secure(tmp_path, certs, secret="", jwt_extra=f'public_key_file: "{pub}"\n')
    c = Caller(b.client_addr, certs)
    try:
        good = mint_token(SUPER, private_key_pem=pem)
        assert _lookup(c, token=good)[0] != grpc.StatusCode.UNAUTHENTICATED
        # Algorithm confusion: the public key's PEM used as an HMAC secret.
        forged = _hmac_signed(_claims(), pub.read_bytes())
        code, details = _lookup(c, token=forged)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "'HS256' is not accepted" in details
        other = mint_token(SUPER, private_key_pem=ec.generate_private_key(
            ec.SECP256R1()).private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        assert _lookup(c, token=other)[0] == grpc.StatusCode.UNAUTHENTICATED
    finally:
        c.close()
        assert b.stop() == 0


def _run(*args):
    return subprocess.run([sys.executable, "-P", "-m", "danube", "broker", *args],
                          capture_output=True, text=True, timeout=60)


def test_tls_mode_without_a_key_refuses_to_start(tmp_path, certs):
    path = broker_yaml(tmp_path, certs, secret="")
    result = _run("--mode", "standalone", "--data-dir", str(tmp_path / "d"),
                  "--config-file", path)
    assert result.returncode == 2
    assert "neither auth.jwt.secret_key nor auth.jwt.public_key_file" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreadable_public_key_refuses_to_start(tmp_path, certs):
    path = broker_yaml(tmp_path, certs, secret="",
                       jwt_extra=f'public_key_file: "{tmp_path}/missing.pem"\n')
    result = _run("--mode", "standalone", "--data-dir", str(tmp_path / "d"),
                  "--config-file", path)
    assert result.returncode == 2
    assert "auth.jwt.public_key_file: cannot read" in result.stderr
    assert "Traceback" not in result.stderr


def test_insecure_flag_is_still_the_explicit_opt_out(tmp_path, certs):
    b = BrokerProcess("--config-file", broker_yaml(tmp_path, certs, secret=""),
                      "--insecure-allow-unauthenticated", data_dir=tmp_path / "d").start()
    c = Caller(b.client_addr, certs)
    try:
        assert "every call is accepted without a token" in b.log()
        assert _lookup(c)[0] != grpc.StatusCode.UNAUTHENTICATED
    finally:
        c.close()
        assert b.stop() == 0


def test_security_admin_itself_needs_manage_cluster(admin):
    stranger = token("stranger")
    code, details = Security(admin, stranger).admin.code(
        "/danube_admin.SecurityAdmin/ListRoles", adm.Empty(), adm.ListRolesResponse,
        token=stranger)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "service_account:stranger" in details and "ManageCluster" in details
