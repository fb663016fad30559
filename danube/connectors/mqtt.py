"""source-mqtt: MQTT topic filters -> Danube topics (upstream danube-connectors/source-mqtt,
same ``[mqtt]`` keys and ``[[mqtt.routes]]``), on paho-mqtt.

Delivery, as each QoS promises: a QoS 1 or 2 message is acknowledged to the MQTT broker
(PUBACK, or PUBREC for QoS 2) only after the Danube broker acknowledged its publish, in the
order received; with ``clean_session = false`` the MQTT broker keeps the session (its
subscriptions and every unacknowledged message) while the connector is away and sends them
again when it reconnects, so a crash loses nothing (upstream acknowledges at receipt: a
crash loses what was in flight). QoS 0 is at most once: it is never acknowledged, and is
dropped (and counted) when the connector's buffer is full.

Unlike upstream, a payload goes to Danube as it came (upstream re-encodes a non-JSON
payload as a base64 JSON object); attributes are upstream's (``mqtt.topic``, ``mqtt.qos``,
``mqtt.retain``, ``mqtt.dup``, ``source``) and the key is the MQTT topic, with
``include_metadata``."""

import asyncio
import collections
import logging
import ssl
import threading

from danube.connect import (ConfigError, Field, ProducerConfig, SourceConnector,
                            SourceRecord, Table, Tables, Unavailable)
from danube.connect.settings import topic_name

try:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
except ImportError as exc:      # pragma: no cover - reported by the registry with the extra
    raise ImportError(f"source-mqtt needs paho-mqtt: {exc}", name="paho-mqtt") from None

log = logging.getLogger("danube.connectors.mqtt")

QOS = {"AtMostOnce": 0, "AtLeastOnce": 1, "ExactlyOnce": 2}
# Route lookups cached per MQTT topic (device fleets publish on many): at most this many.
ROUTE_CACHE = 10000

ROUTE = {
    "from": Field(str, check=lambda v: None if _valid_filter(v) else
                  f"{v!r} is not an MQTT topic filter"),
    "to": Field(str, check=topic_name),
    "qos": Field(str, "AtLeastOnce", choices=tuple(QOS)),
    "partitions": Field(int, 0, min=0, max=1024),
    "reliable_dispatch": Field(bool, None),
}

MQTT = {
    "broker_host": Field(str, env="MQTT_BROKER_HOST",
                         check=lambda v: None if v else "must not be empty"),
    "broker_port": Field(int, 1883, env="MQTT_BROKER_PORT", min=1, max=65535),
    "client_id": Field(str, env="MQTT_CLIENT_ID",
                       check=lambda v: None if v else "must not be empty"),
    "username": Field(str, None, env="MQTT_USERNAME"),
    "password": Field(str, None, env="MQTT_PASSWORD"),
    "use_tls": Field(bool, False, env="MQTT_USE_TLS"),
    "ca_file": Field(str, None),
    "keep_alive_secs": Field(int, 60, min=5, max=65535),
    "connection_timeout_secs": Field(int, 30, min=1),
    "max_packet_size": Field(int, 10 * 1024 * 1024, min=1024, max=268435455),
    "clean_session": Field(bool, True),
    "include_metadata": Field(bool, True),
    "tcp_nodelay": Field(bool, True),
    # Ours: MQTT 5 (session expiry, receive maximum) or 3.1.1.
    "protocol": Field(str, "5", choices=("5", "3.1.1")),
    "session_expiry_secs": Field(int, 86400, min=0, max=0xFFFFFFFF),
    "receive_maximum": Field(int, 0, min=0, max=65535),
    "max_buffered": Field(int, 100_000, min=1),
    "routes": Tables(ROUTE, min_items=1),
}


def _valid_filter(f):
    if not f or "\x00" in f:
        return False
    levels = f.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


class _Token:
    __slots__ = ("mid", "qos", "generation")

    def __init__(self, mid, qos, generation):
        self.mid, self.qos, self.generation = mid, qos, generation


