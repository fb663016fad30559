"""TLS on the broker's ports (issue 22): mTLS as an option (auth.tls.require_client_cert),
clean handshake failures for a missing or wrong client certificate and for plaintext, and
the certificate reloaded on SIGHUP without dropping connections."""

import signal
import socket
import ssl

import grpc
import pytest
import trustme

from danube.proto import DanubeApi_pb2 as pb
from secure_broker import Caller, SUPER, broker_fixture, start_secure, token
from waiting import wait_for

pytestmark = pytest.mark.timeout(120)

LOOKUP = "/danube.Discovery/TopicLookup"


def _lookup_via(channel, tok):
    fn = channel.unary_unary(LOOKUP, request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=pb.TopicLookupResponse.FromString)
    md = [("authorization", f"Bearer {tok}")] if tok else []
    try:
        fn(pb.TopicLookupRequest(request_id=1, topic="/default/t"), metadata=md, timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


mtls = broker_fixture("mtls", tls_extra=", require_client_cert: true")


def test_mtls_with_the_right_client_certificate_and_a_token(mtls, certs):
    creds = grpc.ssl_channel_credentials(certs.ca_pem, certs.client_key_pem,
                                         certs.client_chain_pem)
    with grpc.secure_channel(mtls.client_addr, creds) as ch:
        assert _lookup_via(ch, token(SUPER)) in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND)
        # The certificate is not a credential by itself: the token is still required.
        assert _lookup_via(ch, None) == grpc.StatusCode.UNAUTHENTICATED
    assert "(mTLS)" in mtls.log()


def test_mtls_without_a_client_certificate_fails_the_handshake(mtls, certs):
    creds = grpc.ssl_channel_credentials(certs.ca_pem)
    with grpc.secure_channel(mtls.client_addr, creds) as ch:
        assert _lookup_via(ch, token(SUPER)) == grpc.StatusCode.UNAVAILABLE


def test_mtls_with_a_certificate_from_another_ca_fails_the_handshake(mtls, certs):
    stranger = trustme.CA().issue_cert("client.test")
    creds = grpc.ssl_channel_credentials(
        certs.ca_pem, stranger.private_key_pem.bytes(),
        b"".join(p.bytes() for p in stranger.cert_chain_pems))
    with grpc.secure_channel(mtls.client_addr, creds) as ch:
        assert _lookup_via(ch, token(SUPER)) == grpc.StatusCode.UNAVAILABLE
    # Handshake failures are not broker errors: no traceback, one warning for the lot (at
    # most one a minute), and the port still serves.
    wait_for(lambda: "TLS handshake failed" in mtls.log(), timeout=30,
             what="the failed handshake in the log")
    assert "Traceback" not in mtls.log()
    assert mtls.log().count("TLS handshake failed") == 1
    ok = grpc.ssl_channel_credentials(certs.ca_pem, certs.client_key_pem,
                                      certs.client_chain_pem)
    with grpc.secure_channel(mtls.client_addr, ok) as ch:
        assert _lookup_via(ch, token(SUPER)) != grpc.StatusCode.UNAVAILABLE


def test_plaintext_and_garbage_on_the_tls_port_are_dropped_quietly(tmp_path, certs):
    b = start_secure(tmp_path, certs)
    try:
        for junk in (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n",
                     b"\x16\x03\x01\x00\x05hello"):
            with socket.create_connection(("127.0.0.1", b.client_port), timeout=5) as s:
                s.sendall(junk)
                s.settimeout(5)
                try:
                    while s.recv(4096):
                        pass
                except (ConnectionResetError, socket.timeout):
                    pass
        wait_for(lambda: "TLS handshake failed" in b.log(), timeout=30,
                 what="the failed handshake in the log")
        assert "Traceback" not in b.log() and " ERROR " not in b.log()
        assert b.log().count("TLS handshake failed") == 1
        c = Caller(b.client_addr, certs)
        assert c.code(LOOKUP, pb.TopicLookupRequest(request_id=1, topic="/default/t"),
                      pb.TopicLookupResponse, token=token(SUPER))[0] != \
            grpc.StatusCode.UNAVAILABLE
        c.close()
    finally:
        assert b.stop() == 0


def _handshake(port, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert()["serialNumber"]


def test_sighup_reloads_the_certificate_without_dropping_connections(tmp_path, certs):
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    certs.server_cert.private_key_pem.write_to_path(str(key))
    certs.server_cert.cert_chain_pems[0].write_to_path(str(cert))
    b = start_secure(tmp_path, certs, cert_files=(str(cert), str(key)))
    try:
        before = _handshake(b.client_port, certs.ca_file)
        old_channel = Caller(b.client_addr, certs)
        request = (LOOKUP, pb.TopicLookupRequest(request_id=1, topic="/default/t"),
                   pb.TopicLookupResponse)
        assert old_channel.code(*request, token=token(SUPER))[0] != grpc.StatusCode.UNAVAILABLE
        # A new certificate from another CA replaces the files.
        ca2 = trustme.CA()
        new = ca2.issue_cert("127.0.0.1", "localhost")
        new.private_key_pem.write_to_path(str(key))
        new.cert_chain_pems[0].write_to_path(str(cert))
        ca2_file = tmp_path / "ca2.pem"
        ca2.cert_pem.write_to_path(str(ca2_file))
        b.proc.send_signal(signal.SIGHUP)
        assert b.wait_for_log("TLS certificate reloaded")
        after = _handshake(b.client_port, str(ca2_file))
        assert after != before
        with pytest.raises(ssl.SSLError):
            _handshake(b.client_port, certs.ca_file)
        # The connection made before the reload carries on.
        assert old_channel.code(*request, token=token(SUPER))[0] != grpc.StatusCode.UNAVAILABLE
        old_channel.close()
        # A broken file on the next SIGHUP keeps the current certificate.
        cert.write_text("not a certificate")
        b.proc.send_signal(signal.SIGHUP)
        assert b.wait_for_log("TLS reload failed, still serving the previous certificate")
        assert _handshake(b.client_port, str(ca2_file)) == after
    finally:
        assert b.stop() == 0


def test_sighup_without_tls_is_harmless(tmp_path):
    from broker_process import BrokerProcess
    b = BrokerProcess(data_dir=tmp_path / "d").start()
    try:
        b.proc.send_signal(signal.SIGHUP)
        assert b.wait_for_log("SIGHUP ignored")
        assert b.proc.poll() is None
    finally:
        assert b.stop() == 0


def test_mtls_needs_a_ca_file(tmp_path, certs):
    import subprocess
    import sys
    from secure_broker import broker_yaml
    path = broker_yaml(tmp_path, certs, tls_extra=", require_client_cert: true")
    text = open(path).read().replace(f', ca_file: "{certs.ca_file}"', "")
    open(path, "w").write(text)
    r = subprocess.run([sys.executable, "-P", "-m", "danube", "broker", "--mode", "standalone",
                        "--data-dir", str(tmp_path / "d"), "--config-file", path],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "require_client_cert needs auth.tls.ca_file" in r.stderr


