"""A publish over the broker's size limits is refused from its gRPC length prefix: at once,
with INVALID_ARGUMENT naming the size and the limit, before the body is read, and without
harming the connection. Seen through a raw HTTP/2 peer, grpcio, our client library and CLI,
and the official client (which retries RESOURCE_EXHAUSTED without end)."""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import grpc
import pytest

from broker_process import BrokerProcess
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeExt_pb2 as ext
from grpc_calls import create_producer, receive, subscribe, unary
from official_client import broker_url, run_scenario, unique_topic
from rpc_fixtures import RawH2Client

POLICY = 1 << 20            # policies.max_message_size
CAP = 4 << 20               # grpc.max_message_size
ALLOWANCE = 64 * 1024       # danube.config.ENVELOPE_ALLOWANCE
SEND = "/danube.ProducerService/SendMessage"
BATCH = "/danube_ext.BatchProducer/SendMessages"
INVALID_ARGUMENT, RESOURCE_EXHAUSTED = 3, 8
E_NO_ERROR = 0


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "broker.yml"
    # The Prometheus exporter on a free port: the tests count the broker's calls there.
    cfg.write_text(f"policies:\n  max_message_size: {POLICY}\ngrpc:\n  max_message_size: {CAP}\n"
                   f"broker:\n  ports:\n    prometheus: 0\n")
    b = BrokerProcess("--config-file", str(cfg),
                      data_dir=tmp_path_factory.mktemp("oversize") / "d").start()
    yield b
    b.stop()


@pytest.fixture
def producer(broker):
    """(topic, producer id) of a fresh non-reliable producer."""
    topic = unique_topic("oversize")
    with grpc.insecure_channel(broker.client_addr) as ch:
        return topic, create_producer(ch, topic, "big")


def message_head(producer_id, topic):
    """What a client serializes ahead of the payload (fields 1 and 2)."""
    return pb.StreamMessage(request_id=1, msg_id=pb.MsgID(producer_id=producer_id,
                                                         topic_name=topic)).SerializeToString()


def grpc_details(result):
    return urllib.parse.unquote((result.header(b"grpc-message") or b"").decode())


def send_prefix_only(client, size, head):
    """HEADERS and one DATA frame holding a length prefix announcing `size` bytes and the
    message's first bytes; the rest is never sent."""
    sid = client.start_call(SEND, end=False)
    client.wait(lambda: client.settings_received)
    client.conn.send_data(sid, b"\x00" + size.to_bytes(4, "big") + head, end_stream=False)
    client.flush()
    return sid


def assert_refused(details, size, topic=None):
    assert f"message of {size} bytes exceeds max_message_size ({POLICY} bytes)" in details, \
        details
    if topic is not None:
        assert details.endswith(f" on {topic}"), details


def send_ok(client, producer_id, topic, payload=b"fine"):
    msg = pb.StreamMessage(request_id=2, msg_id=pb.MsgID(producer_id=producer_id,
                                                        topic_name=topic), payload=payload)
    r = client.call(SEND, [msg.SerializeToString()], timeout=10)
    assert r.grpc_status == 0, r.trailers
    return r


# -- the transport, seen by a raw HTTP/2 peer ---------------------------------------------

@pytest.mark.parametrize("size", [POLICY + ALLOWANCE + 1, 2 << 20, 20_000_000],
                         ids=["just-over-early-limit", "between-policy-and-cap", "over-cap"])
def test_length_prefix_alone_gets_the_refusal(broker, producer, size):
    topic, producer_id = producer
    client = RawH2Client(broker.client_port)
    try:
        sid = send_prefix_only(client, size, message_head(producer_id, topic) + b"\x1a")
        assert client.wait(lambda: client.streams[sid].done, 5), \
            "no answer without the message body"
        result = client.streams[sid]
        assert result.grpc_status == INVALID_ARGUMENT, result.headers
        assert_refused(grpc_details(result), size, topic)
        # The stream is reset so the client stops sending (RFC 9113 8.1: NO_ERROR).
        assert client.wait(lambda: result.reset is not None, 5)
        assert result.reset == E_NO_ERROR
        assert client.terminated is None
        send_ok(client, producer_id, topic)
    finally:
        client.close()


def test_refusal_without_a_recognisable_head_still_names_size_and_limit(broker):
    client = RawH2Client(broker.client_port)
    try:
        sid = send_prefix_only(client, 3 << 20, b"")
        assert client.wait(lambda: client.streams[sid].done, 5)
        assert client.streams[sid].grpc_status == INVALID_ARGUMENT
        assert_refused(grpc_details(client.streams[sid]), 3 << 20)
    finally:
        client.close()


