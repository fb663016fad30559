"""README features checked against a real `danube broker` process: `--advertised-addr`, the
`grpc.max_message_size` and `grpc.max_concurrent_streams` keys, and the CLI's `-p` and
`--sub-type`. Local retention and the upload-failure metric are in
test_readme_storage_features.py."""

import os
import subprocess
import sys

import grpc
import hpack
import hyperframe.frame
import pytest

from broker_process import BrokerProcess
from configured_broker import metric, start_with_config
from danube.proto import DanubeApi_pb2 as pb
from grpc_calls import create_producer, receive, send, subscribe, unary
from rpc_fixtures import FrameStream, encode_request, h2_frame, raw_connection

HEALTH = "/danube.HealthCheck/HealthCheck"
CLI = [sys.executable, "-P", "-m", "danube"]


# -- --advertised-addr ----------------------------------------------------------------------

def test_advertised_addr_is_what_lookups_and_deliveries_carry(tmp_path):
    """The broker listens on 127.0.0.1:<free port> but tells clients to dial the advertised
    address: TopicLookup answers it, and reliable deliveries carry it as msg_id.broker_addr
    (what the official clients ack through)."""
    advertised = "broker.example.test:7777"
    b = BrokerProcess("--advertised-addr", advertised, data_dir=tmp_path / "d").start()
    try:
        topic = "/default/advertised"
        with grpc.insecure_channel(b.client_addr) as ch:
            producer = create_producer(ch, topic, "p", pb.Reliable)
            lookup = unary(ch, "/danube.Discovery/TopicLookup", pb.TopicLookupResponse)
            resp = lookup(pb.TopicLookupRequest(request_id=1, topic=topic), timeout=5)
            assert resp.response_type == pb.TopicLookupResponse.Connect
            assert resp.broker_url == resp.connect_url == f"http://{advertised}"
            assert not resp.proxy
            consumer = subscribe(ch, topic, "c", "s", pb.ConsumerRequest.Exclusive)
            stream = receive(ch, consumer)
            try:
                send(ch, topic, producer, b"hello")
                msg = next(stream)
            finally:
                stream.cancel()
            assert msg.payload == b"hello"
            assert msg.msg_id.broker_addr == f"http://{advertised}"
        assert f"broker_url=http://{advertised}" in b.log()
    finally:
        b.stop()


# -- grpc.max_message_size and grpc.max_concurrent_streams ----------------------------------

GRPC_CAP = 2 << 20          # grpc.max_message_size: far below the 16 MiB default


def raw_call(addr, path, body, timeout=10):
    """`body` (bytes) sent as the request of a unary call; the response is not decoded."""
    with grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        return ch.unary_unary(path)(body, timeout=timeout)


def test_grpc_max_message_size_key_caps_every_request(tmp_path):
    """A request above the configured transport cap is refused with RESOURCE_EXHAUSTED
    naming the cap; one just below it is served (the default cap would take both)."""
    b = start_with_config(tmp_path, f"policies:\n  max_message_size: {1 << 20}\n"
                                    f"grpc:\n  max_message_size: {GRPC_CAP}\n")
    try:
        # A HealthCheckRequest padded with an unknown field (number 15, bytes) of any size.
        def health_request(size):
            padding = b"p" * (size - 6)
            field = bytes([15 << 3 | 2]) + _varint(len(padding)) + padding
            msg = pb.HealthCheckRequest(id=1).SerializeToString() + field
            assert abs(len(msg) - size) < 16
            return msg
        reply = raw_call(b.client_addr, HEALTH, health_request(GRPC_CAP - 1024))
        assert pb.HealthCheckResponse.FromString(reply).status == pb.HealthCheckResponse.CLOSE
        with pytest.raises(grpc.RpcError) as err:
            raw_call(b.client_addr, HEALTH, health_request(GRPC_CAP + 1024))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(GRPC_CAP) in err.value.details(), err.value.details()
    finally:
        b.stop()


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


MAX_STREAMS = 3
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
REFUSED_STREAM = 0x7
HEADERS, END_HEADERS = 0x1, 0x4


