""""Acked means on disk", tested as a power cut tests it (tests/support/power_cut.py): the
broker runs with a shim that records what each fsync/fdatasync made durable; it is killed
with SIGKILL while producers publish, and its data dir is rebuilt from what was synced
(WAL segments, checkpoints, the embedded metadata store's SQLite files, directory entries),
everything else dropped. The restarted broker must then hold what the durability mode
promises (README "Durability of reliable topics", danube/storage/wal/__init__.py):

* always: every acknowledged message, through a subscription made before the first cut
  (which the metadata store must keep too);
* interval: every message acknowledged before a sync of the segment it was written to
  began (its segment and offset read from the WAL as the kill left it, before the cut);
  what is lost is the end of the log, never a hole;
* none: nothing is promised for the messages; the broker either starts again and the topic
  takes new messages after what survived, or (a sealed segment the kernel had not written
  back) refuses to start with CorruptSegmentError naming the segment, as the WAL's docs
  say, never anything else;
* a durable AckRanges (the cursor and the acks above it, in the metadata store): none of
  the acknowledged messages is delivered again.

A SIGKILL alone keeps the page cache: without the cut, removing the fsync before the ack
(broker/topic.py `sync_to`) fails nothing (docs/testing.md, the mutation list).
"""

import os
import random
import re
import struct
import signal
import threading
import time

import grpc
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from grpc_calls import subscribe, unary
from power_cut import PowerCut
from waiting import wait_for

SUB = "kept"


def reliable_producer(ch, topic, name):
    """CreateProducer on a reliable topic (which creates the topic): the producer's id."""
    return unary(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
        pb.ProducerRequest(producer_name=name, topic_name=topic,
                           dispatch_strategy=pb.Reliable), timeout=30).producer_id


def write_config(tmp_path, durability, interval_ms=5000, journal=True):
    path = tmp_path / "broker.yml"
    # Small segments: rotations (a new file, a directory sync) happen within a round; a
    # small journal file (mode always): its rolls and trims (syncfs) too.
    path.write_text(f"""\
storage:
  wal:
    durability: {durability}
    journal: {{enabled: {str(journal).lower()}, file_mb: 1}}
    rotation: {{max_bytes: 131072}}
    advanced: {{file_sync: {{interval_ms: {interval_ms}}}}}
dispatch:
  max_unacked_messages: 1000
""")
    return path


class Publishing:
    """Producers on threads, each sending one message at a time, never retrying: every
    payload acknowledged is recorded with the time.monotonic() its answer arrived."""

    def __init__(self, addr, topic, producers=4):
        self.channel = grpc.insecure_channel(addr)
        self.topic = topic
        self.acked = []                     # (payload, time answered)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True)
                        for k in range(producers)]
        self.round = random.randrange(1 << 30)
        for t in self.threads:
            t.start()

    def _run(self, k):
        try:
            pid = reliable_producer(self.channel, self.topic, f"cut-{self.round}-{k}")
            send = unary(self.channel, "/danube.ProducerService/SendMessage",
                         pb.MessageResponse)
            n = 0
            while not self.stop.is_set():
                payload = f"r{self.round}p{k}-{n}-" + "x" * 200
                n += 1
                send(pb.StreamMessage(request_id=n, payload=payload.encode(),
                                      producer_name=f"cut-{self.round}-{k}",
                                      msg_id=pb.MsgID(producer_id=pid, topic_name=self.topic)),
                     timeout=30)
                answered = time.monotonic()
                with self.lock:
                    self.acked.append((payload, answered))
        except grpc.RpcError:
            pass                            # the broker was killed

    def count(self):
        with self.lock:
            return len(self.acked)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        self.channel.close()
        return list(self.acked)


def publish_then_cut(tmp_path, cut, config, topic, rng, at_least=300, before_cut=None,
                     until=None):
    """One round: start the broker under the shim, publish until at least `at_least`
    messages are acknowledged (and `until()` holds) and a random moment more, SIGKILL it
    mid-publish, cut the power (after `before_cut()`, if given, looked at the files as the
    kill left them).
    Returns (acknowledged [(payload, time)], the round's sync records)."""
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root,
                           env=cut.arm()).start(timeout=60)
    try:
        if not (tmp_path / "subscribed").exists():
            with grpc.insecure_channel(broker.client_addr) as ch:
                reliable_producer(ch, topic, "setup")
                subscribe(ch, topic, "c", SUB, pb.ConsumerRequest.Exclusive)
            (tmp_path / "subscribed").write_text("yes")
        pub = Publishing(broker.client_addr, topic)
        wait_for(lambda: pub.count() >= at_least and (until is None or until()), timeout=120,
                 what=f"{at_least} acknowledged publishes")
        time.sleep(rng.uniform(0.0, 0.5))   # a random moment mid-publish, not a wait
    finally:
        broker.stop(signal.SIGKILL)
    acked = pub.finish()
    if before_cut is not None:
        before_cut()
    return acked, cut.cut()