def test_body_sent_after_the_refusal_is_dropped_and_credited(broker, producer):
    """Each refused call carries a full stream window of body (4 MiB) the server did not
    want; together more than the connection window (64 MiB). The server must give that
    connection credit back, or this client stalls, and the connection must still work."""
    topic, producer_id = producer
    client = RawH2Client(broker.client_port)
    try:
        request = (b"\x00" + (20_000_000).to_bytes(4, "big") + message_head(producer_id, topic)
                   + b"\x1a" + b"x" * (8 << 20))
        sent = 0
        for _ in range(20):
            sid = client.start_call(SEND, end=False)
            sent += send_until_answered(client, sid, request)
            assert client.streams[sid].grpc_status == INVALID_ARGUMENT
        assert sent >= 80 << 20
        assert client.terminated is None
        send_ok(client, producer_id, topic)
    finally:
        client.close()


def send_until_answered(client, sid, data, timeout=10.0):
    """Send `data` as the windows allow, reading only when they are shut, until the call is
    answered; returns the bytes sent. Fails if the windows stay shut."""
    deadline = time.monotonic() + timeout
    client.wait(lambda: client.settings_received)
    pos = 0
    while not client.streams[sid].done:
        allowed = min(client.conn.local_flow_control_window(sid),
                      client.conn.max_outbound_frame_size, len(data) - pos)
        if allowed <= 0:
            assert time.monotonic() < deadline, "windows shut and no answer"
            client.pump(0.5)
            continue
        client.conn.send_data(sid, data[pos:pos + allowed])
        client.flush()
        pos += allowed
    return pos


# -- grpcio --------------------------------------------------------------------------------

