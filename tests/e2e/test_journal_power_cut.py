"""The broker's journal (danube/storage/journal) under power cuts (tests/support/power_cut.py),
with many topics and a journal file small enough that it rolls and trims (``syncfs``, then
the closed files recycled) while the producers publish:

* every acknowledged message of every topic survives, with contiguous offsets: the ack waits
  for the journal's ``fdatasync``, and a closed file goes only once the file system is
  synced behind it (the mutations "no fdatasync in a commit" and "no syncfs before a trim"
  both fail this, docs/testing.md);
* a topic deleted before the cut does not come back with what the journal held of it (its
  ``FORGET`` record, committed before its directory goes).
"""

import os
import signal
import threading

import grpc

from broker_process import BrokerProcess
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.proto import DanubeExt_pb2 as ext
from grpc_calls import subscribe, unary
from power_cut import PowerCut
from waiting import wait_for

#: DANUBE_JOURNAL_TOPICS=1000 runs the issue's 1,000-topic load (the suite runs 12).
TOPICS = [f"/default/journal-{i}"
          for i in range(int(os.environ.get("DANUBE_JOURNAL_TOPICS", "12")))]
THREADS = 12
SUB = "kept"
PAYLOAD = 2048          # ~600 messages fill a 1 MiB journal file


def write_config(tmp_path):
    path = tmp_path / "broker.yml"
    path.write_text("storage:\n  wal:\n    durability: always\n    journal: {file_mb: 1}\n"
                    "dispatch:\n  max_unacked_messages: 10000\n")
    return path


def producer(ch, topic, name):
    return unary(ch, "/danube.ProducerService/CreateProducer", pb.ProducerResponse)(
        pb.ProducerRequest(producer_name=name, topic_name=topic,
                           dispatch_strategy=pb.Reliable), timeout=30).producer_id


class Publishing:
    """THREADS threads, each sending to its share of the topics in turn, one message in
    flight; records every acknowledged payload."""

    def __init__(self, addr, topics, tag):
        self.channel = grpc.insecure_channel(addr)
        self.acked = {t: [] for t in topics}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(topics[k::THREADS], tag),
                                         daemon=True) for k in range(min(THREADS, len(topics)))]
        for t in self.threads:
            t.start()

    def _run(self, topics, tag):
        try:
            send = unary(self.channel, "/danube.ProducerService/SendMessage",
                         pb.MessageResponse)
            names = {t: f"{tag}-{t.rsplit('/', 1)[1]}" for t in topics}
            pids = {t: producer(self.channel, t, names[t]) for t in topics}
            n = 0
            while not self.stop.is_set():
                n += 1
                for topic in topics:
                    name = names[topic]
                    payload = f"{name}-{n}-".encode().ljust(PAYLOAD, b"x")
                    send(pb.StreamMessage(request_id=n, payload=payload, producer_name=name,
                                          msg_id=pb.MsgID(producer_id=pids[topic],
                                                          topic_name=topic)), timeout=30)
                    with self.lock:
                        self.acked[topic].append(payload)
                    if self.stop.is_set():
                        break
        except grpc.RpcError:
            pass                            # the broker was killed

    def total(self):
        with self.lock:
            return sum(len(v) for v in self.acked.values())

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        self.channel.close()
        return self.acked


def journal_files_synced(records):
    """The journal files the commits synced (their names)."""
    return {os.path.basename(r.path) for r in records
            if r.kind == "F" and "/wal/.journal/journal." in r.path}


def syncfs_records(records, root):
    """Files recorded by a syncfs: many files under the root with one start time."""
    starts = {}
    for r in records:
        starts.setdefault(r.started, set()).add(r.path)
    return [s for s in starts.values() if len(s) > 3]


def drain(addr, topic, timeout=120):
    """Every message the subscription SUB holds, as [(offset, payload)]."""
    got = []
    with grpc.insecure_channel(addr) as ch:
        offsets = unary(ch, "/danube_ext.TopicHistory/GetOffsets", ext.OffsetsResponse)(
            ext.OffsetsRequest(topic=topic), timeout=30)
        last = offsets.partitions[0].latest - 1
        if last < 0:
            return got
        cid = subscribe(ch, topic, "drain", SUB, pb.ConsumerRequest.Exclusive)
        stream = ch.unary_stream("/danube.ConsumerService/ReceiveMessages",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.StreamMessage.FromString)(
            pb.ReceiveRequest(consumer_id=cid), timeout=timeout)
        ack = unary(ch, "/danube.ConsumerService/Ack", pb.AckResponse)
        for msg in stream:
            got.append((msg.msg_id.topic_offset, msg.payload))
            ack(pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id,
                              subscription_name=SUB), timeout=30)
            if msg.msg_id.topic_offset >= last:
                break
        stream.cancel()
    return got


