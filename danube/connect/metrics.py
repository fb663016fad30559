"""The connector's Prometheus metrics, named as upstream's danube-connect-core
(``danube_connector_*``, labels ``connector`` and ``topic``), plus ours for what upstream
leaves out: dead letters, the external system's retries, lag and batch latency."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30)


class ConnectorMetrics:
    def __init__(self, connector):
        self.connector = connector
        self.registry = r = CollectorRegistry()
        labels = ("connector", "topic")
        self.received = Counter("danube_connector_messages_received",
                                "Records taken from the source (sources: the external system; "
                                "sinks: the topic)", labels, registry=r)
        self.processed = Counter("danube_connector_messages_processed",
                                 "Records delivered (sources: acked by the broker; sinks: "
                                 "written to the external system)", labels, registry=r)
        self.failed = Counter("danube_connector_messages_failed",
                              "Records that failed for good (dead-lettered, or dropped when "
                              "no dead-letter topic is set)", labels, registry=r)
        self.dead_lettered = Counter("danube_connector_messages_dead_lettered",
                                     "Records published to the dead-letter topic", labels,
                                     registry=r)
        self.retried = Counter("danube_connector_messages_retried",
                               "Retries of a batch, by the side that failed "
                               "(external or broker)", ("connector", "target"), registry=r)
        self.errors = Counter("danube_connector_errors",
                              "Errors seen, by kind", ("connector", "kind"), registry=r)
        self.batch_size = Histogram("danube_connector_batch_size", "Records per batch",
                                    ("connector",), registry=r,
                                    buckets=(1, 10, 100, 500, 1000, 5000, 10000, 100000))
        self.batch_latency = Histogram("danube_connector_batch_duration_seconds",
                                       "Time from taking a batch to committing it",
                                       ("connector",), registry=r, buckets=_LATENCY_BUCKETS)
        self.inflight = Gauge("danube_connector_inflight_messages",
                              "Records taken and not yet committed", ("connector",), registry=r)
        self.lag = Gauge("danube_connector_lag_seconds",
                         "Age of the newest record committed (now - its publish time)",
                         ("connector",), registry=r)
        self.health = Gauge("danube_connector_health",
                            "1 when ready (broker and external system reachable), else 0",
                            ("connector",), registry=r)
        self.health.labels(connector).set(0)

    def render(self):
        return generate_latest(self.registry)

    def count(self, counter, topic, n=1):
        if n:
            counter.labels(self.connector, topic).inc(n)

    def retry(self, target):
        self.retried.labels(self.connector, target).inc()

    def error(self, kind):
        self.errors.labels(self.connector, kind).inc()