class MqttSource(SourceConnector):
    CONFIG = {"mqtt": Table(MQTT)}

    def __init__(self, context):
        super().__init__(context)
        self.mqtt = self.config.mqtt
        for i, route in enumerate(self.mqtt.routes):
            if route.reliable_dispatch is None:
                route.reliable_dispatch = QOS[route.qos] > 0
        if not self.mqtt.clean_session and any(QOS[r.qos] for r in self.mqtt.routes) \
                and self.mqtt.protocol == "5" and self.mqtt.session_expiry_secs == 0:
            raise ConfigError("mqtt.session_expiry_secs: 0 ends the session at disconnect, "
                              "so clean_session = false keeps nothing")
        self._routes = {}
        self._buffer = collections.deque()
        self._wake = None
        self._loop = None
        self._client = None
        self._generation = 0
        self._connected = None
        self._connect_error = None
        self._dropped = 0

    # -- the paho thread ----------------------------------------------------------------

    def _route(self, topic):
        route = self._routes.get(topic)
        if route is None:
            route = next((r for r in self.mqtt.routes
                          if paho.topic_matches_sub(getattr(r, "from"), topic)), False)
            if len(self._routes) >= ROUTE_CACHE:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _on_connect(self, client, _userdata, flags, reason_code, _properties):
        if reason_code.is_failure:
            self._connect_error = f"MQTT broker refused the connection: {reason_code}"
            self._loop.call_soon_threadsafe(self._connected.set)
            return
        self._generation += 1
        self._connect_error = None
        client.subscribe([(getattr(r, "from"), QOS[r.qos]) for r in self.mqtt.routes])
        log.info("connected to the MQTT broker", extra={
            "session_present": bool(flags.session_present), "generation": self._generation})
        self._loop.call_soon_threadsafe(self._connected.set)
        self._loop.call_soon_threadsafe(self.context.health.set, "mqtt")

    def _on_disconnect(self, _client, _userdata, _flags, reason_code, _properties):
        self._loop.call_soon_threadsafe(self.context.metrics.error, "mqtt_disconnect")
        log.warning("disconnected from the MQTT broker (%s); reconnecting", reason_code)
        self._loop.call_soon_threadsafe(self.context.health.set, "mqtt",
                                        f"MQTT broker disconnected: {reason_code}")

    def _on_connect_fail(self, _client, _userdata):
        # paho's reconnect loop (its delays from [retry]) failed once more.
        self._loop.call_soon_threadsafe(self.context.metrics.retry, "external")

    def _on_message(self, client, _userdata, msg):
        route = self._route(msg.topic)
        if not route:
            # A subscription of an earlier configuration, kept by the persistent session.
            if msg.qos:
                client.ack(msg.mid, msg.qos)
            return
        buffer = self._buffer
        if msg.qos == 0 and len(buffer) >= self.mqtt.max_buffered:
            self._dropped += 1
            return
        was_empty = not buffer
        buffer.append((msg, route, self._generation))
        if was_empty:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- the connector ------------------------------------------------------------------

    def producer_configs(self):
        seen = {}
        for r in self.mqtt.routes:
            seen.setdefault(r.to, ProducerConfig(r.to, r.partitions, r.reliable_dispatch))
        return list(seen.values())

    async def initialize(self):
        m = self.mqtt
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._connected = asyncio.Event()
        v5 = m.protocol == "5"
        kwargs = {"callback_api_version": CallbackAPIVersion.VERSION2,
                  "client_id": m.client_id,
                  "protocol": paho.MQTTv5 if v5 else paho.MQTTv311}
        if not v5:
            kwargs["clean_session"] = m.clean_session
        client = paho.Client(**kwargs)
        client.manual_ack_set(True)
        client.max_inflight_messages_set(65535)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.on_message = self._on_message
        retry = self.core.retry
        client.reconnect_delay_set(max(1, retry.retry_backoff_ms // 1000),
                                   max(1, retry.max_backoff_ms // 1000))
        if m.username is not None:
            client.username_pw_set(m.username, m.password)
        if m.use_tls:
            client.tls_set_context(ssl.create_default_context(cafile=m.ca_file))
        client.connect_timeout = m.connection_timeout_secs
        properties = None
        if v5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = 0 if m.clean_session else m.session_expiry_secs
            properties.ReceiveMaximum = m.receive_maximum or min(
                65535, 2 * self.core.processing.batch_size)
            properties.MaximumPacketSize = m.max_packet_size
        self._client = client
        try:
            await self._loop.run_in_executor(None, lambda: client.connect(
                m.broker_host, m.broker_port, m.keep_alive_secs,
                **({"clean_start": m.clean_session, "properties": properties} if v5 else {})))
        except OSError as exc:
            raise Unavailable(f"cannot reach the MQTT broker at {m.broker_host}:"
                              f"{m.broker_port}: {exc}") from None
        client.loop_start()
        try:
            await asyncio.wait_for(self._connected.wait(), m.connection_timeout_secs)
        except asyncio.TimeoutError:
            await self._stop_client()
            raise Unavailable(f"no CONNACK from {m.broker_host}:{m.broker_port} within "
                              f"{m.connection_timeout_secs} s") from None
        if self._connect_error:
            error = self._connect_error
            await self._stop_client()
            raise Unavailable(error)

    async def poll(self, max_records):
        buffer = self._buffer
        if not buffer:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       self.core.processing.poll_interval_ms / 1000.0)
            except asyncio.TimeoutError:
                return []
        records = []
        include = self.mqtt.include_metadata
        pop = buffer.popleft
        while buffer and len(records) < max_records:
            msg, route, generation = pop()
            record = SourceRecord(route.to, msg.payload,
                                  token=_Token(msg.mid, msg.qos, generation))
            if include:
                record.attributes = {"mqtt.topic": msg.topic, "mqtt.qos": str(msg.qos),
                                     "mqtt.retain": "true" if msg.retain else "false",
                                     "mqtt.dup": "true" if msg.dup else "false",
                                     "source": "mqtt"}
                record.key = msg.topic
            records.append(record)
        if self._dropped:
            self.context.metrics.count(self.context.metrics.failed, "mqtt-qos0-dropped",
                                       self._dropped)
            log.warning("%d QoS 0 messages dropped: the buffer was full", self._dropped)
            self._dropped = 0
        return records

    async def commit(self, records):
        client, current = self._client, self._generation
        # paho wakes its network thread with a byte on a socket pair for every packet it
        # queues; a batch's acknowledgements are queued without it and the thread woken
        # once (one syscall instead of one per message; paho >= 2.1's private attribute,
        # left alone if it is not there).
        wake = getattr(client, "_sockpairW", None)
        if wake is not None:
            client._sockpairW = None
        try:
            for record in records:
                token = record.token
                # A message of an earlier connection is not acknowledged: its packet id
                # may name another message now, and the broker sends it again on this one.
                if token.qos and token.generation == current:
                    client.ack(token.mid, token.qos)
        finally:
            if wake is not None:
                client._sockpairW = wake
                try:
                    wake.send(b"0")
                except (BlockingIOError, OSError):
                    pass

    async def _stop_client(self):
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            await self._loop.run_in_executor(None, client.loop_stop)

    async def shutdown(self):
        await self._stop_client()

    async def health_check(self):
        return None if self._client is not None and self._client.is_connected() \
            else "not connected to the MQTT broker"
