"""Idle topics are unloaded and loaded again on first use (issue 53): beyond
``topics.max_idle_loaded`` idle topics, or after ``topics.idle_unload_seconds``, a topic
nobody uses leaves memory (its log closed), keeping its subscriptions and cursors; any use
loads it again, and a reliable subscription resumes where its acks left it. After a restart
no topic is loaded until it is used."""

import grpc

from danube.proto import DanubeAdmin_pb2 as adm
from danube.proto import DanubeApi_pb2 as pb
from broker_process import BrokerProcess
from configured_broker import metric
from grpc_calls import Collector, ack, create_producer, receive, send, subscribe, unary
from waiting import holds_for, wait_for

SYSTEM_TOPICS = 1       # /system/_events_topic, always loaded


def start(tmp_path, idle_seconds, max_idle, data_dir=None):
    cfg = tmp_path / "broker.yml"
    cfg.write_text(f"topics:\n  idle_unload_seconds: {idle_seconds}\n"
                   f"  max_idle_loaded: {max_idle}\n")
    return BrokerProcess("--config-file", str(cfg), "--prom-exporter", "127.0.0.1:0",
                         data_dir=data_dir or tmp_path / "d").start()


def loaded(broker):
    return metric(broker, "danube_broker_topics_loaded")


def owned(broker):
    return metric(broker, "danube_broker_topics_owned")


def publish_and_leave(broker, topic, payloads):
    """A producer on a connection of its own publishes, then its connection closes."""
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p", pb.Reliable)
        for payload in payloads:
            send(ch, topic, producer_id, payload)


def test_idle_topics_beyond_the_bound_are_unloaded_and_load_on_use(tmp_path):
    broker = start(tmp_path, idle_seconds=0, max_idle=2)
    try:
        topics = [f"/default/idle-bound-{i}" for i in range(8)]
        for topic in topics:
            publish_and_leave(broker, topic, [b"only " + topic.encode()])
        assert owned(broker) == len(topics) + SYSTEM_TOPICS
        wait_for(lambda: loaded(broker) == 2 + SYSTEM_TOPICS,
                 what="the loaded idle topics to come down to the bound")
        holds_for(lambda: loaded(broker) <= 2 + SYSTEM_TOPICS, 1.0,
                  what="the loaded topics staying within the bound")
        assert owned(broker) == len(topics) + SYSTEM_TOPICS
        with grpc.insecure_channel(broker.admin_addr) as admin:
            # Listing a resting topic does not load it, and says what it is.
            listed = unary(admin, "/danube_admin.TopicAdmin/ListNamespaceTopics",
                           adm.TopicInfoListResponse)(adm.NamespaceRequest(name="default"),
                                                      timeout=10).topics
            assert {t.name: t.delivery for t in listed if t.name in topics} == \
                {t: "Reliable" for t in topics}
            # Describing one loads it.
            described = unary(admin, "/danube_admin.TopicAdmin/DescribeTopic",
                              adm.DescribeTopicResponse)(
                adm.DescribeTopicRequest(name=topics[0]), timeout=10)
            assert described.delivery == "Reliable"
        # Any topic, loaded or not, takes a new producer and consumer; its history is kept.
        for topic in topics:
            with grpc.insecure_channel(broker.client_addr) as ch:
                consumer_id = subscribe(ch, topic, "c", "s")
                stream = Collector(receive(ch, consumer_id))
                producer_id = create_producer(ch, topic, "p2", pb.Reliable)
                send(ch, topic, producer_id, b"second")
                assert stream.get(timeout=10).payload == b"second"
                stream.close()
        wait_for(lambda: loaded(broker) == 2 + SYSTEM_TOPICS,
                 what="the topics used again to be unloaded down to the bound")
    finally:
        broker.stop()


def test_an_unloaded_subscription_resumes_at_its_acks(tmp_path):
    broker = start(tmp_path, idle_seconds=0.5, max_idle=100)
    topic = "/default/idle-resume"
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            producer_id = create_producer(ch, topic, "p", pb.Reliable)
            consumer_id = subscribe(ch, topic, "c1", "s", pb.ConsumerRequest.Exclusive)
            stream = Collector(receive(ch, consumer_id))
            for i in range(5):
                send(ch, topic, producer_id, b"m%d" % i)
            got = [stream.get(timeout=10) for _ in range(5)]
            assert [m.payload for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
            ack(ch, "s", got[0])
            ack(ch, "s", got[1])
            ack(ch, "s", got[3])            # out of order: m2 and m4 stay unacknowledged
            stream.close()
        wait_for(lambda: loaded(broker) == SYSTEM_TOPICS,
                 what="the idle topic to be unloaded after the idle timeout")
        assert owned(broker) == 1 + SYSTEM_TOPICS
        with grpc.insecure_channel(broker.client_addr) as ch:
            consumer_id = subscribe(ch, topic, "c2", "s", pb.ConsumerRequest.Exclusive)
            stream = Collector(receive(ch, consumer_id))
            again = [stream.get(timeout=10) for _ in range(2)]
            assert [m.payload for m in again] == [b"m2", b"m4"]
            assert stream.nothing(0.5)
            producer_id = create_producer(ch, topic, "p", pb.Reliable)
            send(ch, topic, producer_id, b"m5")
            fresh = stream.get(timeout=10)
            assert fresh.payload == b"m5" and fresh.msg_id.topic_offset == 5
            for msg in (*again, fresh):
                ack(ch, "s", msg)
            stream.close()
        wait_for(lambda: loaded(broker) == SYSTEM_TOPICS, what="the topic unloaded again")
        with grpc.insecure_channel(broker.client_addr) as ch:
            stream = Collector(receive(ch, subscribe(ch, topic, "c3", "s",
                                                     pb.ConsumerRequest.Exclusive)))
            assert stream.nothing(0.5)      # every message acknowledged: none comes back
            stream.close()
    finally:
        broker.stop()


def test_a_restart_loads_no_topic_until_it_is_used(tmp_path):
    data_dir = tmp_path / "d"
    broker = start(tmp_path, idle_seconds=300, max_idle=1000, data_dir=data_dir)
    topics = [f"/default/restart-lazy-{i}" for i in range(20)]
    try:
        for topic in topics:
            with grpc.insecure_channel(broker.client_addr) as ch:
                producer_id = create_producer(ch, topic, "p", pb.Reliable)
                subscribe(ch, topic, "c", "s")
                send(ch, topic, producer_id, topic.encode())
    finally:
        broker.stop()
    broker = start(tmp_path, idle_seconds=300, max_idle=1000, data_dir=data_dir)
    try:
        assert loaded(broker) == SYSTEM_TOPICS
        assert owned(broker) == len(topics) + SYSTEM_TOPICS
        with grpc.insecure_channel(broker.client_addr) as ch:
            lookup = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)(
                pb.TopicLookupRequest(topic=topics[3]), timeout=10)
            assert lookup.response_type == pb.TopicLookupResponse.Connect
            stream = Collector(receive(ch, subscribe(ch, topics[3], "c", "s")))
            assert stream.get(timeout=10).payload == topics[3].encode()
            stream.close()
        assert loaded(broker) == 1 + SYSTEM_TOPICS
    finally:
        broker.stop()
