"""Every metric upstream Danube v0.15.1 exports (danube-broker/src/broker_metrics.rs and
danube-persistent-storage/src/persistent_metrics.rs), scraped from a real broker process
after publishing (SendMessage and our batches), consuming, nacks and ack timeouts into a
dead-letter topic, schema validation, uploads to an object store (fs), retention, reading
history back from the object store (one object removed, so a read fails first) and a topic
deletion: each name is present with upstream's type and labels, and each moved. The cluster's
and RBAC's names are present here and move in a cluster (tests/e2e/test_cluster_rebalancing.py)
or with auth.mode tls (tests/e2e/test_security_rbac.py); docs/metrics.md says where each is
fed."""

import asyncio
import json
import time
import urllib.request

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from broker_process import BrokerProcess
from danube.client import DanubeClient
from danube.client.admin import AdminClient
from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from danube.proto import SchemaRegistry_pb2 as sr
from waiting import async_wait_for

# name -> (type, labels upstream gives it)
UPSTREAM = {
    "danube_topic_messages_in_total": ("counter", {"topic"}),
    "danube_topic_bytes_in_total": ("counter", {"topic"}),
    "danube_consumer_messages_out_total": ("counter", {"topic", "subscription"}),
    "danube_consumer_bytes_out_total": ("counter", {"topic", "subscription"}),
    "danube_broker_assignments_total": ("counter", {"broker_id", "action"}),
    "danube_broker_rpc_total": ("counter", {"service", "method", "result"}),
    "danube_client_redirects_total": ("counter", {"reason", "topic_ns"}),
    "danube_producer_send_total": ("counter", {"topic", "result", "error_code"}),
    "danube_dispatcher_heartbeat_polls_total": ("counter", set()),
    "danube_dispatcher_notifier_polls_total": ("counter", set()),
    "danube_subscription_nack_total": ("counter", {"topic", "subscription"}),
    "danube_subscription_redelivery_total": ("counter", {"topic", "subscription"}),
    "danube_subscription_ack_timeout_total": ("counter", {"topic", "subscription"}),
    "danube_subscription_retry_exhausted_total": ("counter", {"topic", "subscription"}),
    "danube_subscription_dlq_total": ("counter", {"topic", "subscription"}),
    "danube_schema_validation_total": ("counter", {"topic"}),
    "danube_schema_validation_failures_total": ("counter", {"topic"}),
    "danube_rebalancing_moves_total": ("counter", {"reason"}),
    "danube_rebalancing_failures_total": ("counter", set()),
    "danube_authz_allow_total": ("counter", set()),
    "danube_authz_deny_total": ("counter", set()),
    "danube_broker_topics_owned": ("gauge", set()),
    "danube_topic_active_producers": ("gauge", {"topic"}),
    "danube_topic_active_consumers": ("gauge", {"topic"}),
    "danube_leader_election_state": ("gauge", set()),
    "danube_topic_active_subscriptions": ("gauge", {"topic"}),
    "danube_subscription_active_consumers": ("gauge", {"topic", "subscription"}),
    "danube_subscription_lag_messages": ("gauge", {"topic", "subscription"}),
    "danube_subscription_pending_redelivery": ("gauge", {"topic", "subscription"}),
    "danube_subscription_terminal_blocked": ("gauge", {"topic", "subscription"}),
    "danube_cluster_imbalance_cv": ("gauge", set()),
    "danube_producer_send_latency_ms": ("summary", {"topic"}),
    "danube_topic_message_size_bytes": ("summary", {"topic"}),
    "danube_rebalancing_cycle_duration_seconds": ("summary", set()),
    # the storage crate
    "danube_wal_append_total": ("counter", {"topic"}),
    "danube_wal_append_bytes_total": ("counter", {"topic"}),
    "danube_wal_flush_latency_ms": ("summary", {"topic"}),
    "danube_wal_flush_total": ("counter", {"topic"}),
    "danube_wal_file_rotate_total": ("counter", {"topic", "reason"}),
    "danube_wal_reader_create_total": ("counter", {"topic", "mode"}),
    "danube_wal_delete_total": ("counter", {"topic", "reason"}),
    "danube_cloud_upload_objects_total": ("counter", {"topic", "provider", "result"}),
    "danube_cloud_upload_bytes_total": ("counter", {"topic", "provider"}),
    "danube_cloud_upload_latency_ms": ("summary", {"provider"}),
    "danube_cloud_list_total": ("counter", {"provider"}),
    "danube_cloud_list_latency_ms": ("summary", {"provider"}),
    "danube_handoff_durable_history_to_hot_total": ("counter", {"topic"}),
    "danube_durable_history_segments_read_total": ("counter", {"topic", "provider"}),
    "danube_durable_history_read_bytes_total": ("counter", {"topic", "provider"}),
    "danube_durable_history_reader_errors_total": ("counter", {"provider", "reason"}),
}
# Fed only in a cluster on etcd (leader election, placement, redirects, rebalancing) or
# with auth.mode tls (RBAC); a standalone broker without auth exports them unmoved, as
# upstream registers every metric at start.
CLUSTER_OR_AUTH = {"danube_broker_assignments_total", "danube_client_redirects_total",
                   "danube_rebalancing_moves_total", "danube_rebalancing_failures_total",
                   "danube_cluster_imbalance_cv", "danube_rebalancing_cycle_duration_seconds",
                   "danube_leader_election_state", "danube_authz_allow_total",
                   "danube_authz_deny_total"}
