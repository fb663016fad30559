"""Prometheus exporter (upstream metric names, reference (g)). Metrics are read from the live
objects at scrape time, so the data paths never touch a metrics library. Every name
upstream v0.15.1 exports is here with its labels (docs/metrics.md says where each is fed);
ours, marked so, are beside them. Upstream's histograms are rendered as its exporter renders
them without buckets: summaries."""

import json
import logging
import re
import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from danube.broker import reliable
from danube.broker.subscription import KEY_SHARED
from danube.rpc.status import StatusCode
from danube.services.metrics_storage import add_summary, storage_metrics, summary

log = logging.getLogger("danube.metrics")


class BrokerCollector:
    def __init__(self, broker):
        self.broker = broker

    def collect(self):
        # Upstream's exporter adds the broker's id to every series (a global label).
        core = self.broker.core
        broker_id = None if core is None else core.broker_id
        for family in self._families():
            if broker_id is not None:
                family.samples = [s._replace(labels={**s.labels, "broker": str(broker_id)})
                                  for s in family.samples]
            yield family

    def _families(self):
        # Upstream's labels (service, method, result) and our status code beside them.
        rpc = CounterMetricFamily("danube_broker_rpc", "gRPC calls finished by this broker",
                                  labels=["service", "method", "result", "code"])
        for server in self.broker.rpc_servers():
            for (path, code), count in list(server.rpc_counts.items()):
                service, method = _rpc_labels(path)
                rpc.add_metric([service, method, "ok" if code == 0 else "error",
                                StatusCode(code).name], count)
        yield rpc
        polls = reliable.POLLS
        yield _counter("danube_dispatcher_notifier_polls", "Reliable dispatcher passes woken "
                       "by new messages, acks or consumers", polls["notifier"])
        yield _counter("danube_dispatcher_heartbeat_polls", "Reliable dispatcher passes woken "
                       "by the heartbeat timer", polls["heartbeat"])
        topics = GaugeMetricFamily("danube_broker_topics_owned",
                                   "Topics served by this broker")
        topics.add_metric([], self.broker.topics_owned())
        yield topics
        loaded = GaugeMetricFamily("danube_broker_topics_loaded",
                                   "Topics served by this broker that are loaded in memory "
                                   "(the others rest until their next use)")
        loaded.add_metric([], self.broker.topics_loaded())
        yield loaded
        guard = getattr(self.broker, "guard", None)
        if guard is not None:
            yield from _authz_metrics(guard)
        else:
            # No RBAC (auth.mode none): nothing is ever checked, as upstream's zeros.
            yield _counter("danube_authz_allow", "Calls an RBAC check allowed", 0)
            yield _counter("danube_authz_deny", "Calls an RBAC check denied", 0)
        core = self.broker.core
        if core is not None:
            yield from _topic_metrics(core)
            yield from storage_metrics(core)
            yield from _exhaustion_metrics(core.logs)
            if core.tiered is not None:
                yield from _storage_metrics(core.tiered)
            if core.write_buffer is not None:
                yield from _write_buffer_metrics(core.write_buffer)
        cluster = getattr(self.broker, "cluster", None)
        if cluster is not None:
            yield from _cluster_metrics(cluster)
        else:
            yield from _standalone_cluster_metrics()


def _gauge(name, doc, value):
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _counter(name, doc, value):
    family = CounterMetricFamily(name, doc)
    family.add_metric([], value)
    return family


_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def _rpc_labels(path):
    """``/danube.ProducerService/SendMessage`` -> ("producer", "send_message"), upstream's
    spelling of its service and method labels."""
    service, _, method = path.lstrip("/").partition("/")
    service = service.rsplit(".", 1)[-1].removesuffix("Service") or service
    return _SNAKE.sub("_", service).lower(), _SNAKE.sub("_", method).lower()


