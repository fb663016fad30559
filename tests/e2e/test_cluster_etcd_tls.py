"""etcd over TLS (``meta_store.etcd_tls``, ``https://`` endpoints): a real etcd serving https
with a certificate of the test CA and asking clients for theirs (``--client-cert-auth``).

The store works over it (calls and watches); a broker without the CA, or without a client
certificate, is refused with a message naming TLS rather than retrying for ever; two
brokers form a cluster over it, and the flags do what the keys do."""

import asyncio
import subprocess
import sys

import pytest

from cluster_process import ClusterBrokers
from danube.config_cluster import EtcdTLS
from danube.metadata.errors import MetadataError
from danube.metadata.etcd import EtcdStore
from etcd_process import EtcdProcess
from secure_broker import write_server_files
from waiting import wait_for


@pytest.fixture(scope="module")
def etcd(tmp_path_factory, certs):
    cert, key = write_server_files(certs)
    server = EtcdProcess(tmp_path_factory.mktemp("etcd-tls"), tls={
        "cert_file": cert, "key_file": key, "ca_file": certs.ca_file,
        "client_cert_file": certs.client_cert_file, "client_key_file": certs.client_key_file})
    server.start()
    yield server
    server.stop()


def client_tls(certs):
    return EtcdTLS(ca_file=certs.ca_file, cert_file=certs.client_cert_file,
                   key_file=certs.client_key_file)


async def test_store_calls_and_watches_over_tls(etcd, certs):
    for endpoint in (etcd.endpoint, etcd.url):       # no scheme: https because of tls
        async with await EtcdStore.open([endpoint], tls=client_tls(certs)) as store:
            watch = await store.watch("/tls/")
            await store.put("/tls/a", {"x": 1}, ttl=5)
            assert await store.get("/tls/a") == {"x": 1}
            event = await asyncio.wait_for(anext(watch), 5)
            assert (event.key, event.value) == ("/tls/a", {"x": 1})
            watch.close()
            await store.delete("/tls/a")


@pytest.mark.parametrize("tls, message", [
    ("no-ca", "certificate verify failed"),
    ("no-client-cert", "TLS to etcd at 127.0.0.1"),
])
async def test_a_refused_certificate_is_a_clear_error(etcd, certs, tls, message):
    tls = EtcdTLS(ca_file=None) if tls == "no-ca" else EtcdTLS(ca_file=certs.ca_file)
    with pytest.raises(MetadataError, match=message):
        await EtcdStore.open([etcd.url], tls=tls, retry_for=30)


async def test_plain_http_to_a_tls_etcd_fails(etcd):
    with pytest.raises(MetadataError):
        await EtcdStore.open([f"http://{etcd.endpoint}"], retry_for=1)


def test_two_brokers_form_a_cluster_over_tls(etcd, certs, tmp_path):
    tls = {"ca_file": certs.ca_file, "cert_file": certs.client_cert_file,
           "key_file": certs.client_key_file}
    brokers = ClusterBrokers(etcd, tmp_path / "file", lease=3, etcd_tls=tls)
    flags = ClusterBrokers(etcd, tmp_path / "flags", lease=3)     # no etcd_tls in the file
    try:
        brokers.start(1)
        flags.add("b1", "--etcd-endpoints", etcd.url, "--etcd-ca-file", certs.ca_file,
                  "--etcd-cert-file", certs.client_cert_file,
                  "--etcd-key-file", certs.client_key_file)
        ids = {b.broker_id for b in brokers.brokers + flags.brokers}
        assert len(ids) == 2 and None not in ids
        out = subprocess.run(
            [sys.executable, "-P", "-m", "danube", "admin", "brokers", "list", "--endpoint",
             f"http://{brokers.brokers[0].admin_addr}"], capture_output=True, text=True,
            timeout=60)
        assert out.returncode == 0, out.stderr
        assert all(i in out.stdout for i in ids), out.stdout
    finally:
        flags.stop()
        brokers.stop()


def test_a_broker_without_the_ca_stops_with_a_clear_message(etcd, tmp_path):
    brokers = ClusterBrokers(etcd, tmp_path, lease=3, etcd_tls={})
    try:
        try:
            brokers.add("b0", timeout=20)
        except RuntimeError:
            pass        # "broker exited", if the exit was seen before the end of its output
        broker = brokers.brokers[0]
        assert broker.proc.wait(20) != 0
        wait_for(lambda: "TLS to etcd" in broker.log(), what="the reason in its output")
        log = broker.log()
        assert "Traceback" not in log, log[-2000:]
        assert "broker ready" not in log
    finally:
        brokers.stop()
