"""`danube_consumer_bytes_out_total` counts payload bytes, as upstream's consumer does
(danube-broker/src/consumer.rs: `payload.len()`) and as `danube_topic_bytes_in_total` does,
not the encoded StreamMessages (issue 52): 10 messages of 10 bytes consumed and acked are
100 bytes in and 100 bytes out, on a reliable topic (delivered from the WAL, rewritten with
its stamp) and on a non-reliable one (canonicalised once at publish), from a real broker
process's /metrics. The /ui/v1 figures and the MCP tools are PromQL sums of this series."""

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_process import BrokerProcess
from danube.client import DanubeClient

PAYLOADS = [b"payload-%02d" % i for i in range(10)]       # 10 bytes each


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0",
                      data_dir=tmp_path_factory.mktemp("bytes-out")).start()
    yield b
    b.stop()


def series(port, name, **labels):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return sum(s.value for f in text_string_to_metric_families(body.decode())
               for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("reliable", [True, False], ids=["reliable", "non-reliable"])
async def test_bytes_out_counts_payload_bytes(broker, reliable):
    assert all(len(p) == 10 for p in PAYLOADS)
    topic = f"/default/bytes-out-{'reliable' if reliable else 'plain'}"
    client = DanubeClient(f"http://{broker.client_addr}")
    try:
        producer = await client.create_producer(topic, "p", reliable=reliable)
        # Subscribed before the first send: a non-reliable topic keeps nothing.
        consumer = await client.subscribe(topic, "c", "sub", sub_type="exclusive")
        for payload in PAYLOADS:
            await producer.send(payload)
        got = []
        while len(got) < len(PAYLOADS):
            msg = await consumer.receive(timeout=60)
            got.append(msg.payload)
            await consumer.ack(msg)
        assert got == PAYLOADS
        port = broker.prom_port
        assert series(port, "danube_topic_bytes_in_total", topic=topic) == 100
        assert series(port, "danube_consumer_messages_out_total", topic=topic,
                      subscription="sub") == 10
        assert series(port, "danube_consumer_bytes_out_total", topic=topic,
                      subscription="sub") == 100
    finally:
        await client.close()
