"""Prometheus exporter (upstream metric names, reference (g)). Metrics are read from the live
objects at scrape time, so the data paths never touch a metrics library."""

import logging

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from danube.broker.subscription import KEY_SHARED
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
        guard = getattr(self.broker, "guard", None)
        if guard is not None:
            yield from _authz_metrics(guard)
        core = self.broker.core
        if core is not None:
            yield from _topic_metrics(core)
            if core.tiered is not None:
                yield from _storage_metrics(core.tiered)
            if core.write_buffer is not None:
                yield from _write_buffer_metrics(core.write_buffer)
        cluster = getattr(self.broker, "cluster", None)
        if cluster is not None:
            yield from _cluster_metrics(cluster)


def _gauge(name, doc, value):
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _counter(name, doc, value):
    family = CounterMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _cluster_metrics(cluster):
    """Cluster mode on etcd: upstream's leader, assignment and redirect metrics, and ours for
    the metadata connection and the fence."""
    conn = cluster.store.conn
    yield _gauge("danube_leader_election_state", "1 on the cluster leader, else 0",
                 1 if cluster.is_leader else 0)
    yield _counter("danube_broker_assignments", "Topics placed by this broker as leader",
                   cluster.manager.assignments_total)
    yield _counter("danube_client_redirects", "Lookups answered with another broker",
                   cluster.redirects)
    rebalancer = cluster.rebalancer
    yield _counter("danube_rebalancing_moves", "Topic moves made by automatic rebalancing "
                   "on this broker as leader", rebalancer.moves_total)
    yield _counter("danube_rebalancing_failures", "Automatic rebalancing moves that failed",
                   rebalancer.failures_total)
    yield _gauge("danube_cluster_imbalance_cv", "Coefficient of variation of the active "
                 "brokers' load at the leader's last rebalancing check", rebalancer.last_cv)
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
    sent = CounterMetricFamily("danube_producer_send", "Messages accepted from a producer",
                               labels=["topic", "producer"])
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
    yield from (msgs_in, bytes_in, producers, consumers, subs, sub_consumers, sent, out_msgs,
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