def test_grpc_max_concurrent_streams_key_is_advertised_and_enforced(tmp_path):
    """The server's SETTINGS carries the configured limit, and a stream beyond it is refused
    with RST_STREAM REFUSED_STREAM while the first ones stay open."""
    b = start_with_config(tmp_path, f"grpc:\n  max_concurrent_streams: {MAX_STREAMS}\n")
    sock = raw_connection(b.client_port)
    try:
        frames = FrameStream(sock)
        assert frames.wait(lambda fs: any(isinstance(f, hyperframe.frame.SettingsFrame)
                                          and "ACK" not in f.flags for f in fs))
        settings = next(f for f in frames.frames
                        if isinstance(f, hyperframe.frame.SettingsFrame) and "ACK" not in f.flags)
        assert settings.settings.get(SETTINGS_MAX_CONCURRENT_STREAMS) == MAX_STREAMS
        sock.sendall(h2_frame(0x4, 0x1, 0, b""))            # SETTINGS ACK
        encoder = hpack.Encoder()
        # Requests left open (no END_STREAM): each holds a stream slot.
        sids = [1 + 2 * i for i in range(MAX_STREAMS + 1)]
        for sid in sids:
            sock.sendall(h2_frame(HEADERS, END_HEADERS, sid,
                                  encode_request(HEALTH, b.client_port, encoder=encoder)))

        def reset_of(sid):
            return [f for f in frames.of_stream(sid, hyperframe.frame.RstStreamFrame)]
        assert frames.wait(lambda fs: reset_of(sids[-1])), "stream over the limit not refused"
        assert reset_of(sids[-1])[0].error_code == REFUSED_STREAM
        assert not any(reset_of(sid) for sid in sids[:-1])
    finally:
        sock.close()
        b.stop()


# -- CLI -p and --sub-type ------------------------------------------------------------------

def run_cli(*args, timeout=60):
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0",
                      data_dir=tmp_path_factory.mktemp("readme") / "d").start()
    yield b
    b.stop()


def test_cli_produce_partitions_creates_and_spreads_over_them(broker):
    """`danube produce -p 3` creates the partitioned topic (partitions <topic>-part-N) and
    sends round-robin: 6 messages, 2 to each partition."""
    topic = "/default/cli_partitioned"
    result = run_cli("produce", "-s", broker.client_addr, "-t", topic, "-p", "3", "-m", "m",
                     "-c", "6", "-i", "100")
    assert "Success: 6" in result.stdout, result.stdout
    counts = [metric(broker, "danube_topic_messages_in_total", topic=f"{topic}-part-{i}")
              for i in range(3)]
    assert counts == [2, 2, 2]
    assert metric(broker, "danube_topic_messages_in_total", topic=topic) is None


SUB_TYPES = {"exclusive": "Exclusive", "shared": "Shared", "fail-over": "Failover",
             "key-shared": "KeyShared"}


@pytest.mark.parametrize("flag", SUB_TYPES)
def test_cli_consume_sub_type_is_the_subscription_type(broker, flag):
    """`danube consume --sub-type X` subscribes as X: joining its subscription with another
    type is refused with a message naming the type the CLI chose."""
    topic, sub = f"/default/cli_subtype_{flag}", f"sub-{flag}"
    run_cli("produce", "-s", broker.client_addr, "-t", topic, "-m", "init")
    proc = subprocess.Popen([*CLI, "consume", "-s", broker.client_addr, "-t", topic, "-m", sub,
                             "--sub-type", flag, "--count", "1", "--timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "Consuming from" in proc.stderr.readline()
        other = pb.ConsumerRequest.Shared if flag != "shared" else pb.ConsumerRequest.Exclusive
        with grpc.insecure_channel(broker.client_addr) as ch:
            with pytest.raises(grpc.RpcError) as err:
                subscribe(ch, topic, "intruder", sub, other)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert f"is {SUB_TYPES[flag]}, not" in err.value.details(), err.value.details()
            # The CLI's consumer is served: the subscription is really its.
            producer = create_producer(ch, topic, "p2")
            send(ch, topic, producer, b"for the cli")
        out, err_text = proc.communicate(timeout=30)
        assert proc.returncode == 0, err_text
        assert "Received message: for the cli" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
