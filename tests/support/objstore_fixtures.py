"""Session fixtures for the object-store emulators (tests/support/objstore_servers.py), registered
in conftest.py. Each server starts the first time a test asks for it, is shared by the rest
of the session, and is stopped at teardown. A server that is not installed fails the test
with a message saying to run ``bash bin/test``: a silently skipped backend would pass CI
without testing it."""

import os

import pytest

import objstore_servers
from objstore_servers import Azurite, FakeGCS, SeaweedFS, ServerNotInstalled


@pytest.fixture(scope="session", autouse=True)
def _no_cloud_metadata_probes():
    # Without explicit credentials boto3 and google-auth ask the cloud metadata address
    # (169.254.169.254) for some; no test may send traffic off the machine.
    saved = {k: os.environ.get(k) for k in ("AWS_EC2_METADATA_DISABLED", "NO_GCE_CHECK")}
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["NO_GCE_CHECK"] = "True"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def serve(cls, tmp_path_factory):
    """A started ``cls`` (an objstore_servers server) in a directory of its own; the test
    fails, saying what to install, when the server is not installed."""
    try:
        server = cls(tmp_path_factory.mktemp(cls.__name__.lower()))
    except ServerNotInstalled as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory):
    """A running objstore_servers.SeaweedFS (S3 at ``.endpoint``, bucket ``.bucket``,
    credentials ``.access_key``/``.secret_key``)."""
    server = serve(SeaweedFS, tmp_path_factory)
    yield server
    server.close()


@pytest.fixture(scope="session")
def fake_gcs_server(tmp_path_factory):
    """A running objstore_servers.FakeGCS (filesystem backend; bucket ``.bucket``)."""
    server = serve(FakeGCS, tmp_path_factory)
    yield server
    server.close()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory):
    """A running objstore_servers.Azurite (``.endpoint`` includes the account; container
    ``.container``; ``.account_name``/``.account_key``)."""
    server = serve(Azurite, tmp_path_factory)
    yield server
    server.close()


@pytest.fixture
def objstore_server(request):
    """Indirect-parametrize with a kind (memory, fs, s3, gcs, azblob): the running server of
    that kind, None for memory and fs."""
    return objstore_servers.server_for(request, request.param)