def drain(addr, topic, expected, timeout=120):
    """The messages of the subscription SUB made before the first cut, [(offset, payload)]
    (each acknowledged as it arrives), until every payload in `expected` has come or the
    topic's last offset (TopicHistory.GetOffsets) has: a lost message fails at once."""
    got = []
    with grpc.insecure_channel(addr) as ch:
        offsets = unary(ch, "/danube_ext.TopicHistory/GetOffsets", ext.OffsetsResponse)(
            ext.OffsetsRequest(topic=topic), timeout=30)
        last = offsets.partitions[0].latest - 1
        if last < 0:
            return got                      # the log is empty: nothing to wait for
        cid = subscribe(ch, topic, "drain", SUB, pb.ConsumerRequest.Exclusive)
        stream = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.StreamMessage.FromString)(
            pb.ReceiveRequest(consumer_id=cid), timeout=timeout)
        ack = unary(ch, "/danube.ConsumerService/Ack", pb.AckResponse)
        missing = set(expected)
        try:
            for msg in stream:
                payload = msg.payload.decode()
                got.append((msg.msg_id.topic_offset, payload))
                missing.discard(payload)
                ack(pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id,
                                  subscription_name=SUB), timeout=30)
                if not missing or msg.msg_id.topic_offset >= last:
                    break
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        stream.cancel()
    return got


HEADER = struct.Struct("<QII")


def wal_frames(directory):
    """{payload: segment path} of every frame in the WAL directory's segments (the
    well-formed ones at the start of each; CRCs unchecked: the broker wrote them)."""
    where = {}
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("wal.") and name.endswith(".log")):
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            buf = f.read()
        pos = 0
        while pos + HEADER.size <= len(buf):
            offset, length, crc = HEADER.unpack_from(buf, pos)
            end = pos + HEADER.size + length
            if (offset, length, crc) == (0, 0, 0) or end > len(buf):
                break
            where[pb.StreamMessage.FromString(buf[pos + HEADER.size:end]).payload.decode()] = \
                os.path.realpath(path)
            pos = end
    return where


def wal_syncs(records):
    return [r for r in records if r.kind == "F" and "/wal/" in r.path and r.path.endswith(".log")]


def journal_syncs(records):
    """Syncs of the broker's journal (mode always: danube/storage/journal)."""
    return [r for r in records if r.kind == "F" and "/wal/.journal/journal." in r.path]


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "own-syncs"])
def test_always_every_acknowledged_message_survives_power_cuts(tmp_path, journal):
    """With the broker's journal (the default) and without it (each WAL syncs its own
    segments: storage.wal.journal.enabled false)."""
    rng = random.Random()
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    config = write_config(tmp_path, "always", journal=journal)
    topic = "/default/power-always"
    acked = []
    for _ in range(3):
        got, records = publish_then_cut(tmp_path, cut, config, topic, rng)
        synced = journal_syncs(records) if journal else wal_syncs(records)
        assert synced, "the shim saw no WAL or journal sync: it is not watching the broker"
        acked += [p for p, _ in got]
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root).start(timeout=60)
    try:
        received = drain(broker.client_addr, topic, acked)
    finally:
        broker.stop()
    payloads = {p for _, p in received}
    lost = [p for p in acked if p not in payloads]
    assert not lost, (f"{len(lost)} of {len(acked)} acknowledged messages were lost by a "
                      f"power cut in mode always, e.g. {lost[:3]}\n{broker.log()[-3000:]}")
    offsets = [o for o, _ in received]
    assert offsets == list(range(len(offsets))), "offsets are not contiguous from 0"
    assert len(payloads) == len(received), "a message was stored twice"


