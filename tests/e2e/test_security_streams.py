"""Streams under RBAC (issue 22): a ReceiveMessages stream ends with PERMISSION_DENIED when a
change of roles or bindings revokes its permission, and with UNAUTHENTICATED when its token
expires (docs/security.md, Streams)."""

import queue
import threading
import time
import uuid

import grpc
import pytest

from danube.proto import DanubeApi_pb2 as pb
from secure_broker import SUPER, Security, broker_fixture, token
from secure_broker import admin, client  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)

DENIED = grpc.StatusCode.PERMISSION_DENIED


broker = broker_fixture("streams", jwt_extra="leeway_seconds: 0\n")


@pytest.fixture(scope="module")
def sec(admin):
    s = Security(admin)
    s.role("only-Consume", "Consume")
    return s


def _unique(prefix):
    return f"/default/{prefix}-{uuid.uuid4().hex[:8]}"


def _producer(client, topic):
    return client.call("/danube.ProducerService/CreateProducer", pb.ProducerRequest(
        request_id=1, producer_name=f"p-{uuid.uuid4().hex[:6]}", topic_name=topic,
        dispatch_strategy=pb.Reliable), pb.ProducerResponse, token=token(SUPER)).producer_id


def _consumer(client, topic, tok):
    return client.call("/danube.ConsumerService/Subscribe", pb.ConsumerRequest(
        request_id=1, topic_name=topic, consumer_name=f"c-{uuid.uuid4().hex[:6]}",
        subscription="s", subscription_type=pb.ConsumerRequest.Shared),
        pb.ConsumerResponse, token=tok).consumer_id


def _stream_in_thread(client, consumer_id, tok):
    out = queue.Queue()

    def run():
        try:
            for m in client.stream("/danube.ConsumerService/ReceiveMessages",
                                   pb.ReceiveRequest(request_id=1, consumer_id=consumer_id),
                                   pb.StreamMessage, token=tok, timeout=60):
                out.put(("msg", m.payload))
            out.put(("end", grpc.StatusCode.OK, ""))
        except grpc.RpcError as exc:
            out.put(("end", exc.code(), exc.details()))

    threading.Thread(target=run, daemon=True).start()
    return out


def _next_end(out, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        item = out.get(timeout=max(0.01, deadline - time.time()))
        if item[0] == "end":
            return item[1], item[2]
    raise AssertionError("the stream did not end")


def _send(client, producer_id, topic, payload):
    client.call("/danube.ProducerService/SendMessage", pb.StreamMessage(
        request_id=1, msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic),
        payload=payload), pb.MessageResponse, token=token(SUPER))


def test_a_role_deleted_while_a_consumer_streams_ends_the_stream(client, sec):
    topic = _unique("revoke")
    producer_id = _producer(client, topic)
    subject = f"u-{uuid.uuid4().hex[:8]}"
    tok = token(subject)
    sec.role(f"consume-{subject}", "Consume")
    sec.bind(f"{subject}-b", subject, [f"consume-{subject}"], "topic", topic)
    consumer_id = _consumer(client, topic, tok)
    out = _stream_in_thread(client, consumer_id, tok)
    _send(client, producer_id, topic, b"before")
    assert out.get(timeout=10) == ("msg", b"before")
    sec.delete_role(f"consume-{subject}")
    code, details = _next_end(out)
    assert code == DENIED and "revoked while the stream was open" in details
    # Nothing more reaches it, and it cannot come back.
    _send(client, producer_id, topic, b"after")
    with pytest.raises(grpc.RpcError) as info:
        next(client.stream("/danube.ConsumerService/ReceiveMessages",
                           pb.ReceiveRequest(request_id=1, consumer_id=consumer_id),
                           pb.StreamMessage, token=tok, timeout=5))
    assert info.value.code() == DENIED


def test_a_stream_ends_when_its_token_expires(client, sec):
    topic = _unique("expiry")
    _producer(client, topic)
    subject = f"u-{uuid.uuid4().hex[:8]}"
    sec.bind(f"{subject}-b", subject, ["only-Consume"], "topic", topic)
    consumer_id = _consumer(client, topic, token(subject))
    started = time.time()
    out = _stream_in_thread(client, consumer_id, token(subject, ttl=3))
    code, details = _next_end(out, timeout=15)
    assert code == grpc.StatusCode.UNAUTHENTICATED and "expired" in details
    assert time.time() - started >= 2
