"""source-mqtt: MQTT topic filters -> Danube topics (upstream danube-connectors/source-mqtt,
same ``[mqtt]`` keys and ``[[mqtt.routes]]``), on its own asyncio MQTT client
(_mqtt_client.py).

Delivery, as each QoS promises: a QoS 1 or 2 message is acknowledged to the MQTT broker
(PUBACK, or PUBREC for QoS 2) only after the Danube broker acknowledged its publish, in the
order received; with ``clean_session = false`` the MQTT broker keeps the session (its
subscriptions and every unacknowledged message) while the connector is away and sends them
again when it reconnects, so a crash loses nothing (upstream acknowledges at receipt: a
crash loses what was in flight). QoS 0 is at most once: it is never acknowledged, and is
dropped (and counted) when the connector's buffer is full.

The client reads every PUBLISH of a socket read at once and hands them over in one call;
a batch's acknowledgements leave in one write once the Danube broker acknowledged it.

Unlike upstream, a payload goes to Danube as it came (upstream re-encodes a non-JSON
payload as a base64 JSON object); attributes are upstream's (``mqtt.topic``, ``mqtt.qos``,
``mqtt.retain``, ``mqtt.dup``, ``source``) and the key is the MQTT topic, with
``include_metadata``."""

import asyncio
import collections
import logging
import ssl

from danube.connect import (ConfigError, Field, ProducerConfig, SourceConnector,
                            SourceRecord, Table, Tables, Unavailable)
from danube.connect.retry import Backoff
from danube.connect.settings import topic_name
from danube.connectors._mqtt_client import MqttClient, Options, Unreachable
from danube.mqtt.client_codec import filter_matches

log = logging.getLogger("danube.connectors.mqtt")

QOS = {"AtMostOnce": 0, "AtLeastOnce": 1, "ExactlyOnce": 2}
# Route lookups cached per MQTT topic (device fleets publish on many): at most this many.
ROUTE_CACHE = 10000
# The attributes of every record without metadata: one shared (never changed) empty dict.
_NO_ATTRIBUTES = {}

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