def test_every_acknowledged_message_of_every_topic_survives_rolls_trims_and_cuts(tmp_path):
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    config = write_config(tmp_path)
    acked = {t: [] for t in TOPICS}
    syncfs_seen = 0
    for round_ in range(2):
        broker = BrokerProcess("--config-file", str(config), data_dir=cut.root,
                               env=cut.arm()).start(timeout=60)
        try:
            if round_ == 0:
                with grpc.insecure_channel(broker.client_addr) as ch:
                    for topic in TOPICS:
                        producer(ch, topic, "setup")
                        subscribe(ch, topic, "c", SUB, pb.ConsumerRequest.Exclusive)
            pub = Publishing(broker.client_addr, TOPICS, f"r{round_}")
            # Three journal files in the round: the first two closed, and trimmed as the
            # writer rolled on (it waits for the trim thread beyond a few closed files).
            wait_for(lambda: pub.total() >= 1500
                     and len(journal_files_synced(cut.records())) >= 3, timeout=240,
                     what="1500 acknowledged publishes over three journal files")
        finally:
            broker.stop(signal.SIGKILL)
        for topic, payloads in pub.finish().items():
            acked[topic] += payloads
        records = cut.cut()
        syncfs_seen += len(syncfs_records(records, cut.root))
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root).start(timeout=120)
    try:
        for topic in TOPICS:
            received = drain(broker.client_addr, topic)
            have = {p for _, p in received}
            lost = [p for p in acked[topic] if p not in have]
            assert not lost, (f"{topic}: {len(lost)} of {len(acked[topic])} acknowledged "
                              f"messages lost, e.g. {lost[0][:40]!r}\n{broker.log()[-2000:]}")
            offsets = [o for o, _ in received]
            assert offsets == list(range(len(offsets))), f"{topic}: offsets not contiguous"
            assert len(have) == len(received), f"{topic}: a message stored twice"
    finally:
        broker.stop()
    assert syncfs_seen >= 1, "no journal trim (syncfs) happened in the rounds"


def test_a_deleted_topic_does_not_come_back_from_the_journal(tmp_path):
    cut = PowerCut(tmp_path / "data", tmp_path / "cut")
    config = write_config(tmp_path)
    topic = "/default/journal-deleted"
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root,
                           env=cut.arm()).start(timeout=60)
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            pid = producer(ch, topic, "p")
            send = unary(ch, "/danube.ProducerService/SendMessage", pb.MessageResponse)
            for n in range(20):
                send(pb.StreamMessage(request_id=n + 1, payload=b"old-%d" % n,
                                      producer_name="p",
                                      msg_id=pb.MsgID(producer_id=pid, topic_name=topic)),
                     timeout=30)
        with grpc.insecure_channel(broker.admin_addr) as ach:
            unary(ach, "/danube_admin.TopicAdmin/DeleteTopic", admin_pb.TopicResponse)(
                admin_pb.TopicRequest(name=topic), timeout=30)
        wal_dir = os.path.join(cut.root, "wal", "default", "journal-deleted")
        wait_for(lambda: not os.path.exists(wal_dir), what="the deleted topic's WAL removed")
    finally:
        broker.stop(signal.SIGKILL)
    cut.cut()
    broker = BrokerProcess("--config-file", str(config), data_dir=cut.root).start(timeout=60)
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            producer(ch, topic, "again")            # the same name, a new topic
            offsets = unary(ch, "/danube_ext.TopicHistory/GetOffsets", ext.OffsetsResponse)(
                ext.OffsetsRequest(topic=topic), timeout=30)
        assert offsets.partitions[0].latest == 0, (
            f"the re-created topic holds {offsets.partitions[0].latest} messages of the "
            f"deleted one")
    finally:
        broker.stop()
