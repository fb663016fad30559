"""The official danube-client (0.5.0) against a broker in auth.mode tls (issue 22): over TLS
with a token it produces and consumes (and acks) on the topic its binding names, and without
a binding or without a token it is refused."""

import uuid

import pytest

from official_client import run_scenario
from secure_broker import Caller, Security, broker_fixture, token

pytestmark = pytest.mark.timeout(180)

SCENARIO = """
import asyncio
from _lib import Receiver, new_client, new_producer
from danube import DanubeClientBuilder


async def main(args):
    builder = DanubeClientBuilder().service_url(args["url"]).with_tls(args["ca"])
    if args.get("token"):
        builder = builder.with_token(args["token"])
    client = await builder.build()
    try:
        producer = await new_producer(client, args["topic"], "sec-p", reliable=True)
        receiver = await Receiver.start(client, args["topic"], "sec-c", "sec-s")
        for i in range(3):
            await producer.send(f"m{i}".encode(), None)
        await receiver.count(3, 10)
        await receiver.quiet(0.3)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"payloads": [m["payload"] for m in receiver.messages],
            "ack_errors": receiver.ack_errors}
"""


broker = broker_fixture("official")


@pytest.fixture(scope="module")
def sec(broker, certs):
    admin = Caller(broker.admin_addr, certs)
    s = Security(admin)
    s.role("app-role", "Lookup", "Produce", "Consume")
    yield s
    admin.close()


def _run(broker, certs, topic, tok):
    return run_scenario(SCENARIO, {"url": f"https://{broker.client_addr}", "ca": certs.ca_file,
                                   "topic": topic, "token": tok})


def test_official_client_produces_and_consumes_over_tls_with_a_token(broker, certs, sec):
    topic = f"/default/official-{uuid.uuid4().hex[:8]}"
    sec.bind("app-b", "app", ["app-role"], "topic", topic)
    result = _run(broker, certs, topic, token("app"))
    assert result.get("error") is None, result
    assert sorted(result["payloads"]) == ["m0", "m1", "m2"]
    assert result["ack_errors"] == []


def test_official_client_without_a_binding_is_denied(broker, certs, sec):
    topic = f"/default/official-{uuid.uuid4().hex[:8]}"
    result = _run(broker, certs, topic, token("unbound"))
    assert "PERMISSION_DENIED" in result["error"] or "not allowed" in result["error"], result


def test_official_client_without_a_token_is_unauthenticated(broker, certs, sec):
    topic = f"/default/official-{uuid.uuid4().hex[:8]}"
    result = _run(broker, certs, topic, None)
    assert "Authentication credentials are missing" in result["error"] or \
        "UNAUTHENTICATED" in result["error"], result
