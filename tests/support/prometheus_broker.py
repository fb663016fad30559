"""Module fixtures for tests that need a broker process with its Prometheus exporter and a
real Prometheus scraping it (the admin UI's API and the MCP server's metric tools).
Import them into the test module: ``from prometheus_broker import broker, broker_id,
prometheus``."""

import asyncio

import pytest

from broker_process import BrokerProcess
from danube.client.admin import AdminClient
from prometheus_process import PrometheusProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0",
                      data_dir=tmp_path_factory.mktemp("prom-broker")).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def broker_id(broker):
    async def ask():
        async with AdminClient(f"http://{broker.admin_addr}") as a:
            return (await a.call("BrokerAdmin", "ListBrokers")).brokers[0].broker_id
    return asyncio.run(ask())


@pytest.fixture(scope="module")
def prometheus(broker, broker_id, tmp_path_factory):
    p = PrometheusProcess(tmp_path_factory.mktemp("prom"),
                          {f"127.0.0.1:{broker.prom_port}": broker_id}).start()
    yield p
    p.stop()