DLQ = "/{namespace}/{topic}-{subscription}-dlq"


def scrape(port):
    """{upstream name: (type, label names, total)}: counters' and gauges' samples summed
    (gauges by absolute value), a summary's count."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        name = family.name + ("_total" if family.type == "counter" else "")
        want = name if family.type != "summary" else name + "_count"
        labels, total = set(), 0.0
        for sample in family.samples:
            if sample.name == want:
                labels |= set(sample.labels) - {"quantile"}
                total += abs(sample.value)
        out[name] = (family.type, labels, total)
    return out


def series(port, name, **labels):
    """The sum of ``name``'s samples carrying ``labels``."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return sum(s.value for f in text_string_to_metric_families(body.decode())
               for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="module")
def durable_root(tmp_path_factory):
    return tmp_path_factory.mktemp("objects")


@pytest.fixture(scope="module")
def broker(tmp_path_factory, durable_root):
    tree = {"storage": {"mode": "object_store",
                        "durable": {"backend": "fs", "root": str(durable_root),
                                    "upload_interval_seconds": 1},
                        "local_retention": {"time_minutes": 0,
                                            "check_interval_minutes": 0.005}},
            "dispatch": {"failure_policy": {
                "max_redelivery_count": 1, "ack_timeout_ms": 1500,
                "base_redelivery_delay_ms": 100, "poison_policy": "dead_letter",
                "dead_letter_topic": DLQ}}}
    path = tmp_path_factory.mktemp("cfg") / "broker.yml"
    path.write_text(yaml.safe_dump(tree))
    b = BrokerProcess("--config-file", str(path), "--prom-exporter", "127.0.0.1:0",
                      data_dir=tmp_path_factory.mktemp("data")).start()
    yield b
    b.stop()


def read_range(broker, topic, start, end, timeout=60):
    """The payloads of danube_ext.TopicHistory/ReadRange [start, end): reads of history
    through the topic log's reader, as a subscription behind the WAL reads them."""
    with grpc.insecure_channel(broker.client_addr) as ch:
        call = ch.unary_stream("/danube_ext.TopicHistory/ReadRange",
                               request_serializer=ext.ReadRangeRequest.SerializeToString,
                               response_deserializer=ext.ReadRangeBatch.FromString)
        out = []
        for batch in call(ext.ReadRangeRequest(topic=topic, start_offset=start,
                                               end_offset=end), timeout=timeout):
            out.extend(pb.StreamMessage.FromString(m).payload for m in batch.messages)
        return out


async def drain(consumer, count, ack=True):
    got = []
    while len(got) < count:
        msg = await consumer.receive(timeout=60)
        got.append(msg)
        if ack:
            await consumer.ack(msg)
    return got


