"""Upstream's credential keys of ``storage.durable``, each driven against a real server:
S3 `anonymous` (unsigned requests) and `profile` against SeaweedFS; `session_token` and
`role_arn` against moto's S3 server (SeaweedFS only takes session tokens it issued itself),
the role assumed through a local STS stand-in that records the AssumeRole call;
`virtual_host_style`; GCS `credentials_path` and `credentials_json` (a service account whose
token endpoint is a local stand-in, against fake-gcs-server)."""

import base64
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from danube.storage.durable import ObjectStoreConfigError, parse_durable
from objstore_servers import durable_config, server_for, store_from_config, unique_name
from ports import free_port


@pytest.fixture(scope="module")
def moto_s3():
    """moto's S3 server on 127.0.0.1 with bucket ``danube``: a real S3 API that accepts
    temporary credentials (it does not check signatures)."""
    binary = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    assert binary, "moto_server is not installed: run bash bin/test"
    port = free_port()
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        import boto3
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="a",
                     aws_secret_access_key="b").create_bucket(Bucket="danube")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _moto_config(url, **keys):
    return {"backend": "s3", "root": f"s3://danube/{unique_name()}", "endpoint": url,
            "region": "us-east-1", **keys}


class _LocalEndpoint:
    """A one-purpose HTTP server on 127.0.0.1 that records requests and answers with
    ``respond(path, body) -> (status, content_type, bytes)``."""

    def __init__(self, respond):
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append((self.path, dict(self.headers), body))
                status, ctype, payload = respond(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _record_headers(store):
    """The headers of every request the store's S3 client sends from now on."""
    seen = []
    store._client.meta.events.register(
        "before-send.s3", lambda request, **kw: seen.append(dict(request.headers)))
    return seen


def _round_trip(store):
    key = f"k-{unique_name()}"
    store.check()
    store.put(key, b"payload")
    assert store.get(key) == b"payload"


# ---------------------------------------------------------------- S3

def test_s3_anonymous_sends_unsigned_requests(request):
    server = server_for(request, "s3")
    mapping = durable_config("s3", server, access_key=None, secret_key=None,
                             root=f"s3://{server.public_bucket}/{unique_name()}",
                             anonymous=True, virtual_host_style=False)
    with store_from_config(mapping) as store:
        seen = _record_headers(store)
        _round_trip(store)
    assert seen and not any("Authorization" in h for h in seen)


def test_s3_anonymous_is_refused_outside_the_public_bucket(request):
    server = server_for(request, "s3")
    mapping = durable_config("s3", server, access_key=None, secret_key=None, anonymous=True)
    with store_from_config(mapping) as store:
        with pytest.raises(ObjectStoreConfigError, match="access denied"):
            store.check()


def test_s3_session_token_is_sent_with_the_keys(moto_s3):
    mapping = _moto_config(moto_s3, access_key="ASIATEMP", secret_key="temp-secret",
                           session_token="tok-123")
    with store_from_config(mapping) as store:
        seen = _record_headers(store)
        _round_trip(store)
    assert seen and all(h.get("X-Amz-Security-Token") in ("tok-123", b"tok-123") for h in seen)


def test_s3_profile_reads_the_shared_credentials_file(request, tmp_path, monkeypatch):
    server = server_for(request, "s3")
    creds = tmp_path / "credentials"
    creds.write_text(f"[danube-test]\naws_access_key_id = {server.access_key}\n"
                     f"aws_secret_access_key = {server.secret_key}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    mapping = durable_config("s3", server, access_key=None, secret_key=None,
                             profile="danube-test")
    with store_from_config(mapping) as store:
        _round_trip(store)
    with pytest.raises(ObjectStoreConfigError, match="no-such-profile"):
        store_from_config({**mapping, "profile": "no-such-profile"})


def test_s3_role_arn_assumes_the_role_through_sts(moto_s3, monkeypatch):
    role = "arn:aws:iam::123456789012:role/danube-writer"
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))

    def sts(path, body):
        xml = f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleResult><Credentials>