def _standalone_cluster_metrics():
    """Upstream registers its cluster metrics in every mode; a standalone broker is the
    leader of its one-broker cluster and never assigns, redirects or rebalances."""
    yield _gauge("danube_leader_election_state", "1 on the cluster leader, else 0", 1)
    yield _counter("danube_broker_assignments", "Topics placed by this broker as leader", 0)
    yield _counter("danube_client_redirects", "Lookups answered with another broker", 0)
    yield _counter("danube_rebalancing_moves", "Topic moves made by automatic rebalancing", 0)
    yield _counter("danube_rebalancing_failures", "Automatic rebalancing moves that failed", 0)
    yield _gauge("danube_cluster_imbalance_cv", "Coefficient of variation of the active "
                 "brokers' load at the leader's last rebalancing check", 0.0)
    yield summary("danube_rebalancing_cycle_duration_seconds",
                  "Duration of an automatic rebalancing check (s)", [])


def _cluster_metrics(cluster):
    """Cluster mode on etcd: upstream's leader, assignment and redirect metrics, and ours for
    the metadata connection and the fence."""
    conn = cluster.store.conn
    yield _gauge("danube_leader_election_state", "1 on the cluster leader, else 0",
                 1 if cluster.is_leader else 0)
    assignments = CounterMetricFamily("danube_broker_assignments",
                                      "Topic assignments made by this broker as leader",
                                      labels=["broker_id", "action"])
    for (broker_id, action), count in list(cluster.manager.assignments.items()):
        assignments.add_metric([broker_id, action], count)
    yield assignments
    redirects = CounterMetricFamily("danube_client_redirects",
                                    "Lookups answered with another broker",
                                    labels=["reason", "topic_ns"])
    for (reason, ns), count in list(cluster.redirects.items()):
        redirects.add_metric([reason, ns], count)
    yield redirects
    rebalancer = cluster.rebalancer
    moves = CounterMetricFamily("danube_rebalancing_moves", "Topic moves made by automatic "
                                "rebalancing on this broker as leader", labels=["reason"])
    moves.add_metric(["LoadImbalance"], rebalancer.moves_total)     # upstream's only reason
    yield moves
    yield _counter("danube_rebalancing_failures", "Automatic rebalancing moves that failed",
                   rebalancer.failures_total)
    yield _gauge("danube_cluster_imbalance_cv", "Coefficient of variation of the active "
                 "brokers' load at the leader's last rebalancing check", rebalancer.last_cv)
    cycles = summary("danube_rebalancing_cycle_duration_seconds",
                     "Duration of an automatic rebalancing check (s)", [])
    add_summary(cycles, [], rebalancer.cycle_seconds)
    yield cycles
    yield _gauge("danube_metadata_store_up", "1 while etcd answers, 0 after a failed call",
                 1 if conn.available else 0)
    yield _counter("danube_metadata_store_failures", "Failed calls to etcd (each retried "
                   "with backoff while it may succeed)", conn.failures_total)
    yield _counter("danube_metadata_store_retries", "Retries of calls to etcd",
                   conn.retries_total)
    yield _gauge("danube_cluster_fenced", "1 while this broker is fenced (it serves no "
                 "topic until it has registered again)", 1 if cluster.membership.fenced else 0)
    yield _counter("danube_cluster_fences", "Times this broker fenced itself",
                   cluster.membership.fences)


def _authz_metrics(guard):
    # Upstream's danube_authz_allow_total / danube_authz_deny_total (prometheus_client adds
    # the _total), labelled as upstream's: the resource's scope and the permission.
    for name, doc, counts in (
            ("danube_authz_allow", "Calls an RBAC check allowed", guard.allowed),
            ("danube_authz_deny", "Calls an RBAC check denied", guard.denied)):
        family = CounterMetricFamily(name, doc, labels=["resource", "permission"])
        for (scope, permission), count in list(counts.items()):
            family.add_metric([scope, permission], count)
        yield family
    unauth = CounterMetricFamily("danube_authn_failures",
                                 "Calls refused as unauthenticated (ours)")
    unauth.add_metric([], guard.unauthenticated)
    yield unauth


