"""danube.StorageService/ListSegmentDescriptors (what danube-iceberg polls) against a real
broker process whose reliable topics upload sealed WAL segments to an fs object store, called
through grpcio stubs generated at test time from protocol/DanubeApi.proto."""

import importlib
import os
import sys

import grpc
import pytest
import yaml
from grpc_tools import protoc

from configured_broker import start_with_config
from official_client import unique_topic
from waiting import wait_for

PROTO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "protocol")
STUB_MODULES = ("DanubeApi_pb2", "DanubeApi_pb2_grpc")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    out = tmp_path_factory.mktemp("stubs")
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.join(PROTO_DIR, "DanubeApi.proto")])
    assert rc == 0, "grpc_tools.protoc failed on protocol/DanubeApi.proto"
    saved = {name: sys.modules.pop(name) for name in STUB_MODULES if name in sys.modules}
    sys.path.insert(0, str(out))
    try:
        pb, pb_grpc = (importlib.import_module(name) for name in STUB_MODULES)
    finally:
        sys.path.remove(str(out))
    yield pb, pb_grpc
    for name in STUB_MODULES:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


@pytest.fixture(scope="module")
def durable_root(tmp_path_factory):
    return tmp_path_factory.mktemp("durable")


@pytest.fixture(scope="module")
def broker(tmp_path_factory, durable_root):
    tree = {"storage": {"mode": "object_store",
                        "durable": {"backend": "fs", "root": str(durable_root),
                                    "upload_interval_seconds": 1}}}
    b = start_with_config(tmp_path_factory.mktemp("segments"), yaml.safe_dump(tree))
    yield b
    b.stop()


@pytest.fixture(scope="module")
def channel(broker):
    with grpc.insecure_channel(f"127.0.0.1:{broker.client_port}") as ch:
        yield ch


def publish(pb, pb_grpc, channel, topic, count, request_id):
    producers = pb_grpc.ProducerServiceStub(channel)
    producer_id = producers.CreateProducer(pb.ProducerRequest(
        request_id=request_id, producer_name=f"p{request_id}", topic_name=topic,
        producer_access_mode=pb.Shared, dispatch_strategy=pb.Reliable), timeout=10).producer_id
    for i in range(count):
        producers.SendMessage(pb.StreamMessage(
            request_id=i + 1, payload=b"x" * 100, producer_name=f"p{request_id}",
            publish_time=1, msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic)),
            timeout=10)


def test_uploaded_segments_are_listed_as_upstream(api, broker, channel, durable_root):
    pb, pb_grpc = api
    storage = pb_grpc.StorageServiceStub(channel)
    topic = unique_topic("segments")
    ns, name = topic.split("/")[1:]

    def listing(after=0):
        return list(storage.ListSegmentDescriptors(
            pb.ListSegmentDescriptorsRequest(topic=topic, after_offset=after),
            timeout=10).segments)

    assert listing() == []                     # nothing uploaded yet
    publish(pb, pb_grpc, channel, topic, 20, 1)
    # Publishing may cross an upload interval on a slow machine: the 20 can be in two segments.
    first = wait_for(lambda: [s for s in listing() if s.end_offset == 19] and listing(),
                     timeout=60, what="the first 20 messages' upload")
    assert first[0].start_offset == 0 and first[-1].end_offset == 19
    for before, after in zip(first, first[1:]):
        assert after.start_offset == before.end_offset + 1
    publish(pb, pb_grpc, channel, topic, 10, 2)
    every = wait_for(lambda: [s for s in listing() if s.end_offset == 29] and listing(),
                     timeout=60, what="the second segment's upload")
    assert len(every) >= 2
    assert [s.start_offset for s in every] == sorted(s.start_offset for s in every)
    for before, after in zip(every, every[1:]):
        assert after.start_offset == before.end_offset + 1        # contiguous, inclusive ends
    for seg in every:
        # segment_id is the object's name where upstream's readers (danube-iceberg) look.
        path = durable_root / "storage" / "topics" / ns / name / "segments" / seg.segment_id
        assert path.is_file(), f"no object at {path}"
        assert seg.size == path.stat().st_size > 0
        assert seg.etag and seg.created_at > 1_600_000_000
    # after_offset: only segments that start above it (incremental polling); 0 lists all.
    later = listing(every[0].end_offset)
    assert [s.segment_id for s in later] == [s.segment_id for s in every[1:]]
    assert listing(every[-1].start_offset) == []
    assert [s.segment_id for s in listing(0)] == [s.segment_id for s in every]
    # The name without its leading slash, as upstream's proto documents it ("default/x").
    bare = storage.ListSegmentDescriptors(
        pb.ListSegmentDescriptorsRequest(topic=topic.lstrip("/")), timeout=10).segments
    assert [s.segment_id for s in bare] == [s.segment_id for s in every]


def test_unknown_and_bad_topics(api, channel):
    pb, pb_grpc = api
    storage = pb_grpc.StorageServiceStub(channel)
    reply = storage.ListSegmentDescriptors(
        pb.ListSegmentDescriptorsRequest(topic="/default/never-made"), timeout=10)
    assert list(reply.segments) == []         # as upstream: no descriptors, no error
    for bad in ("", "no-slash", "/default/a/b", "default/a/b", "/default/has space"):
        with pytest.raises(grpc.RpcError) as err:
            storage.ListSegmentDescriptors(pb.ListSegmentDescriptorsRequest(topic=bad),
                                           timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert "topic" in err.value.details()