class MqttSource(SourceConnector):
    CONFIG = {"mqtt": Table(MQTT)}

    def __init__(self, context):
        super().__init__(context)
        m = self.mqtt = self.config.mqtt
        for route in m.routes:
            if route.reliable_dispatch is None:
                route.reliable_dispatch = QOS[route.qos] > 0
        if not m.clean_session and any(QOS[r.qos] for r in m.routes) \
                and m.protocol == "5" and m.session_expiry_secs == 0:
            raise ConfigError("mqtt.session_expiry_secs: 0 ends the session at disconnect, "
                              "so clean_session = false keeps nothing")
        if m.password is not None and m.username is None and m.protocol == "3.1.1":
            raise ConfigError("mqtt.password: MQTT 3.1.1 sends a password only with a user "
                              "name; set mqtt.username (or MQTT_USERNAME)")
        if m.ca_file is not None and not m.use_tls:
            raise ConfigError("mqtt.ca_file: set only with use_tls = true")
        self._tls = None
        if m.use_tls:
            try:
                self._tls = ssl.create_default_context(cafile=m.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"mqtt.ca_file: cannot load {m.ca_file!r}: {exc}") from None
        self._routes = {}
        # Attributes dicts shared by every record of one (topic, qos, retain, dup): the
        # runtime sends runs of records with equal attributes in one call, and the same
        # object compares equal at once. Nothing changes them (the dead-letter path copies).
        self._attributes = {}
        self._buffer = collections.deque()
        self._wake = None
        self._client = None
        self._dropped = 0

    # -- what the MQTT client hands over ------------------------------------------------

    def _route(self, topic):
        route = self._routes.get(topic)
        if route is None:
            route = next((r for r in self.mqtt.routes
                          if filter_matches(getattr(r, "from"), topic)), False)
            if len(self._routes) >= ROUTE_CACHE:
                self._routes.clear()
            self._routes[topic] = route
        return route

    def _on_publish(self, publishes, generation):
        """Every PUBLISH of one socket read: (topic, payload, qos, packet id, dup, retain)."""
        buffer = self._buffer
        was_empty = not buffer
        limit = self.mqtt.max_buffered
        routes = self._routes
        append = buffer.append
        unrouted = None
        for p in publishes:
            route = routes.get(p[0])
            if route is None:
                route = self._route(p[0])
            if not route:
                # A subscription of an earlier configuration, kept by the persistent
                # session: acknowledged (nothing will take it), not forwarded.
                if p[2]:
                    if unrouted is None:
                        unrouted = []
                    unrouted.append((p[2], p[3], generation))
                continue
            if not p[2] and len(buffer) >= limit:
                self._dropped += 1
                continue
            append((p, route, generation))
        if unrouted:
            self._client.ack(unrouted)
        if was_empty and buffer:
            self._wake.set()

    def _on_connect(self, session_present, generation):
        log.info("connected to the MQTT broker", extra={
            "session_present": session_present, "generation": generation})
        self.context.health.set("mqtt")

    def _on_disconnect(self, reason):
        self.context.metrics.error("mqtt_disconnect")
        log.warning("disconnected from the MQTT broker (%s); reconnecting", reason)
        self.context.health.set("mqtt", f"MQTT broker disconnected: {reason}")

    def _on_retry(self, _error):
        self.context.metrics.retry("external")

    def _on_refused(self, _message):
        self.context.metrics.error("mqtt_subscription_refused")

    def _on_oversized(self, _topic, _size):
        self.context.metrics.count(self.context.metrics.failed, "mqtt-oversized")

    # -- the connector ------------------------------------------------------------------

    def producer_configs(self):
        seen = {}
        for r in self.mqtt.routes:
            seen.setdefault(r.to, ProducerConfig(r.to, r.partitions, r.reliable_dispatch))
        return list(seen.values())

    def _options(self):
        m = self.mqtt
        return Options(
            m.broker_host, m.broker_port, m.client_id, level=5 if m.protocol == "5" else 4,
            clean=m.clean_session, keep_alive=m.keep_alive_secs, username=m.username,
            password=m.password, ssl=self._tls, connect_timeout=m.connection_timeout_secs,
            max_packet_size=m.max_packet_size, session_expiry=m.session_expiry_secs,
            max_inflight=m.receive_maximum or min(65535, 2 * self.core.processing.batch_size),
            subscriptions=[(getattr(r, "from"), QOS[r.qos]) for r in m.routes],
            tcp_nodelay=m.tcp_nodelay)

    async def initialize(self):
        if self._wake is None:
            self._wake = asyncio.Event()
        retry = self.core.retry
        client = MqttClient(self._options(), on_publish=self._on_publish,
                            backoff=Backoff(retry.retry_backoff_ms, retry.max_backoff_ms,
                                            retry.max_retries),
                            on_connect=self._on_connect, on_disconnect=self._on_disconnect,
                            on_retry=self._on_retry, on_refused=self._on_refused,
                            on_oversized=self._on_oversized)
        self._client = client
        try:
            await client.start()
        except Unreachable as exc:
            self._client = None
            raise Unavailable(str(exc)) from None

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
        append = records.append
        include = self.mqtt.include_metadata
        pop = buffer.popleft
        n = min(len(buffer), max_records)
        if include:
            attributes = self._attributes
            for _ in range(n):
                p, route, generation = pop()
                topic, payload, qos, packet_id, dup, retain = p
                key = (topic, qos, retain, dup)
                attrs = attributes.get(key)
                if attrs is None:
                    if len(attributes) >= ROUTE_CACHE:
                        attributes.clear()
                    attrs = attributes[key] = {
                        "mqtt.topic": topic, "mqtt.qos": str(qos),
                        "mqtt.retain": "true" if retain else "false",
                        "mqtt.dup": "true" if dup else "false", "source": "mqtt"}
                # Positional: one per message (keywords cost more here).
                append(SourceRecord(route.to, payload, attrs, topic,
                                    (qos, packet_id, generation)))
        else:
            for _ in range(n):
                p, route, generation = pop()
                append(SourceRecord(route.to, p[1], _NO_ATTRIBUTES, None,
                                    (p[2], p[3], generation)))
        if self._dropped:
            self.context.metrics.count(self.context.metrics.failed, "mqtt-qos0-dropped",
                                       self._dropped)
            log.warning("%d QoS 0 messages dropped: the buffer was full", self._dropped)
            self._dropped = 0
        return records

    async def commit(self, records):
        # One write for the batch's acks, in receive order; QoS 0 and tokens of an earlier
        # connection are skipped (the broker sends those again on this one).
        if self._client is not None:
            self._client.ack([r.token for r in records])

    async def shutdown(self):
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def health_check(self):
        return None if self._client is not None and self._client.connected \
            else "not connected to the MQTT broker"