def _topic_metrics(core):
    t_labels = ["topic"]
    s_labels = ["topic", "subscription"]
    c_labels = ["topic", "subscription", "consumer"]
    msgs_in = CounterMetricFamily("danube_topic_messages_in", "Messages published",
                                  labels=t_labels)
    bytes_in = CounterMetricFamily("danube_topic_bytes_in", "Payload bytes published",
                                   labels=t_labels)
    producers = GaugeMetricFamily("danube_topic_active_producers", "Producers", labels=t_labels)
    consumers = GaugeMetricFamily("danube_topic_active_consumers", "Active consumers",
                                  labels=t_labels)
    subs = GaugeMetricFamily("danube_topic_active_subscriptions", "Subscriptions",
                             labels=t_labels)
    sub_consumers = GaugeMetricFamily("danube_subscription_active_consumers",
                                      "Active consumers of a subscription", labels=s_labels)
    sent = CounterMetricFamily("danube_producer_messages_accepted",
                               "Messages accepted from a producer (ours)",
                               labels=["topic", "producer"])
    sends = CounterMetricFamily("danube_producer_send", "Sends at the API boundary (a "
                                "SendMessage, or one of our batches) by outcome",
                                labels=["topic", "result", "error_code"])
    send_ms = summary("danube_producer_send_latency_ms",
                      "Broker-side latency of an accepted send (ms)", t_labels)
    sizes = summary("danube_topic_message_size_bytes",
                    "Sizes of published payloads (bytes)", t_labels)
    out_msgs = CounterMetricFamily("danube_consumer_messages_out",
                                   "Messages handed to a consumer", labels=c_labels)
    out_bytes = CounterMetricFamily("danube_consumer_bytes_out",
                                    "Message bytes handed to a consumer", labels=c_labels)
    dropped = CounterMetricFamily("danube_consumer_dropped",
                                  "Non-reliable messages dropped because the consumer was "
                                  "too far behind (ours, not upstream)", labels=c_labels)
    unroutable = CounterMetricFamily(
        "danube_subscription_unroutable_skipped",
        "KeyShared messages whose key no connected consumer's key filters accept: skipped "
        "(on a reliable topic the cursor moves past them as if acked)", labels=s_labels)
    reliable = {
        "lag": GaugeMetricFamily("danube_subscription_lag_messages",
                                 "Messages published but not yet acked", labels=s_labels),
        "nacked": CounterMetricFamily("danube_subscription_nack", "Nacks", labels=s_labels),
        "redelivered": CounterMetricFamily("danube_subscription_redelivery", "Redeliveries",
                                           labels=s_labels),
        "ack_timeouts": CounterMetricFamily("danube_subscription_ack_timeout", "Ack timeouts",
                                            labels=s_labels),
        "stream_ended": CounterMetricFamily(
            "danube_subscription_stream_ended_unacked",
            "Deliveries whose consumer stream the client ended before acking them, counted "
            "as failed attempts (ours, not upstream)", labels=s_labels),
        "exhausted": CounterMetricFamily("danube_subscription_retry_exhausted",
                                         "Messages past max_redelivery_count", labels=s_labels),
        "dead_lettered": CounterMetricFamily("danube_subscription_dlq",
                                             "Messages sent to the dead-letter topic",
                                             labels=s_labels),
        "pending": GaugeMetricFamily("danube_subscription_pending_redelivery",
                                     "Messages waiting for redelivery", labels=s_labels),
        "blocked": GaugeMetricFamily("danube_subscription_terminal_blocked",
                                     "Messages blocked by the Block poison policy",
                                     labels=s_labels),
    }
    checked = CounterMetricFamily("danube_schema_validation",
                                  "Messages checked by a topic's schema validation (upstream)",
                                  labels=["topic", "policy"])
    failed = CounterMetricFamily("danube_schema_validation_failures",
                                 "Messages that failed schema validation, refused (enforce) or "
                                 "logged (warn) (upstream)", labels=["topic", "reason"])
    for topic in list(core.topics.values()):
        name = topic.name
        gate = topic.schema
        if gate is not None:
            checked.add_metric([name, gate.policy], gate.checked)
            for reason, count in gate.failures.items():
                failed.add_metric([name, reason], count)
        # Accepted sends are the latency summary's count.
        sends.add_metric([name, "ok", "OK"], topic.send_latency_ms.count)
        for (result, code), count in list(topic.send_results.items()):
            sends.add_metric([name, result, code], count)
        add_summary(send_ms, [name], topic.send_latency_ms)
        add_summary(sizes, [name], topic.message_sizes)
        msgs_in.add_metric([name], topic.messages_in)
        bytes_in.add_metric([name], topic.bytes_in)
        producers.add_metric([name], len(topic.producers))
        subs.add_metric([name], len(topic.subscriptions))
        active = 0
        for producer in topic.producers.values():
            sent.add_metric([name, producer.name], producer.sent)
        for sub in topic.subscriptions.values():
            n = len(sub.active_consumers())
            active += n
            sub_consumers.add_metric([name, sub.name], n)
            d = sub.dispatcher
            if sub.sub_type == KEY_SHARED:
                unroutable.add_metric([name, sub.name], d.stats["unroutable"] if d is not None
                                      else sub.fanout.unroutable)
            if d is not None:
                labels = [name, sub.name]
                reliable["lag"].add_metric(labels, d.lag)
                for stat in ("nacked", "redelivered", "ack_timeouts", "stream_ended",
                             "exhausted", "dead_lettered"):
                    reliable[stat].add_metric(labels, d.stats[stat])
                reliable["pending"].add_metric(labels, len(d.retry_payloads))
                reliable["blocked"].add_metric(
                    labels, len(d.blocked_keys) + (d.blocked_offset is not None))
            for c in sub.consumers.values():
                labels = [name, sub.name, c.name]
                out_msgs.add_metric(labels, c.outbox.delivered)
                out_bytes.add_metric(labels, c.outbox.delivered_bytes)
                dropped.add_metric(labels, c.outbox.dropped)
        consumers.add_metric([name], active)
    yield from (msgs_in, bytes_in, producers, consumers, subs, sub_consumers, sent, sends,
                send_ms, sizes, out_msgs,
                out_bytes, dropped, unroutable, *reliable.values(), checked, failed)


