"""Prometheus exporter (upstream metric names, reference (g)). Metrics are read from the live
objects at scrape time, so the data paths never touch a metrics library."""

import logging

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from danube.rpc.status import StatusCode

log = logging.getLogger("danube.metrics")


class BrokerCollector:
    def __init__(self, broker):
        self.broker = broker

    def collect(self):
        rpc = CounterMetricFamily("danube_broker_rpc", "gRPC calls finished by this broker",
                                  labels=["method", "code"])
        for server in self.broker.rpc_servers():
            for (method, code), count in list(server.rpc_counts.items()):
                rpc.add_metric([method, StatusCode(code).name], count)
        yield rpc
        topics = GaugeMetricFamily("danube_broker_topics_owned",
                                   "Topics served by this broker")
        topics.add_metric([], self.broker.topics_owned())
        yield topics


class MetricsExporter:
    def __init__(self, broker, host, port):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker))
        self.host = host
        self.port = port
        self._server = None
        self._thread = None

    def start(self):
        self._server, self._thread = start_http_server(self.port, self.host, self.registry)
        self.port = self._server.server_port
        return self.port

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
