"""Danube Connect's source-mqtt against a real Mosquitto and the real broker process, run as
`danube connect run` (a child process): a round trip with upstream's attributes, QoS 0/1/2,
a SIGKILL of the connector in the middle of a QoS 1 stream (restarted: nothing lost), the
MQTT broker down for 30 s (retries counted, not ready, nothing lost), SIGTERM, and
configurations refused with the bad key named."""

import asyncio
import threading
import time
import uuid

import pytest

from broker_process import BrokerProcess
from connect_mqtt import publish_all, publisher, started, write_config
from connector_process import Collector, ConnectorProcess
from mosquitto_process import Mosquitto
from waiting import async_wait_for
from danube.client import DanubeClient


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("--prom-exporter", "127.0.0.1:0",
                      data_dir=tmp_path_factory.mktemp("connect-mqtt")).start()
    yield b
    b.stop()


@pytest.fixture
def mosquitto(tmp_path):
    m = Mosquitto(tmp_path).start()
    yield m
    m.stop()


async def test_round_trip_qos1_with_attributes(tmp_path, broker, mosquitto):
    topic = f"/default/temp_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        sent = [f"t{i}".encode() for i in range(300)]
        await asyncio.to_thread(publish_all, pub, "sensors/dev1/temp", sent)
        # A topic no route matches is not forwarded.
        await asyncio.to_thread(publish_all, pub, "other/dev1/temp", [b"x"])
        await async_wait_for(lambda: len(got.messages) >= 300, 60, "300 messages")
        assert got.payloads() == sent
        m = got.messages[0]
        assert m.attributes == {"mqtt.topic": "sensors/dev1/temp", "mqtt.qos": "1",
                                "mqtt.retain": "false", "mqtt.dup": "false",
                                "source": "mqtt"}
        assert m.routing_key == "sensors/dev1/temp"
        pub.loop_stop()
        await got.stop()
    assert conn.metric("danube_connector_messages_processed_total", topic=topic) == 300, \
        conn.log()[-5000:]
    assert conn.stop() == 0
    assert any(r.get("msg", "").startswith("stopped") for r in conn.records())


async def test_interleaved_mqtt_topics_go_in_few_broker_calls(tmp_path, broker, mosquitto):
    """Seven devices publishing interleaved, metadata on (the default): every record keeps
    its own `mqtt.topic`, and the records go to the broker in batches, not one call per
    record (each record's attributes differ from the last one's: one batch per run of equal
    attributes made one broker call per message, 6x slower, issue 52)."""
    from configured_broker import metric

    topic = f"/default/devices_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        n = 700
        infos = [pub.publish(f"sensors/dev{i % 7}/temp", f"m{i}".encode(), qos=1)
                 for i in range(n)]
        for info in infos:
            await asyncio.to_thread(info.wait_for_publish, 60)
        await async_wait_for(lambda: len(got.messages) >= n, 60, f"{n} messages")
        for m in got.messages:
            i = int(m.payload.decode()[1:])
            assert m.attributes["mqtt.topic"] == f"sensors/dev{i % 7}/temp"
            assert m.routing_key == f"sensors/dev{i % 7}/temp"
        pub.loop_stop()
        await got.stop()
    calls = metric(broker, "danube_producer_send_total", topic=topic, result="ok")
    assert calls is not None and calls <= n / 10, f"{calls} broker calls for {n} records"
    assert conn.stop() == 0


@pytest.mark.parametrize("qos,level,protocol", [("AtMostOnce", 0, "5"), ("ExactlyOnce", 2, "5"),
                                                ("ExactlyOnce", 2, "3.1.1")])
async def test_qos_0_and_2(tmp_path, broker, mosquitto, qos, level, protocol):
    topic = f"/default/q{level}_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic, qos=qos,
                         extra=f'protocol = "{protocol}"')
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        sent = [f"q{i}".encode() for i in range(100)]
        await asyncio.to_thread(publish_all, pub, "sensors/d/temp", sent, level)
        await async_wait_for(lambda: len(got.messages) >= 100, 60, "100 messages")
        assert got.payloads() == sent
        assert got.messages[0].attributes["mqtt.qos"] == str(level)
        pub.loop_stop()
        await got.stop()
    assert conn.stop() == 0