def test_interval_loses_only_what_came_after_the_last_sync(tmp_path):
    rng = random.Random()
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    config = write_config(tmp_path, "interval", interval_ms=100)
    topic = "/default/power-interval"
    placed = {}
    wal_dir = os.path.join(cut.root, "wal", "default", "power-interval")
    got, records = publish_then_cut(tmp_path, cut, config, topic, rng, at_least=600,
                                    before_cut=lambda: placed.update(wal_frames(wal_dir)),
                                    until=lambda: len(wal_syncs(cut.records())) >= 3)
    syncs = wal_syncs(records)
    # Several interval syncs happened while publishing (not one at open only).
    assert len(syncs) >= 3, f"{len(syncs)} WAL syncs recorded"
    last_sync = {}
    for r in syncs:
        last_sync[r.path] = max(last_sync.get(r.path, 0), r.started)
    assert all(p in placed for p, _ in got), "an acknowledged message is not in the WAL"
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root).start(timeout=60)
    try:
        covered = [p for p, t in got if t < last_sync.get(placed[p], 0)]
        received = drain(broker.client_addr, topic, covered)
    finally:
        broker.stop()
    payloads = {p for _, p in received}
    lost = [p for p in covered if p not in payloads]
    assert covered and not lost, (
        f"{len(lost)} of {len(covered)} messages acknowledged before a sync of their "
        f"segment began were lost, e.g. {[(p[:20], placed[p]) for p in lost[:3]]}")
    offsets = [o for o, _ in received]
    assert offsets == list(range(len(offsets))), "a hole: what survives is not a prefix"


def test_none_starts_again_and_continues_after_what_survived(tmp_path):
    rng = random.Random()
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    config = write_config(tmp_path, "none")
    topic = "/default/power-none"
    publish_then_cut(tmp_path, cut, config, topic, rng)
    try:
        broker = BrokerProcess("--config-file", str(config), data_dir=cut.root).start(timeout=60)
    except RuntimeError as exc:
        # Documented (danube/storage/wal/__init__.py, mode none): a sealed segment never
        # written back cannot be told from disk damage.
        assert re.search(r"CorruptSegmentError: WAL \S+/power-none: wal\.\d+\.log ", str(exc)), exc
        return
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            pid = reliable_producer(ch, topic, "after")
            unary(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)(
                pb.StreamMessage(request_id=1, payload=b"after-the-cut", producer_name="after",
                                 msg_id=pb.MsgID(producer_id=pid, topic_name=topic)),
                timeout=30)
        received = drain(broker.client_addr, topic, ["after-the-cut"])
    finally:
        broker.stop()
    offsets = [o for o, _ in received]
    assert received[-1][1] == "after-the-cut"
    assert offsets == list(range(len(offsets))), "a hole: what survives is not a prefix"


def test_durable_ack_ranges_survive_a_power_cut(tmp_path):
    """The cursor and the acks above it, stored in the embedded metadata store (SQLite) by
    a durable AckRanges: after the cut none of those messages comes again."""
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    config = write_config(tmp_path, "always")
    topic = "/default/power-cursor"
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root,
                           env=cut.arm()).start(timeout=60)
    acked = set()
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            pid = reliable_producer(ch, topic, "p")
            cid = subscribe(ch, topic, "c", SUB, pb.ConsumerRequest.Exclusive)
            send = unary(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)
            for n in range(300):
                send(pb.StreamMessage(request_id=n, payload=b"m%d" % n, producer_name="p",
                                      msg_id=pb.MsgID(producer_id=pid, topic_name=topic)),
                     timeout=30)
            stream = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=pb.StreamMessage.FromString)(
                pb.ReceiveRequest(consumer_id=cid), timeout=60)
            offsets = []
            for msg in stream:
                offsets.append(msg.msg_id.topic_offset)
                if len(offsets) == 250:
                    break
            stream.cancel()
            # 0..149 (the cursor moves to 150) and, above a gap, 200..229 (stored beside it).
            ranges = [0, 149, 200, 229]
            answer = unary(ch, "/danube_ext.BatchConsumer/AckRanges", ext.AckRangesResponse)(
                ext.AckRangesRequest(topic_name=topic, subscription_name=SUB, ranges=ranges,
                                     durable=True), timeout=30)
            # The cut comes as the answer does: what the broker stores after answering
            # (however soon) is lost, so an answer sent before the cursor was stored fails
            # this test whatever the timing of the kill below.
            answered = time.monotonic()
            assert answer.acked == 180
            acked = set(range(0, 150)) | set(range(200, 230))
    finally:
        broker.stop(signal.SIGKILL)
    records = cut.cut(before=answered)
    assert any(r.path.endswith("-wal") for r in records), "no sync of the SQLite WAL seen"
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root).start(timeout=60)
    try:
        expected = [f"m{n}" for n in range(300) if n not in acked]
        received = drain(broker.client_addr, topic, expected)
    finally:
        broker.stop()
    again = sorted(o for o, _ in received if o in acked)
    assert not again, f"{len(again)} messages acknowledged durably came again, e.g. {again[:5]}"
    assert sorted(o for o, _ in received) == sorted(set(range(300)) - acked)
