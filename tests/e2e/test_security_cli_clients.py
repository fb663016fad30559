"""`danube produce|consume|schema` against a broker in auth.mode tls (issue 22, ours:
upstream's danube-cli has no security options): CA, token by flag, file and environment,
mTLS, the certificate's name, and a clean one-line error for each missing credential."""

import os
import subprocess
import sys

import pytest

from secure_broker import SUPER, broker_fixture, token

pytestmark = pytest.mark.timeout(240)


broker = broker_fixture("clients")


mtls = broker_fixture("clients-mtls", tls_extra=", require_client_cert: true")


def danube(*args, env=None, timeout=60):
    full = {k: v for k, v in os.environ.items() if not k.startswith("DANUBE_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-P", "-m", "danube", *args],
                          capture_output=True, text=True, timeout=timeout, env=full)


def produce(addr, topic, *extra, count=3, env=None):
    return danube("produce", "-s", addr, "-t", topic, "-m", "hello", "-c", str(count),
                  "--pipeline", "4", "--output", "json", *extra, env=env)


def consume(addr, topic, *extra, count=3, env=None):
    return danube("consume", "-s", addr, "-t", topic, "-m", "sub", "--count", str(count),
                  "--timeout", "30", "--output", "json", *extra, env=env)


def clean_failure(result, *needles):
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_produce_and_consume_with_a_ca_file_and_a_token_file(broker, certs, tmp_path):
    tok = tmp_path / "token"
    tok.write_text(token(SUPER) + "\n")
    addr = f"https://{broker.client_addr}"
    creds = ("--ca-file", certs.ca_file, "--token-file", str(tok))
    r = produce(addr, "/default/tls1", *creds, count=1)     # creates the topic
    assert r.returncode == 0, r.stderr
    consumer = subprocess.Popen(
        [sys.executable, "-P", "-m", "danube", "consume", "-s", addr, "-t", "/default/tls1",
         "-m", "sub", "--count", "3", "--timeout", "60", "--output", "json", *creds],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the consumer subscribes at some point during these: publish until it has 3
        for _ in range(40):
            if consumer.poll() is not None:
                break
            assert produce(addr, "/default/tls1", *creds, count=1).returncode == 0
        out, err = consumer.communicate(timeout=60)
    finally:
        consumer.kill()
    assert consumer.returncode == 0, err
    assert out.count('"hello"') >= 3 or out.count("hello") >= 3, out


def test_the_environment_gives_tls_and_the_token(broker, certs):
    env = {"DANUBE_TLS": "true", "DANUBE_CA": certs.ca_file, "DANUBE_TOKEN": token(SUPER)}
    r = produce(broker.client_addr, "/default/tls-env", env=env)    # no scheme: TLS by env
    assert r.returncode == 0, r.stderr
    r = danube("schema", "-s", f"https://{broker.client_addr}", "list", env=env)
    assert r.returncode == 0, r.stderr


def test_a_flag_wins_over_the_environment(broker, certs):
    env = {"DANUBE_CA": certs.ca_file, "DANUBE_TOKEN": token("nobody")}
    r = produce(f"https://{broker.client_addr}", "/default/tls-flag", "--token", token(SUPER),
                env=env)
    assert r.returncode == 0, r.stderr


def test_without_a_token_the_broker_refuses_and_the_cli_says_so(broker, certs):
    r = produce(f"https://{broker.client_addr}", "/default/tls2", "--ca-file", certs.ca_file)
    clean_failure(r, "UNAUTHENTICATED")
    r = consume(f"https://{broker.client_addr}", "/default/tls2", "--ca-file", certs.ca_file)
    clean_failure(r, "UNAUTHENTICATED")


def test_a_token_without_a_binding_is_denied(broker, certs):
    r = produce(f"https://{broker.client_addr}", "/default/tls3", "--ca-file", certs.ca_file,
                "--token", token("nobody"))
    clean_failure(r, "PERMISSION_DENIED")


def test_the_broker_certificate_is_verified(broker, certs):
    addr = f"https://{broker.client_addr}"
    # the system CAs do not know the test CA
    clean_failure(produce(addr, "/default/tls4", "--token", token(SUPER)), "certificate")
    # the certificate names 127.0.0.1 and localhost, not this
    clean_failure(produce(addr, "/default/tls4", "--token", token(SUPER), "--ca-file",
                          certs.ca_file, "--tls-domain", "other.example"), "certificate")
    r = produce(f"https://localhost:{broker.client_addr.rsplit(':', 1)[1]}", "/default/tls4",
                "--token", token(SUPER), "--ca-file", certs.ca_file)
    assert r.returncode == 0, r.stderr


def test_plain_text_against_the_tls_port_fails_cleanly(broker):
    r = produce(f"http://{broker.client_addr}", "/default/tls5", "--token", token(SUPER))
    clean_failure(r, "is it a TLS port? then use https://")


def test_mtls_needs_the_client_certificate(mtls, certs):
    addr = f"https://{mtls.client_addr}"
    base = ("--ca-file", certs.ca_file, "--token", token(SUPER))
    r = produce(addr, "/default/mtls1", *base, "--cert-file", certs.client_cert_file,
                "--key-file", certs.client_key_file)
    assert r.returncode == 0, r.stderr
    clean_failure(produce(addr, "/default/mtls1", *base))
    env = {"DANUBE_CERT": certs.client_cert_file, "DANUBE_KEY": certs.client_key_file}
    assert produce(addr, "/default/mtls1", *base, env=env).returncode == 0


@pytest.mark.parametrize("args, needle", [
    (("-s", "http://127.0.0.1:1", "--tls"), "plain-text address but TLS was asked for"),
    (("-s", "https://127.0.0.1:1", "--cert-file", __file__), "both --cert-file and --key-file"),
    (("-s", "https://127.0.0.1:1", "--ca-file", "/no/such.pem"), "--ca-file: no such file"),
    (("-s", "https://127.0.0.1:1", "--token-file", "/no/such"), "--token-file: cannot read"),
    (("-s", "https://127.0.0.1:1", "--token", "a b"), "whitespace or control characters"),
    (("-s", "https://127.0.0.1:1", "--ca-file", __file__), "cannot load the TLS files"),
])
def test_bad_options_are_named(args, needle):
    r = danube("produce", "-m", "x", *args, timeout=30)
    clean_failure(r, needle)
