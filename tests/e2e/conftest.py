"""Fixtures shared by the e2e modules that start their own `broker` (a BrokerProcess
fixture of the module): an admin-port client and a client-port client on it. A module's own
fixture of the same name takes precedence."""

import pytest

from danube.client import DanubeClient
from danube.client.admin import AdminClient


@pytest.fixture
async def admin(broker):
    client = AdminClient(f"http://{broker.admin_addr}")
    yield client
    await client.close()


@pytest.fixture
async def client(broker):
    c = DanubeClient(f"http://{broker.client_addr}")
    yield c
    await c.close()
