"""README storage features checked against a real `danube broker` process: local retention
by size (`storage.local_retention.size_mb`), which by default never deletes what a
subscription has not acknowledged, unless `delete_unconsumed: true`; and the tiered-storage
upload-failure metric (`danube_storage_upload_failures_total`)."""

import shutil

import grpc

from configured_broker import metric, start_with_config
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import ack, create_producer, receive, send, subscribe
from waiting import holds_for, wait_for

TOPIC = "/default/retained"
SEGMENT_BYTES = 256 * 1024
PAYLOAD_BYTES = 50_000
MESSAGES = 60               # about 3 MB: three times the 1 MB retention limit


def retention_config(delete_unconsumed):
    # Small segments and a check every 0.3 s; the age limit (2 days by default) never fires,
    # so whatever is deleted goes because of size_mb.
    return ("storage:\n"
            "  wal:\n"
            "    durability: none\n"
            f"    rotation: {{max_bytes: {SEGMENT_BYTES}}}\n"
            "  local_retention:\n"
            "    size_mb: 1\n"
            "    check_interval_minutes: 0.005\n"
            f"    delete_unconsumed: {'true' if delete_unconsumed else 'false'}\n")


def payload(i):
    return b"%04d" % i + b"x" * (PAYLOAD_BYTES - 4)


def segments(broker):
    """The topic's WAL segment files, oldest first: {first offset: size}."""
    wal = broker.data_dir / "wal" / "default" / "retained"
    out = {}
    for p in sorted(wal.glob("wal.*.log")):
        try:
            out[int(p.name.split(".")[1])] = p.stat().st_size
        except FileNotFoundError:       # retention deleted it between the listing and now
            pass
    return out


def sealed_bytes(broker):
    sizes = segments(broker)
    return sum(size for first, size in sizes.items() if first != max(sizes))


def publish_all(ch, producer=None):
    producer = producer or create_producer(ch, TOPIC, "p", pb.Reliable)
    for i in range(MESSAGES):
        send(ch, TOPIC, producer, payload(i))


def test_size_mb_deletes_the_oldest_segments_beyond_the_limit(tmp_path):
    b = start_with_config(tmp_path, retention_config(delete_unconsumed=False))
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            publish_all(ch)
        wait_for(lambda: 0 not in segments(b), what="the oldest segment to be deleted")
        wait_for(lambda: sealed_bytes(b) <= 1 << 20,
                 what="the sealed segments to fit in size_mb")
        # Only what was over the limit went: the newest sealed segments are kept.
        assert sealed_bytes(b) > (1 << 20) - 2 * SEGMENT_BYTES, segments(b)
        assert b.wait_for_log(r"retention deleted \d+ WAL segments of /default/retained")
    finally:
        b.stop()


def test_size_mb_keeps_what_a_subscription_has_not_acknowledged(tmp_path):
    """By default the limit yields to a subscription's backlog: nothing is deleted, and the
    subscription gets every message from the first."""
    b = start_with_config(tmp_path, retention_config(delete_unconsumed=False))
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            # A subscription starts at the newest message: it is made before the publishing.
            producer = create_producer(ch, TOPIC, "p", pb.Reliable)
            consumer = subscribe(ch, TOPIC, "slow", "backlog", pb.ConsumerRequest.Exclusive)
            publish_all(ch, producer)
            assert sealed_bytes(b) > 2 << 20
            # A "must not happen" check: watched over ten retention passes (0.3 s each).
            holds_for(lambda: 0 in segments(b), 3.0, what="the backlog's first segment kept")
            stream = receive(ch, consumer)
            try:
                assert next(stream).payload == payload(0)
            finally:
                stream.cancel()
        assert "retention deleted" not in b.log()
    finally:
        b.stop()


def test_delete_unconsumed_lets_the_limit_win_over_a_backlog(tmp_path):
    """With delete_unconsumed the limit wins: the subscription loses the deleted messages
    (logged) and resumes at the oldest one left."""
    b = start_with_config(tmp_path, retention_config(delete_unconsumed=True))
    try:
        with grpc.insecure_channel(b.client_addr) as ch:
            # A subscription starts at the newest message: it is made before the publishing.
            producer = create_producer(ch, TOPIC, "p", pb.Reliable)
            consumer = subscribe(ch, TOPIC, "slow", "backlog", pb.ConsumerRequest.Exclusive)
            publish_all(ch, producer)
            wait_for(lambda: 0 not in segments(b), what="the backlog's first segment deleted")
            wait_for(lambda: sealed_bytes(b) <= 1 << 20,
                     what="the sealed segments to fit in size_mb")
            oldest = min(segments(b))
            # The messages the dispatcher had already handed out (at most the in-flight
            # window, dispatch.max_unacked_messages = 10) before retention ran still arrive;
            # after them the subscription jumps to the oldest message left.
            got = []
            stream = receive(ch, consumer)
            try:
                for msg in stream:
                    got.append(int(msg.payload[:4]))
                    ack(ch, "backlog", msg)
                    if got[-1] >= oldest:
                        break
            finally:
                stream.cancel()
        in_flight = len(got) - 1
        # Retention may have run once more between our look at the segments and the
        # dispatcher's jump, so the jump goes to the oldest message left *then*, as logged.
        resumed = got[-1]
        assert in_flight <= 10 and got == [*range(in_flight), resumed], got
        assert resumed >= oldest
        assert min(segments(b)) >= resumed      # nothing older than the jump was left behind
        assert b.wait_for_log(rf"/default/retained/backlog: {resumed - in_flight} unconsumed "
                              rf"messages \(offsets {in_flight}\.\.{resumed - 1}\) were "
                              rf"deleted by retention; resuming at {resumed}")
    finally:
        b.stop()


def test_a_failing_upload_is_counted_in_the_metric(tmp_path):
    """An `fs` store that stops being writable (its directory replaced by a file) fails
    every upload: danube_storage_upload_failures_total counts them, nothing is uploaded, and
    once the store is back the retried upload succeeds."""
    store = tmp_path / "store"
    store.mkdir()
    b = start_with_config(
        tmp_path,
        "storage:\n"
        "  mode: shared_fs\n"
        f"  durable: {{backend: fs, root: '{store}', upload_interval_seconds: 1}}\n"
        "  wal:\n"
        "    rotation: {max_bytes: 65536}\n",
        "--prom-exporter", "127.0.0.1:0")
    try:
        assert metric(b, "danube_storage_upload_failures_total") == 0
        store.rmdir()
        store.write_text("not a directory any more")
        with grpc.insecure_channel(b.client_addr) as ch:
            producer = create_producer(ch, "/default/uploads", "p", pb.Reliable)
            for _ in range(10):
                send(ch, "/default/uploads", producer, b"u" * 20_000)
        wait_for(lambda: metric(b, "danube_storage_upload_failures_total") >= 2,
                 what="two failed upload attempts to be counted")
        assert metric(b, "danube_storage_uploaded_segments_total") == 0
        assert "upload to fs directory" in b.log() and "failed (attempt 1" in b.log()
        store.unlink()
        store.mkdir()
        wait_for(lambda: metric(b, "danube_storage_uploaded_segments_total") > 0, timeout=30,
                 what="the retried upload to succeed once the store is back")
    finally:
        b.stop()
    shutil.rmtree(store, ignore_errors=True)
