"""Shared fixtures. The gRPC transport fixtures run a danube.rpc Server with the test service
of tests/support/rpc_fixtures.py in a uvloop loop on a background thread; every server a fixture
starts is stopped at teardown."""

import os
import sys

import pytest
from hypothesis import settings

# No per-example time limit (hypothesis' default is 200 ms): an example that takes 500 ms
# on a loaded machine is slow, not wrong. Speed is measured in bench/, never asserted here.
settings.register_profile("danube", deadline=None)
settings.load_profile("danube")

# The helpers both kinds of test share (tests/support/) import as top-level modules.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

# Each xdist worker in its own session: the CPU is shared per session (worker_sessions.py).
pytest_plugins = ("worker_sessions",)

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


#: The slowest test files, slowest first (seconds each took in a whole run of bin/test on the
#: 2-core machine, docs/testing.md): under --dist loadfile they are handed to the workers
#: before any other file, longest first, so that no long file starts late and runs alone at
#: the end. (xdist's own order is by the number of tests in a file, which puts a one-test
#: file that runs for minutes last.) Files under ~20 s fill the gaps in any order.
HEAVY_FIRST = (
    "tests/e2e/test_packaging.py",          # 177: PyInstaller build, attack suites
    "tests/e2e/test_spark_connector.py",    # 142
    "tests/e2e/test_spark_cluster.py",      # 138: Spark standalone + 3 brokers
    "tests/e2e/test_spark_oldest.py",       # 128: the connector's tests on PySpark 4.0.0
    "tests/e2e/test_soak.py",               # 123: a two-minute soak
    "tests/e2e/test_connect_iceberg.py",    # ~120: the SQL and REST catalogs' kills
    "tests/e2e/test_cluster_paused_owner.py",   # ~75: 3 clusters, SIGSTOP past the lease
    "tests/e2e/test_connect_deltalake.py",  # 65: a 30 s S3 outage
    "tests/e2e/test_tiered_e2e.py",         # 64
    "tests/e2e/test_edge_resilience.py",    # 64: a 60 s link cut
    "tests/mutation/test_mutants.py",       # 55
    "tests/e2e/test_cluster_write_buffer.py",   # 53
    "tests/e2e/test_connect_mqtt.py",       # 51: a 30 s MQTT broker outage
    "tests/e2e/test_rate_policies.py",      # 46
    "tests/e2e/test_cluster_object_store.py",   # 43
    "tests/e2e/test_connect_postgres_sink.py",  # 42: a 30 s PostgreSQL outage
    "tests/e2e/test_cluster_roll.py",       # 36
    "tests/e2e/test_cluster_fence_recovery.py",  # 36
    "tests/e2e/test_cluster_failover.py",   # 31
    "tests/e2e/test_admin_console.py",      # 29
    "tests/e2e/test_cluster_up.py",         # 25
    "tests/e2e/test_cluster_up_lossless.py",    # ~50: cluster up twice, a kill -9 each
    "tests/e2e/test_connect_qdrant.py",     # ~30
    "tests/e2e/test_cluster_orphaned.py",   # ~30
    "tests/e2e/test_objstore_backends.py",  # 24
    "tests/e2e/test_connect_mqtt_client.py",    # 23
)


@pytest.hookimpl(optionalhook=True)     # a run without pytest-xdist has no such hook
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            for path in HEAVY_FIRST:
                if path in self.workqueue:
                    self.workqueue.move_to_end(path, last=False)
                    break
            super()._assign_work_unit(node)

    return HeavyFirst(config, log)