def _storage_metrics(tiered):
    """Tiered storage (ours; upstream has no storage metrics)."""
    stats = tiered.stats
    for name, key, doc in (
            ("danube_storage_uploaded_segments", "segments", "WAL segments uploaded"),
            ("danube_storage_uploaded_bytes", "bytes", "Bytes uploaded"),
            ("danube_storage_upload_failures", "failures", "Failed upload attempts (retried)"),
            ("danube_storage_history_reads", "history_reads", "Ranged reads of durable history"),
            ("danube_storage_history_messages", "history_messages",
             "Messages read from durable history"),
            ("danube_storage_history_read_failures", "read_failures",
             "Failed reads of durable history (retried)")):
        counter = CounterMetricFamily(name, doc)
        counter.add_metric([], stats[key])
        yield counter
    backlog = GaugeMetricFamily("danube_storage_upload_backlog_segments",
                                "Sealed WAL segments not uploaded yet")
    backlog.add_metric([], tiered.backlog())
    yield backlog
    durable = GaugeMetricFamily("danube_storage_durable_offset",
                                "The last offset in the durable tier", labels=["topic"])
    for name, tier in list(tiered.topics.items()):
        durable.add_metric([name], tier.uploaded_end)
    yield durable


def _exhaustion_metrics(logs):
    """The WAL volume and the descriptor limit (ours): is the disk full, how much is free,
    what was refused for lack of either."""
    state = logs.exhaustion()
    yield _gauge("danube_storage_disk_full", "1 while the WAL's volume is full: reliable "
                 "publishes are refused (RESOURCE_EXHAUSTED) until space is freed",
                 int(state["disk_full"] is not None))
    free = GaugeMetricFamily("danube_storage_free_bytes",
                             "Bytes free for the broker on the WAL's volume",
                             labels=["mount_point"])
    if state["free_bytes"] is not None:
        free.add_metric([state["mount_point"]], state["free_bytes"])
    yield free
    refused = CounterMetricFamily("danube_storage_refused_appends",
                                  "Appends and log openings refused for lack of a resource "
                                  "(reason: disk_full, descriptor_limit)", labels=["reason"])
    for reason, count in sorted(state["refused"].items()):
        refused.add_metric([reason], count)
    yield refused
    if state["nofile_soft"] is not None:
        yield _gauge("danube_process_nofile_limit", "The broker's RLIMIT_NOFILE (soft)",
                     state["nofile_soft"])
    orphaned = CounterMetricFamily(
        "danube_orphaned_messages", "Messages a past ownership's local WAL held that the "
        "topic's next owner never had (storage.failover lossy_local_wal), found since start; "
        "`danube admin topics republish-orphaned` publishes them again", labels=["topic"])
    for topic, count in sorted(logs.orphaned.items()):
        orphaned.add_metric([topic], count)
    yield orphaned


