"""Upstream's storage metrics (danube-persistent-storage's persistent_metrics.rs), read at
scrape time from the WAL, the topic log and tiered storage: danube_wal_*, danube_cloud_*,
danube_durable_history_* and danube_handoff_durable_history_to_hot_total. Upstream's
histograms are summaries (its exporter's rendering without buckets)."""

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric


def summary(name, doc, labels):
    """An empty summary family; ``add_summary`` fills it."""
    family = Metric(name, doc, "summary")
    family.label_names = labels
    return family


def add_summary(family, values, observed):
    """One series of ``family`` (``values`` of its labels) from a danube.metering.Summary."""
    labels = dict(zip(family.label_names, values))
    for q, v in observed.quantiles():
        family.add_sample(family.name, dict(labels, quantile=str(q)), v)
    family.add_sample(family.name + "_count", labels, observed.count)
    family.add_sample(family.name + "_sum", labels, observed.total)


def storage_metrics(core):
    t, tp, p = ["topic"], ["topic", "provider"], ["provider"]
    append = CounterMetricFamily("danube_wal_append", "Messages appended to the WAL",
                                 labels=t)
    append_bytes = CounterMetricFamily("danube_wal_append_bytes",
                                       "Payload bytes appended to the WAL", labels=t)
    flushes = CounterMetricFamily("danube_wal_flush", "WAL write and sync passes", labels=t)
    flush_ms = summary("danube_wal_flush_latency_ms",
                       "Latency of a WAL write and sync pass (ms)", t)
    rotations = CounterMetricFamily("danube_wal_file_rotate",
                                    "WAL segment rotations (reason: size, time, or export "
                                    "when tiered storage seals one to upload it)",
                                    labels=["topic", "reason"])
    readers = CounterMetricFamily("danube_wal_reader_create",
                                  "Readers of a topic's log created (mode: wal_only, or "
                                  "durable_history_then_hot once one reads the durable tier)",
                                  labels=["topic", "mode"])
    deletes = CounterMetricFamily("danube_wal_delete", "WAL segments deleted by retention",
                                  labels=["topic", "reason"])
    handoffs = CounterMetricFamily("danube_handoff_durable_history_to_hot",
                                   "Readers that moved on from durable history to the WAL",
                                   labels=t)
    uploads = CounterMetricFamily("danube_cloud_upload_objects",
                                  "Segment uploads to the durable store (result: ok, error)",
                                  labels=["topic", "provider", "result"])
    upload_bytes = CounterMetricFamily("danube_cloud_upload_bytes",
                                       "Bytes uploaded to the durable store", labels=tp)
    upload_ms = summary("danube_cloud_upload_latency_ms",
                        "Latency to upload one segment and record its descriptor (ms)", p)
    lists = CounterMetricFamily("danube_cloud_list", "Listings of the durable store",
                                labels=p)
    list_ms = summary("danube_cloud_list_latency_ms", "Latency of a durable store listing (ms)",
                      p)
    segments_read = CounterMetricFamily("danube_durable_history_segments_read",
                                        "Durable segments opened for reading", labels=tp)
    read_bytes = CounterMetricFamily("danube_durable_history_read_bytes",
                                     "Bytes read from durable segments", labels=tp)
    read_errors = CounterMetricFamily("danube_durable_history_reader_errors",
                                      "Failed reads of durable history (reason: fetch, decode)",
                                      labels=["provider", "reason"])
    tiered = core.tiered
    provider = tiered.objstore.backend if tiered is not None else None
    for topic in list(core.topics.values()):
        topic_log = topic.log
        if topic_log is None or topic_log.closed:
            continue
        name, wal = topic.name, topic_log.wal
        append.add_metric([name], topic.messages_in)
        append_bytes.add_metric([name], topic.bytes_in)
        flushes.add_metric([name], wal.flush_latency_ms.count)
        add_summary(flush_ms, [name], wal.flush_latency_ms)
        for reason, count in wal.rotations.items():
            rotations.add_metric([name, reason], count)
        for mode, count in topic_log.readers_created.items():
            readers.add_metric([name, mode], count)
        deletes.add_metric([name, "retention"], wal.deleted_segments)
        handoffs.add_metric([name], topic_log.handoffs_to_hot)
        tier = topic_log.tier
        if tier is not None:
            counts = tier.counts
            uploads.add_metric([name, provider, "ok"], counts["uploaded"])
            uploads.add_metric([name, provider, "error"], counts["upload_failures"])
            upload_bytes.add_metric([name, provider], counts["upload_bytes"])
            segments_read.add_metric([name, provider], counts["segments_read"])
            read_bytes.add_metric([name, provider], counts["read_bytes"])
    if tiered is not None:
        add_summary(upload_ms, [provider], tiered.upload_latency_ms)
        lists.add_metric([provider], tiered.list_latency_ms.count)
        add_summary(list_ms, [provider], tiered.list_latency_ms)
        for reason, count in tiered.read_errors.items():
            read_errors.add_metric([provider, reason], count)
    yield from (append, append_bytes, flushes, flush_ms, rotations, readers, deletes,
                handoffs, uploads, upload_bytes, upload_ms, lists, list_ms, segments_read,
                read_bytes, read_errors)
