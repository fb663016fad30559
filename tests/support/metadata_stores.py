"""The `store` fixture shared by the metadata test modules: each test runs on the in-memory
store and on the embedded (SQLite) one."""

import pytest

from danube.metadata import EmbeddedStore, MemoryStore


@pytest.fixture(params=["memory", "embedded"])
async def store(request, tmp_path):
    if request.param == "memory":
        s = await MemoryStore.open()
    else:
        s = await EmbeddedStore.open(tmp_path / "metadata")
    yield s
    await s.close()