<AccessKeyId>ASIAASSUMED</AccessKeyId><SecretAccessKey>assumed-secret</SecretAccessKey>
<SessionToken>assumed-token</SessionToken><Expiration>{expires}</Expiration>
</Credentials><AssumedRoleUser><Arn>{role}/danube-broker</Arn>
<AssumedRoleId>AROA:danube-broker</AssumedRoleId></AssumedRoleUser>
</AssumeRoleResult></AssumeRoleResponse>"""
        return 200, "text/xml", xml.encode()

    endpoint = _LocalEndpoint(sts)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", endpoint.url)
        # The source credentials sign only the STS call; S3 sees the assumed ones.
        mapping = _moto_config(moto_s3, access_key="source-key", secret_key="source-secret",
                               role_arn=role)
        with store_from_config(mapping) as store:
            seen = _record_headers(store)
            _round_trip(store)
    finally:
        endpoint.close()
    assert len(endpoint.requests) == 1
    form = urllib.parse.parse_qs(endpoint.requests[0][2].decode())
    assert form["Action"] == ["AssumeRole"] and form["RoleArn"] == [role]
    assert form["RoleSessionName"] == ["danube-broker"]
    assert "source-key" in endpoint.requests[0][1]["Authorization"]
    assert seen and all(h.get("X-Amz-Security-Token") in ("assumed-token", b"assumed-token")
                        for h in seen)
    assert all("Credential=ASIAASSUMED/" in str(h["Authorization"]) for h in seen)


@pytest.mark.parametrize("virtual, style", [(True, "virtual"), (False, "path")])
def test_s3_virtual_host_style_sets_the_addressing_style(virtual, style):
    cfg = parse_durable({"backend": "s3", "root": "s3://b/p", "virtual_host_style": virtual})
    assert cfg.path_style is (not virtual)
    from danube.storage.durable import open_object_store
    with open_object_store(cfg) as store:
        assert store._client.meta.config.s3["addressing_style"] == style


# ---------------------------------------------------------------- GCS

def _service_account(token_url):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    info = {"type": "service_account", "project_id": "danube-test",
            "private_key_id": "k1", "private_key": pem,
            "client_email": "danube@danube-test.iam.gserviceaccount.com",
            "client_id": "1", "token_uri": token_url}
    return info, key.public_key()


def _token_endpoint():
    def token(path, body):
        reply = {"access_token": "gcs-token", "expires_in": 3600, "token_type": "Bearer"}
        return 200, "application/json", json.dumps(reply).encode()
    return _LocalEndpoint(token)


def _check_grant(endpoint, public_key):
    """The token request is a JWT bearer grant signed with the service account's key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    assert endpoint.requests
    form = urllib.parse.parse_qs(endpoint.requests[0][2].decode())
    assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    header, claims, signature = form["assertion"][0].split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    public_key.verify(base64.urlsafe_b64decode(pad(signature)), f"{header}.{claims}".encode(),
                      padding.PKCS1v15(), hashes.SHA256())
    assert json.loads(base64.urlsafe_b64decode(pad(claims)))["iss"].startswith("danube@")


@pytest.mark.parametrize("inline", [True, False], ids=["credentials_json", "credentials_path"])
def test_gcs_service_account_credentials(request, tmp_path, inline):
    server = server_for(request, "gcs")
    endpoint = _token_endpoint()
    try:
        info, public_key = _service_account(endpoint.url + "/token")
        if inline:
            extra = {"credentials_json": json.dumps(info)}
        else:
            path = tmp_path / "sa.json"
            path.write_text(json.dumps(info))
            extra = {"credentials_path": str(path)}
        with store_from_config(durable_config("gcs", server, **extra)) as store:
            _round_trip(store)
    finally:
        endpoint.close()
    _check_grant(endpoint, public_key)


def test_gcs_credentials_json_that_is_not_json_is_a_config_error(request):
    server = server_for(request, "gcs")
    with pytest.raises(ObjectStoreConfigError, match="credentials_json: not valid JSON"):
        store_from_config(durable_config("gcs", server, credentials_json="{nope"))
