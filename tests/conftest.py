"""Shared fixtures. The gRPC transport fixtures run a danube.rpc Server with the test service
of tests/support/rpc_fixtures.py in a uvloop loop on a background thread; every server a fixture
starts is stopped at teardown."""

import os
import sys

import pytest

# The helpers both kinds of test share (tests/support/) import as top-level modules.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

from rpc_fixtures import Certs, ServerThread  # noqa: E402

from danube.rpc.connection import TransportConfig  # noqa: E402


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """trustme CA plus server (127.0.0.1/localhost) and client certificates."""
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def server_factory():
    """`server_factory(**kwargs)` starts a ServerThread (config=, compression=,
    ssl_context=, port=); all are stopped at teardown."""
    started = []

    def make(**kwargs):
        srv = ServerThread(**kwargs).start()
        started.append(srv)
        return srv

    yield make
    for srv in reversed(started):
        srv.stop()


@pytest.fixture(scope="module")
def rpc_server():
    """Plain-text server with the test service, shared by a module's tests."""
    srv = ServerThread().start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tls_server(certs):
    srv = ServerThread(ssl_context=certs.server_context()).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def mtls_server(certs):
    srv = ServerThread(ssl_context=certs.server_context(require_client_cert=True)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def gzip_server():
    """Server(compression="gzip"): responses compressed when the client accepts gzip."""
    srv = ServerThread(compression="gzip").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def small_limit_server():
    """TransportConfig(max_message_size=1 MiB)."""
    srv = ServerThread(config=TransportConfig(max_message_size=1 << 20)).start()
    yield srv
    srv.stop()


# Object-store emulators (SeaweedFS, fake-gcs-server, Azurite) as session fixtures.
from objstore_fixtures import (_no_cloud_metadata_probes, azurite_server,  # noqa: E402,F401
                               fake_gcs_server, objstore_server, seaweedfs_server)

# `store`: a metadata store, in memory, embedded (SQLite) and on etcd, for the metadata
# test modules (test_objstore_backends has a `store` of its own).
from metadata_stores import etcd_server, store  # noqa: E402,F401
