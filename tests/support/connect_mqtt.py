"""What the source-mqtt tests share: the connector's configuration file, a paho publisher
and the connector started as a child process (the Danube side's Collector is
connector_process's)."""

import asyncio
import uuid

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from connector_process import ConnectorProcess, runtime_toml


def write_config(path, broker, mosquitto, topic, *, qos="AtLeastOnce", extra="",
                 routes=None, name=None, clean=False):
    name = name or f"mqtt-{uuid.uuid4().hex[:8]}"
    routes = routes or f'[[mqtt.routes]]\nfrom = "sensors/+/temp"\nto = "{topic}"\n' \
                       f'qos = "{qos}"\n'
    head = runtime_toml("source-mqtt", f"http://{broker.client_addr}", name,
                        batch_size=500, poll_interval_ms=50)
    path.write_text(f'''{head}
[mqtt]
broker_host = "127.0.0.1"
broker_port = {mosquitto.port}
client_id = "{name}"
clean_session = {"true" if clean else "false"}
{extra}

{routes}
''')
    return path


def publisher(mosquitto, client_id=None):
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id or uuid.uuid4().hex,
                    protocol=paho.MQTTv5)
    c.max_inflight_messages_set(1000)
    c.connect("127.0.0.1", mosquitto.port)
    c.loop_start()
    return c


def publish_all(client, topic, payloads, qos=1):
    infos = [client.publish(topic, p, qos=qos) for p in payloads]
    for info in infos:
        info.wait_for_publish(60)


async def started(tmp_path, broker, mosquitto, topic, ready=True, **kw):
    """The connector as a child process, once it is ready (``ready``) or only listening."""
    conn = ConnectorProcess(write_config(tmp_path / "mqtt.toml", broker, mosquitto, topic,
                                         **kw))
    await asyncio.to_thread(conn.start, ready)
    return conn