async def test_sigkill_mid_stream_loses_nothing(tmp_path, broker, mosquitto):
    """QoS 1 is acknowledged to Mosquitto only after the Danube broker acked: a connector
    killed with SIGKILL mid-stream and restarted (same client id, persistent session)
    gets every unacknowledged message again."""
    topic = f"/default/kill_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic)
    total = 20000
    sent = [f"k{i}".encode() for i in range(total)]
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto)
        feeder = threading.Thread(target=publish_all, args=(pub, "sensors/k/temp", sent))
        feeder.start()
        await async_wait_for(lambda: len(got.messages) >= 2000, 60, "2,000 forwarded")
        conn.sigkill()
        seen_at_kill = len(got.messages)
        assert seen_at_kill < total, "the stream ended before the kill: make it longer"
        await asyncio.to_thread(feeder.join, 120)
        conn2 = ConnectorProcess(conn.config_path)
        await asyncio.to_thread(conn2.start)
        try:
            await async_wait_for(lambda: set(got.payloads()) >= set(sent), 120,
                                 "every message after the restart")
        except AssertionError:
            missing = sorted(set(sent) - set(got.payloads()))
            raise AssertionError(f"{len(missing)} missing (e.g. {missing[:3]}); the restarted "
                                 f"connector's log:\n{conn2.log()[-6000:]}") from None
        pub.loop_stop()
        await got.stop()
    assert conn2.stop() == 0
    assert set(got.payloads()) == set(sent)
    # Order holds per MQTT topic apart from what the crash made redelivered.
    first = {}
    for i, p in enumerate(got.payloads()):
        first.setdefault(p, i)
    assert [p for p, _ in sorted(first.items(), key=lambda kv: kv[1])] == sent


async def test_mqtt_broker_down_30s(tmp_path, broker, mosquitto):
    topic = f"/default/down_{uuid.uuid4().hex[:8]}"
    conn = await started(tmp_path, broker, mosquitto, topic)
    async with DanubeClient(f"http://{broker.client_addr}") as client:
        got = await Collector(client, topic).start()
        pub = publisher(mosquitto, client_id="down-publisher")
        await asyncio.to_thread(publish_all, pub, "sensors/a/temp", [b"before"])
        await async_wait_for(lambda: got.payloads() == [b"before"], 60, "the first message")
        pub.loop_stop()
        pub.disconnect()
        await asyncio.to_thread(mosquitto.stop)
        await async_wait_for(lambda: not conn.ready(), 30, "not ready while Mosquitto is down")
        down_since = time.monotonic()
        await async_wait_for(
            lambda: conn.metric("danube_connector_messages_retried_total",
                                target="external") >= 2, 60, "reconnect retries counted")
        await asyncio.sleep(max(0.0, 30 - (time.monotonic() - down_since)))
        await asyncio.to_thread(mosquitto.start)
        await async_wait_for(conn.ready, 60, "ready again")
        pub = publisher(mosquitto)
        after = [f"after{i}".encode() for i in range(50)]
        await asyncio.to_thread(publish_all, pub, "sensors/a/temp", after)
        await async_wait_for(lambda: len(got.messages) >= 51, 60, "the messages after")
        assert got.payloads() == [b"before"] + after
        pub.loop_stop()
        await got.stop()
    assert conn.metric("danube_connector_health") == 1
    assert conn.stop() == 0


@pytest.mark.parametrize("extra,routes,needle", [
    ("brokr_host = \"x\"", None, "unknown key mqtt.brokr_host"),
    ("", "[[mqtt.routes]]\nfrom = \"a/#/b\"\nto = \"/iot/x\"\n", "mqtt.routes[0].from"),
    ("", "[[mqtt.routes]]\nfrom = \"a/b\"\nto = \"/iot/x/y\"\n", "mqtt.routes[0].to"),
    ("", "[[mqtt.routes]]\nfrom = \"a/b\"\nto = \"/iot/x\"\nqos = \"Twice\"\n",
     "mqtt.routes[0].qos"),
    ("keep_alive_secs = \"60\"", None, "mqtt.keep_alive_secs: expected an integer"),
    ("protocol = \"3.1.1\"\npassword = \"p\"", None,
     "mqtt.password: MQTT 3.1.1 sends a password only with a user name"),
    ("ca_file = \"/etc/hostname\"", None, "mqtt.ca_file: set only with use_tls = true"),
    ("use_tls = true\nca_file = \"/nonexistent/ca.pem\"", None,
     "mqtt.ca_file: cannot load '/nonexistent/ca.pem'"),
])
def test_bad_configuration_names_the_key(tmp_path, broker, extra, routes, needle):
    class NoMqtt:
        port = 1
    path = write_config(tmp_path / "bad.toml", broker, NoMqtt, "/iot/x", extra=extra,
                        routes=routes)
    result = ConnectorProcess(path).run_to_exit()
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr


def test_environment_overrides_and_missing_keys(tmp_path, broker):
    class NoMqtt:
        port = 1
    path = write_config(tmp_path / "env.toml", broker, NoMqtt, "/iot/x")
    result = ConnectorProcess(path, env={"MQTT_BROKER_PORT": "many"}).run_to_exit()
    assert result.returncode == 2
    assert "MQTT_BROKER_PORT: expected an integer" in result.stderr
    text = path.read_text().replace('connector_name = ', '# ')
    path.write_text(text)
    result = ConnectorProcess(path).run_to_exit()
    assert result.returncode == 2
    assert "missing key connector_name or set CONNECTOR_NAME" in result.stderr