@pytest.mark.parametrize("payload_size", [POLICY + 1, 2 << 20, 20_000_000])
def test_grpcio_gets_invalid_argument_and_keeps_its_channel(broker, payload_size):
    topic = unique_topic("oversize-grpcio")
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p")
        consumer_id = subscribe(ch, topic, "c", "s", pb.ConsumerRequest.Exclusive)
        stream = receive(ch, consumer_id)
        send = unary(ch, SEND, pb.MessageResponse)

        def message(request_id, payload):
            return pb.StreamMessage(request_id=request_id, msg_id=pb.MsgID(
                producer_id=producer_id, topic_name=topic), payload=payload)
        try:
            with pytest.raises(grpc.RpcError) as err:
                send(message(1, b"b" * payload_size), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details()
            assert f"exceeds max_message_size ({POLICY} bytes) on {topic}" in details, details
            assert send(message(2, b"after"), timeout=10).request_id == 2
            assert next(stream).payload == b"after"
        finally:
            stream.cancel()


def test_message_at_the_limit_is_accepted(broker):
    """A payload of exactly the policy limit, with an envelope near the allowance (its
    length prefix is then just under policy + allowance), is taken: the early check must
    not cut into what the exact payload check allows."""
    topic = unique_topic("oversize-edge")
    with grpc.insecure_channel(broker.client_addr) as ch:
        producer_id = create_producer(ch, topic, "p")
        consumer_id = subscribe(ch, topic, "c", "s", pb.ConsumerRequest.Exclusive)
        stream = receive(ch, consumer_id)
        send = unary(ch, SEND, pb.MessageResponse)
        attributes = {f"k{i}": "v" * 1000 for i in range(60)}
        msg = pb.StreamMessage(request_id=5, msg_id=pb.MsgID(producer_id=producer_id,
                                                             topic_name=topic),
                               payload=b"e" * POLICY, attributes=attributes)
        assert POLICY + 60_000 < msg.ByteSize() <= POLICY + ALLOWANCE
        try:
            assert send(msg, timeout=10).request_id == 5
            got = next(stream)
            assert len(got.payload) == POLICY and got.attributes == attributes
        finally:
            stream.cancel()


def test_batch_over_the_transport_cap_is_invalid_argument(broker, producer):
    topic, producer_id = producer
    with grpc.insecure_channel(broker.client_addr) as ch:
        send = unary(ch, BATCH, ext.BatchResponse)
        batch = ext.MessageBatch(producer_id=producer_id, messages=[
            pb.StreamMessage(payload=b"m" * (POLICY - 100)) for _ in range(5)])
        assert batch.ByteSize() > CAP
        with pytest.raises(grpc.RpcError) as err:
            send(batch, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (f"batch of {batch.ByteSize()} bytes exceeds the broker's grpc.max_message_size "
                f"({CAP} bytes)") == err.value.details()
        del batch.messages[3:]
        assert send(batch, timeout=10).accepted == 3


def test_other_methods_keep_the_transport_cap(broker):
    client = RawH2Client(broker.client_port)
    try:
        sid = client.start_call("/danube.ProducerService/CreateProducer", end=False)
        client.wait(lambda: client.settings_received)
        client.conn.send_data(sid, b"\x00" + (CAP + 1).to_bytes(4, "big") + b"ab")
        client.flush()
        assert client.wait(lambda: client.streams[sid].done, 5)
        assert client.streams[sid].grpc_status == RESOURCE_EXHAUSTED
    finally:
        client.close()


# -- our client library and CLI ----------------------------------------------------------

@pytest.mark.parametrize("payload_size", [2 << 20, 20_000_000])
async def test_client_library_reports_the_refusal_without_retrying(broker, payload_size):
    from danube.client import DanubeClient, InvalidArgument
    from danube.client.retry import RetryPolicy
    # A retry would first back off 60 s: any retry at all shows as a minute, which no slow
    # machine makes of one refused call.
    client = DanubeClient(f"http://{broker.client_addr}",
                          retry=RetryPolicy(base_backoff_ms=60_000, max_backoff_ms=60_000))
    try:
        topic = unique_topic("oversize-lib")
        producer = await client.create_producer(topic, "p")
        start = time.monotonic()
        with pytest.raises(InvalidArgument) as err:
            await producer.send(b"x" * payload_size)
        elapsed = time.monotonic() - start
        assert f"exceeds max_message_size ({POLICY} bytes) on {topic}" in str(err.value)
        assert elapsed < 20, f"{elapsed:.1f} s: the refusal was retried"
        assert await producer.send(b"small") > 0
    finally:
        await client.close()


async def test_local_size_refusal_is_not_retried(broker):
    """A channel with a send cap of its own refuses locally; the same request would meet the
    same cap on every retry."""
    from danube.client.retry import RetryPolicy
    from danube.rpc import RpcError, StatusCode
    from danube.rpc.client import Channel
    from danube.rpc.connection import TransportConfig
    async with Channel(broker.client_addr,
                       config=TransportConfig(max_message_size=1 << 20)) as ch:
        with pytest.raises(RpcError) as err:
            await ch.unary_unary(SEND)(b"x" * (2 << 20), timeout=5)
    assert err.value.code == StatusCode.RESOURCE_EXHAUSTED and err.value.local
    assert not RetryPolicy().retryable(err.value)
    assert RetryPolicy().retryable(RpcError(StatusCode.RESOURCE_EXHAUSTED, "quota"))


def refused_sends(broker):
    """SendMessage calls the broker answered INVALID_ARGUMENT, from its exporter."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{broker.prom_port}/metrics",
                                  timeout=30).read().decode()
    # Upstream's labels: service "producer", method "send_message" (and our status code).
    for line in body.splitlines():
        if line.startswith("danube_broker_rpc_total{") and 'service="producer"' in line \
                and 'method="send_message"' in line and 'code="INVALID_ARGUMENT"' in line:
            return float(line.split()[-1])
    return 0.0


def test_cli_produce_of_a_big_file_fails_fast(broker, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(b"z" * 20_000_000)
    topic = unique_topic("oversize-cli")
    refused_before = refused_sends(broker)
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "danube", "produce", "-s", f"http://{broker.client_addr}",
         "-t", topic, "-f", str(big), "--output", "json"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 1, proc
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["index"] == 1
    assert "INVALID_ARGUMENT" in lines[0]["error"]
    assert f"exceeds max_message_size ({POLICY} bytes) on {topic}" in lines[0]["error"]
    assert lines[-1]["sent"] == 0 and lines[-1]["failed"] == 1
    # Not retried: the broker refused exactly one call (counted, not timed).
    assert refused_sends(broker) - refused_before == 1


def test_cli_text_output_names_the_error(broker, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(b"z" * (2 << 20))
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "danube", "produce", "-s", f"http://{broker.client_addr}",
         "-t", unique_topic("oversize-cli"), "-f", str(big)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 1, proc
    assert "Message 1/1 failed" in proc.stderr and "INVALID_ARGUMENT" in proc.stderr, proc.stderr
    assert f"exceeds max_message_size ({POLICY} bytes)" in proc.stderr


# -- the official client -----------------------------------------------------------------

OFFICIAL_OVERSIZE = """
import asyncio
from _lib import new_client, new_producer

async def main(args):
    client = await new_client(args["url"])
    producer = await new_producer(client, args["topic"], "big")
    out = {}
    for size in args["sizes"]:
        try:
            await asyncio.wait_for(producer.send(b"o" * size, {}), 10)
            out[str(size)] = "OK"
        except asyncio.TimeoutError:
            out[str(size)] = "no answer in 10 s"
        except Exception as exc:
            code = getattr(exc, "code", None)
            out[str(size)] = f"{code().name}: {exc.details()}" if callable(code) else repr(exc)
    out["after"] = await producer.send(b"small", {})
    return out
"""


def test_official_client_meets_the_policy_not_the_cap(broker):
    topic = unique_topic("oversize-official")
    result = run_scenario(OFFICIAL_OVERSIZE, {"url": broker_url(broker), "topic": topic,
                                              "sizes": [2 << 20, 20_000_000]}, timeout=60)
    for size in (2 << 20, 20_000_000):
        assert result[str(size)].startswith("INVALID_ARGUMENT: "), result
        assert f"exceeds max_message_size ({POLICY} bytes) on {topic}" in result[str(size)]
    assert result["after"] >= 0