async def test_every_upstream_metric_is_exported_and_moves(broker, durable_root):
    port = broker.prom_port
    scrapes = [scrape(port)]
    client = DanubeClient(f"http://{broker.client_addr}")
    admin = AdminClient(f"http://{broker.admin_addr}")
    topic, broken = "/default/metered", "/default/metered-broken"
    try:
        # Schema validation (warn: an invalid payload is counted and kept).
        schema = {"type": "object", "properties": {"id": {"type": "integer"}},
                  "required": ["id"]}
        await admin.call("SchemaRegistry", "RegisterSchema", sr.RegisterSchemaRequest(
            subject="metered", schema_type="json_schema",
            schema_definition=json.dumps(schema).encode()))
        await admin.call("TopicAdmin", "CreateTopic", adm.NewTopicRequest(
            name="/default/metered-schema", dispatch_strategy=adm.Reliable,
            schema_subject="metered"))
        await admin.call("SchemaRegistry", "UpdateTopicValidationPolicy",
                         sr.UpdateTopicValidationPolicyRequest(
                             topic_name="/default/metered-schema", validation_policy="warn",
                             enable_payload_validation=True))
        typed = await client.create_producer(
            "/default/metered-schema", "typed", reliable=True,
            schema=pb.SchemaReference(subject="metered", use_latest=True))
        await typed.send(b'{"id": 1}')
        await typed.send(b'{"id": "not a number"}')

        # Subscriptions first (a new one starts at the live tail): "dlq" never acks;
        # "blocked" nacks under a Block policy.
        producer = await client.create_producer(topic, "p", reliable=True)
        dlq = await client.subscribe(topic, "c-dlq", "dlq", sub_type="exclusive")
        blocked = await client.subscribe(topic, "c-blocked", "blocked", sub_type="exclusive")
        await admin.call("TopicAdmin", "SetSubscriptionFailurePolicy",
                         adm.SetSubscriptionFailurePolicyRequest(
                             topic=topic, subscription="blocked",
                             failure_policy=adm.SubscriptionFailurePolicy(
                                 max_redelivery_count=1, ack_timeout_ms=60_000,
                                 base_redelivery_delay_ms=3000,
                                 max_redelivery_delay_ms=3000,
                                 backoff_strategy=adm.Fixed, poison_policy=adm.Block)))
        side = await client.create_producer(broken, "p", reliable=True)
        for i in range(20):
            await producer.send(b"message %d" % i)
            await side.send(b"side %d" % i)
        await producer.send_many([b"batched %d" % i for i in range(10)])   # our batch path
        scrapes.append(scrape(port))                # lag, active consumers

        # Block: the first message nacked twice (3 s apart) stalls the subscription.
        first = await blocked.receive(timeout=30)
        await blocked.nack(first)
        await async_wait_for(lambda: scrape(port)["danube_subscription_pending_redelivery"][2],
                             timeout=30, what="a pending redelivery")
        scrapes.append(scrape(port))
        while True:                 # the newer messages meanwhile: a nack holds none back
            again = await blocked.receive(timeout=30)
            if again.payload == first.payload:
                break
            await blocked.ack(again)
        await blocked.nack(again)
        await async_wait_for(lambda: scrape(port)["danube_subscription_terminal_blocked"][2],
                             timeout=30, what="the blocked subscription")
        scrapes.append(scrape(port))
        # Ack timeouts until the first message goes to the dead-letter topic.
        await async_wait_for(lambda: scrape(port)["danube_subscription_dlq_total"][2],
                             timeout=60, what="a dead-lettered message")

        # Uploads, then retention: the messages are in the object store only.
        def uploaded_and_deleted():
            return all(series(port, "danube_wal_delete_total", topic=t) >= 1 and
                       series(port, "danube_cloud_upload_objects_total", topic=t,
                              result="ok") >= 1 for t in (topic, broken))
        await async_wait_for(uploaded_and_deleted, timeout=90,
                             what="uploads and local retention")
        # Read back from the object store, on into the WAL (the hand-off).
        await producer.send(b"after the history")
        got = await asyncio.to_thread(read_range, broker, topic, 0, 31)
        assert got[:2] == [b"message 0", b"message 1"] and got[-1] == b"after the history"
        assert len(got) == 31
        # One of the side topic's objects goes missing: the read fails (and is retried with
        # backoff, as in a real outage, until the call's deadline).
        objects = sorted((durable_root / "storage" / "topics" / "default" /
                          "metered-broken" / "segments").iterdir())
        objects[0].unlink()
        with pytest.raises(grpc.RpcError):
            await asyncio.to_thread(read_range, broker, broken, 0, 20, 3)
        await async_wait_for(
            lambda: scrape(port)["danube_durable_history_reader_errors_total"][2],
            timeout=30, what="a failed history read")

        scrapes.append(scrape(port))
        # A topic's deletion lists its objects to remove them.
        await admin.call("TopicAdmin", "DeleteTopic",
                         adm.TopicRequest(name="/default/metered-schema"))
        await async_wait_for(lambda: scrape(port)["danube_cloud_list_total"][2],
                             timeout=60, what="a listing of the object store")
        await dlq.close()
        await blocked.close()
        scrapes.append(scrape(port))
    finally:
        await client.close()
        await admin.close()

    final, before = scrapes[-1], scrapes[0]
    missing = sorted(set(UPSTREAM) - set(final))
    assert not missing, f"not exported: {missing}"
    none = (None, set(), 0.0)
    for name, (kind, labels) in UPSTREAM.items():
        labels = labels | {"broker"}            # upstream's global label, on every series
        assert final[name][0] == kind, f"{name}: {final[name][0]}, upstream {kind}"
        if name not in CLUSTER_OR_AUTH:
            # Over every scrape: a deleted topic's series go with it.
            got_labels = set().union(*(s.get(name, none)[1] for s in scrapes))
            assert labels <= got_labels, f"{name}: labels {got_labels}, upstream {labels}"
    still = []
    for name, (kind, _) in UPSTREAM.items():
        if name in CLUSTER_OR_AUTH:
            continue
        start = before.get(name, none)[2]
        if kind == "gauge":
            moved = any(s.get(name, none)[2] != start for s in scrapes)
        else:
            moved = max(s.get(name, none)[2] for s in scrapes) > start
        if not moved:
            still.append(name)
    assert not still, f"did not move: {still}"
