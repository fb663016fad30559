"""`danube admin security` (issue 22) against a real broker in auth.mode tls: roles and
bindings through SecurityAdmin with DANUBE_ADMIN_TOKEN / DANUBE_ADMIN_CA, and tokens minted
and validated offline, which the broker then accepts."""

import json
import os
import subprocess
import sys

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from secure_broker import Caller, SECRET, SUPER, broker_fixture, token

pytestmark = pytest.mark.timeout(180)


broker = broker_fixture("cli")


def cli(*args, env=None):
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("DANUBE_ADMIN_", "DANUBE_JWT_"))}
    full.update(env or {})
    return subprocess.run([sys.executable, "-P", "-m", "danube", "admin", *args],
                          capture_output=True, text=True, timeout=60, env=full)


def admin_env(certs, tok=None):
    return {"DANUBE_ADMIN_TOKEN": tok or token(SUPER), "DANUBE_ADMIN_CA": certs.ca_file}


def sec(broker, certs, *args, tok=None):
    return cli("--endpoint", f"https://{broker.admin_addr}", "security", *args,
               env=admin_env(certs, tok))


def test_roles_create_get_list_delete(broker, certs):
    r = sec(broker, certs, "roles", "create", "producer-role", "--permissions",
            "Produce,Lookup")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Role 'producer-role' created: true"
    r = sec(broker, certs, "roles", "get", "producer-role")
    assert r.stdout.splitlines() == ["Role: producer-role", "  Permissions: Produce, Lookup"]
    r = sec(broker, certs, "roles", "list", "--output", "json")
    assert {"name": "producer-role", "permissions": ["Produce", "Lookup"],
            "system": False} in json.loads(r.stdout)
    r = sec(broker, certs, "roles", "delete", "producer-role")
    assert r.returncode == 0 and "deleted: true" in r.stdout
    r = sec(broker, certs, "roles", "get", "producer-role")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and "Traceback" not in r.stderr


def test_bad_permission_is_refused_cleanly(broker, certs):
    r = sec(broker, certs, "roles", "create", "bad", "--permissions", "Produce,Fly")
    assert r.returncode == 1
    assert "INVALID_ARGUMENT" in r.stderr and "unknown permission: Fly" in r.stderr


def test_bindings_grant_what_they_say(broker, certs):
    topic = "/default/cli-granted"
    assert sec(broker, certs, "roles", "create", "cli-prod", "--permissions",
               "Produce").returncode == 0
    r = sec(broker, certs, "bindings", "create", "cli-b1", "--principal-type",
            "service_account", "--principal-name", "cli-app", "--roles", "cli-prod",
            "--scope", "topic", "--resource", topic)
    assert r.returncode == 0 and r.stdout.strip() == "Binding 'cli-b1' created: true", r.stderr
    r = sec(broker, certs, "bindings", "get", "cli-b1", "--scope", "topic", "--resource", topic)
    assert r.stdout.splitlines() == ["Binding: cli-b1", "  Principal: service_account:cli-app",
                                     "  Roles: cli-prod", f"  Scope: topic ({topic})"]
    r = sec(broker, certs, "bindings", "list", "--output", "json")
    assert any(b["id"] == "cli-b1" for b in json.loads(r.stdout))
    # A token minted by the CLI, offline, is accepted by the broker and the binding applies.
    r = cli("security", "tokens", "create", "--subject", "cli-app", "--ttl", "1h",
            env={"DANUBE_JWT_SECRET_KEY": SECRET})
    assert r.returncode == 0, r.stderr
    app_token = r.stdout.strip()
    client = Caller(broker.client_addr, certs)
    try:
        def produce(t):
            return client.code("/danube.ProducerService/CreateProducer", pb.ProducerRequest(
                request_id=1, producer_name="cli-p", topic_name=t), pb.ProducerResponse,
                token=app_token)[0]
        assert produce(topic) == grpc.StatusCode.OK
        assert produce("/default/cli-other") == grpc.StatusCode.PERMISSION_DENIED
        r = sec(broker, certs, "bindings", "delete", "cli-b1", "--scope", "topic",
                "--resource", topic)
        assert r.returncode == 0 and "deleted: true" in r.stdout
        assert produce(topic) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        client.close()


def test_without_a_token_or_ca_the_cli_fails_cleanly(broker, certs):
    r = cli("--endpoint", f"https://{broker.admin_addr}", "security", "roles", "list",
            env={"DANUBE_ADMIN_CA": certs.ca_file, "DANUBE_ADMIN_TOKEN": ""})
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
    assert "Authentication credentials are missing" in r.stderr
    r = cli("--endpoint", f"http://{broker.admin_addr}", "security", "roles", "list",
            env={"DANUBE_ADMIN_TOKEN": token(SUPER), "DANUBE_ADMIN_CA": ""})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    r = sec(broker, certs, "roles", "list", tok=token("nobody"))
    assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr


def test_tokens_create_and_validate_offline(tmp_path):
    r = cli("security", "tokens", "create", "--subject", "svc", "--secret-key", "k" * 32,
            "--type", "user", "--ttl", "2d", "--issuer", "me")
    assert r.returncode == 0
    tok = r.stdout.strip()
    r = cli("security", "tokens", "validate", "--token", tok, "--secret-key", "k" * 32)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Token is valid."
    assert "  Principal type:  user" in lines and "  Issuer:          me" in lines
    assert any(line.startswith("  Remaining:       1d 23h") or
               line.startswith("  Remaining:       2d 0h") for line in lines)
    r = cli("security", "tokens", "validate", "--token", tok, "--secret-key", "x" * 32)
    assert r.returncode == 1 and "signature does not verify" in r.stderr
    r = cli("security", "tokens", "create", "--subject", "svc", "--ttl", "forever",
            "--secret-key", "k")
    assert r.returncode == 1 and "invalid TTL" in r.stderr
    r = cli("security", "tokens", "create", "--subject", "svc")
    assert r.returncode == 1 and "signing key is required" in r.stderr


def test_tokens_with_a_private_key_file(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    r = cli("security", "tokens", "create", "--subject", "svc", "--private-key-file", str(priv))
    assert r.returncode == 0, r.stderr
    tok = r.stdout.strip()
    r = cli("security", "tokens", "validate", "--token", tok, "--public-key-file", str(pub))
    assert r.returncode == 0 and "Token is valid." in r.stdout
    r = cli("security", "tokens", "create", "--subject", "svc", "--private-key-file",
            str(tmp_path / "missing.pem"))
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_domain_names_the_certificate_to_expect(broker, certs):
    env = admin_env(certs)
    ok = cli("--endpoint", f"https://{broker.admin_addr}", "security", "roles", "list",
             env=dict(env, DANUBE_ADMIN_DOMAIN="localhost"))
    assert ok.returncode == 0, ok.stderr
    bad = cli("--endpoint", f"https://{broker.admin_addr}", "security", "roles", "list",
              env=dict(env, DANUBE_ADMIN_DOMAIN="wrong.example"))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "certificate" in bad.stderr.lower() or "hostname" in bad.stderr.lower(), bad.stderr
