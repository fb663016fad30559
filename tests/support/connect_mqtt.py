"""What the source-mqtt tests share: the connector's configuration file, a paho publisher,
and a Danube consumer collecting what the connector published."""

import asyncio
import uuid

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from connector_process import ConnectorProcess


def write_config(path, broker, mosquitto, topic, *, qos="AtLeastOnce", extra="",
                 routes=None, name=None, clean=False):
    name = name or f"mqtt-{uuid.uuid4().hex[:8]}"
    routes = routes or f'[[mqtt.routes]]\nfrom = "sensors/+/temp"\nto = "{topic}"\n' \
                       f'qos = "{qos}"\n'
    path.write_text(f'''
connector = "source-mqtt"
danube_service_url = "http://{broker.client_addr}"
connector_name = "{name}"

[retry]
max_retries = 2
retry_backoff_ms = 100
max_backoff_ms = 1000

[processing]
batch_size = 500
poll_interval_ms = 50
metrics_port = 0
metrics_host = "127.0.0.1"

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


class Collector:
    """A Danube consumer in the test's loop, collecting payloads (and messages)."""

    def __init__(self, client, topic):
        self.client, self.topic = client, topic
        self.messages = []
        self._task = None

    async def start(self):
        self.consumer = await self.client.subscribe(self.topic, f"c-{uuid.uuid4().hex[:6]}",
                                                    "test", "exclusive")
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self):
        async for msg in self.consumer.messages():
            self.messages.append(msg)
            await self.consumer.ack(msg)

    def payloads(self):
        return [m.payload for m in self.messages]

    async def stop(self):
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.close()


async def started(tmp_path, broker, mosquitto, topic, ready=True, **kw):
    """The connector as a child process, once it is ready (``ready``) or only listening."""
    conn = ConnectorProcess(write_config(tmp_path / "mqtt.toml", broker, mosquitto, topic,
                                         **kw))
    await asyncio.to_thread(conn.start, ready)
    return conn
