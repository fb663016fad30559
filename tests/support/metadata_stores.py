"""The `store` fixture shared by the metadata test modules: each test runs on the in-memory
store, on the embedded (SQLite) one and on etcd (a real etcd per module, wiped between
tests), plus the `etcd_server` fixture that etcd comes from."""

import pytest

from danube.metadata import EmbeddedStore, MemoryStore
from danube.metadata.etcd import EtcdStore
from etcd_process import EtcdProcess

STORE_KINDS = ["memory", "embedded", "etcd"]


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    """A running tests/support/etcd_process.EtcdProcess, one per test module."""
    try:
        server = EtcdProcess(tmp_path_factory.mktemp("etcd"))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    server.start()
    yield server
    server.stop()


async def open_store(kind, path, request):
    """A started store of ``kind``; etcd's comes with an empty keyspace."""
    if kind == "memory":
        return await MemoryStore.open()
    if kind == "embedded":
        return await EmbeddedStore.open(path)
    etcd = request.getfixturevalue("etcd_server")
    etcd.wipe()
    return await EtcdStore.open([etcd.endpoint])


@pytest.fixture(params=STORE_KINDS)
async def store(request, tmp_path):
    s = await open_store(request.param, tmp_path / "metadata", request)
    yield s
    await s.close()
