"""A broker process with upstream's write-buffer config (config/for_tests/
danube_broker_write_buffer.yml, as it is but for its ports and the Redis URL) on a real
redis-server primary with one replica:

- publishes over gRPC are acknowledged and every one is in the stream; the official client
  drains them;
- the buffer's primary killed (``on_wait_timeout: fail``): publishes fail cleanly with
  UNAVAILABLE naming the write buffer, the broker keeps serving, and once the primary is
  back publishes resume; nothing acknowledged is lost;
- the broker killed (``kill -9``) and its WAL directory lost: started again, it rebuilds the
  topic from the stream at the same offsets;
- a deleted topic's stream is deleted: the topic created again starts empty.
"""

import pathlib
import re
import shutil

import grpc
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeAdmin_pb2 as admin_pb
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import create_producer, send
from official_client import broker_url, run_scenario, unique_topic
from redis_servers import RedisPair, redis_server_binary
from waiting import wait_for

UPSTREAM_WRITE_BUFFER_YML = (pathlib.Path(__file__).parent / "upstream_configs"
                             / "danube_broker_write_buffer.yml")

pytestmark = pytest.mark.skipif(redis_server_binary() is None,
                                reason="redis-server not installed (bash bin/test installs it)")


def upstream_config(tmp_path, redis_url, wait_replicas=1):
    text = UPSTREAM_WRITE_BUFFER_YML.read_text()
    text = text.replace('"redis://127.0.0.1:6379"', f'"{redis_url}"')
    text = re.sub(r"wait_replicas: 0 ", f"wait_replicas: {wait_replicas} ", text)
    text = text.replace("wait_timeout_ms: 100", "wait_timeout_ms: 1000")
    for port in ("client: 6650", "admin: 50051", "prometheus: 9040"):
        text = text.replace(port, port.split(":")[0] + ": 0")
    text = text.replace('"./danube-data/wal"', f'"{tmp_path}/wal"')
    path = tmp_path / "danube_broker_write_buffer.yml"
    path.write_text(text)
    return path


@pytest.fixture
def redis_pair(tmp_path):
    pair = RedisPair(str(tmp_path / "redis"), replicas=1)
    yield pair
    pair.stop()


def start(tmp_path, redis_pair):
    b = BrokerProcess(data_dir=tmp_path / "data")
    b.args += ["--config-file", str(upstream_config(tmp_path, redis_pair.url))]
    return b.start()


def stream_offsets(server, topic):
    with server.client() as c:
        rows = c.xrange(f"/topics{topic}/stream", "-", "+")
    out = []
    for rid, fields in rows:
        first = int(rid.split(b"-")[0])
        out.extend(range(first, first + len(fields[b"ends"]) // 8))
    return out


def subscription_first(broker, topic):
    """The subscription exists before anything is published (it starts at the end)."""
    run_scenario("reliable_steps.py", {"url": broker_url(broker), "topic": topic, "steps": [
        {"op": "subscribe", "as": "drainer", "name": "drainer", "subscription": "s",
         "kind": "exclusive", "plan": {}, "new_client": True},
        {"op": "close", "as": "drainer"}]})


def drain(broker, topic, payloads, tmp_path):
    expect = tmp_path / "expect.txt"
    expect.write_text("\n".join(payloads) + "\n")
    return run_scenario("reliable_drain.py", {
        "url": broker_url(broker), "topic": topic, "name": "drainer", "subscription": "s",
        "expect_file": str(expect), "timeout": 60})


def test_primary_killed_publishes_fail_cleanly_then_resume(tmp_path, redis_pair):
    broker = start(tmp_path, redis_pair)
    topic = unique_topic("wb-primary")
    acked = []
    try:
        with grpc.insecure_channel(broker.client_addr) as ch:
            pid = create_producer(ch, topic, "p", pb.Reliable)
            subscription_first(broker, topic)
            for i in range(20):
                send(ch, topic, pid, b"before-%d" % i)
                acked.append(f"before-{i}")
            assert stream_offsets(redis_pair.replicas[0], topic) == list(range(20))
            redis_pair.primary.kill()
            with pytest.raises(grpc.RpcError) as err:
                send(ch, topic, pid, b"while-down")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "write buffer" in err.value.details()
            redis_pair.primary.start()
            redis_pair.replicas[0].wait_linked()

            def resumed():
                try:
                    send(ch, topic, pid, b"after-0")
                    return True
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    return False
            wait_for(resumed, timeout=60, what="publishes to resume", interval=0.2)
            acked.append("after-0")
            for i in range(1, 20):
                send(ch, topic, pid, b"after-%d" % i)
                acked.append(f"after-{i}")
        import urllib.request
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{broker.prom_port}/metrics", timeout=10).read().decode()
        from prometheus_client.parser import text_string_to_metric_families
        # Every series carries the broker's id (upstream's broker label): keyed without it.
        values = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "broker"))):
                  s.value
                  for family in text_string_to_metric_families(metrics)
                  for s in family.samples if s.name.startswith("danube_write_buffer")}
        assert values[("danube_write_buffer_failures_total", ())] >= 1
        assert values[("danube_write_buffer_entries_total", ())] >= 40
        assert values[("danube_write_buffer_failing", ())] == 0
        assert values[("danube_write_buffer_confirmed_offset", (("topic", topic),))] >= 40
        got = drain(broker, topic, acked, tmp_path)
        assert got["complete"], got
        received = [p for p, _ in got["received"]]
        assert set(acked) <= set(received)
        offsets = [o for _, o in got["received"]]
        assert len(set(offsets)) == len(offsets)        # no offset twice
        # The stream has every offset the broker gave out, without a hole.
        ends = stream_offsets(redis_pair.primary, topic)
        assert ends == list(range(len(ends))) and len(ends) >= len(acked)
    finally:
        broker.stop()


def test_a_lost_disk_is_rebuilt_from_the_stream(tmp_path, redis_pair):
    broker = start(tmp_path, redis_pair)
    topic = unique_topic("wb-disk")
    payloads = [f"m-{i}" for i in range(100)]
    with grpc.insecure_channel(broker.client_addr) as ch:
        pid = create_producer(ch, topic, "p", pb.Reliable)
        subscription_first(broker, topic)
        for p in payloads:
            send(ch, topic, pid, p.encode())
    broker.proc.kill()
    broker.proc.wait()
    shutil.rmtree(tmp_path / "wal")          # the broker's disk is gone
    broker = start(tmp_path, redis_pair)
    try:
        got = drain(broker, topic, payloads, tmp_path)
        assert got["complete"], got
        assert got["received"] == [[p, i] for i, p in enumerate(payloads)]
        assert "rebuilt the log from the write buffer: 100 message(s), offsets 0..99" in \
            broker.log()
        key = f"/topics{topic}/stream"
        with redis_pair.primary.client() as c:
            assert c.exists(key)
        with grpc.insecure_channel(broker.admin_addr) as ch:
            ch.unary_unary("/danube_admin.TopicAdmin/DeleteTopic",
                           request_serializer=admin_pb.TopicRequest.SerializeToString,
                           response_deserializer=admin_pb.TopicResponse.FromString)(
                admin_pb.TopicRequest(name=topic), timeout=10)
        with redis_pair.primary.client() as c:
            assert not c.exists(key)
        with grpc.insecure_channel(broker.client_addr) as ch:
            pid = create_producer(ch, topic, "p2", pb.Reliable)
            assert send(ch, topic, pid, b"fresh").request_id == 1
        with redis_pair.primary.client() as c:
            assert [r[0] for r in c.xrange(key, "-", "+")] == [b"0-1"]
    finally:
        broker.stop()