def _write_buffer_metrics(wb):
    """storage.write_buffer (ours; upstream has no write buffer metrics)."""
    stats = wb.stats
    for name, key, doc in (
            ("danube_write_buffer_passes", "passes", "Pipelines sent (one WAIT each)"),
            ("danube_write_buffer_entries", "entries", "Stream entries written (one per append)"),
            ("danube_write_buffer_bytes", "bytes", "Bytes written to the write buffer"),
            ("danube_write_buffer_wait_timeouts", "wait_timeouts",
             "WAITs that timed out with too few replicas"),
            ("danube_write_buffer_failures", "failures", "Failed passes (retried)"),
            ("danube_write_buffer_trims", "trims", "Trims after uploads")):
        yield _counter(name, doc, stats[key])
    yield _gauge("danube_write_buffer_failing", "1 while the last pass failed",
                 int(wb.failing))
    pending = GaugeMetricFamily("danube_write_buffer_pending_bytes",
                                "Bytes of appends not confirmed by the write buffer yet",
                                labels=["topic"])
    confirmed = GaugeMetricFamily("danube_write_buffer_confirmed_offset",
                                  "The last offset the write buffer confirmed",
                                  labels=["topic"])
    for name, buf in list(wb.topics.items()):
        pending.add_metric([name], buf.pending_bytes)
        confirmed.add_metric([name], buf.confirmed)
    yield pending
    yield confirmed


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


def _json(start_response, status, body):
    data = json.dumps(body).encode() + b"\n"
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
    return [data]


class MetricsExporter:
    def __init__(self, broker, host, port):
        self.broker = broker
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker))
        self.host = host
        self.port = port
        self._server = None
        self._thread = None

    def start(self):
        """Serve ``/metrics`` and, beside it, ``/health/live`` (200 while the process
        answers) and ``/health/ready`` (200, or 503 with the problems: a full WAL volume,
        the descriptor limit reached)."""
        metrics = make_wsgi_app(self.registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "")
            if path in ("/health", "/health/live"):
                return _json(start_response, "200 OK", {"status": "live"})
            if path == "/health/ready":
                problems = self._problems()
                if problems:
                    return _json(start_response, "503 Service Unavailable",
                                 {"status": "not ready", "problems": problems})
                return _json(start_response, "200 OK", {"status": "ready"})
            return metrics(environ, start_response)

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in self.host else socket.AF_INET

        self._server = make_server(self.host, self.port, app, Server,
                                   handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="danube-metrics", daemon=True)
        self._thread.start()
        self.port = self._server.server_port
        return self.port

    def _problems(self):
        core = self.broker.core
        if core is None:
            return {"starting": "the broker is starting"}
        try:
            return core.logs.problems()
        except Exception as exc:  # noqa: BLE001 - a readiness probe answers, whatever
            log.exception("readiness check failed")
            return {"check_failed": f"the readiness check failed: {exc!r}"}

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
