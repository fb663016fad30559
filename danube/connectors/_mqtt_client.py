"""source-mqtt's MQTT client: asyncio, on the packet codec of danube/mqtt/ (no thread, no
object per message besides its tuple), made for one subscriber that acknowledges late.

- **Connecting**: CONNECT (3.1.1 or 5, TLS, user name and password), CONNACK within
  ``connect_timeout``, then SUBSCRIBE to every filter on every connection (the server's
  session may have them already; a new one needs them).
- **Receiving**: every PUBLISH of a socket read is decoded in one pass and handed to
  ``on_publish(batch, generation)`` at once. QoS 2's PUBREL is answered with PUBCOMP at
  once (the message was taken when its PUBREC went out).
- **Acknowledging**: ``ack(tokens)`` writes the PUBACKs (PUBRECs for QoS 2) of a whole batch
  in one write, in the order given, skipping tokens of an earlier connection: a packet id
  names one message only on its connection, and the server sends the unacknowledged ones
  again on the next (clean_session = false).
- **In flight**: at most ``max_inflight`` QoS 1/2 messages taken and not acknowledged (one
  socket read may pass it): MQTT 5 announces it (Receive Maximum), and the socket is not
  read while it is reached. A server that sends more is not disconnected (MQTT 5 would
  allow 0x93): Mosquitto 2.0 resends a resumed session's whole backlog past the Receive
  Maximum, and a disconnect would only make it send it again.
- **Keep-alive**: PINGREQ when nothing was written for 3/4 of ``keep_alive``; a connection
  silent for 1.5 x ``keep_alive`` after it is dead.
- **Losing the connection** (closed, reset, keep-alive, a packet that breaks the protocol):
  ``on_disconnect(reason)``, then connecting again with backoff (``backoff.delay``), each
  failed attempt reported to ``on_retry``, until ``close()``."""

import asyncio
import logging
import socket
import time

from danube.mqtt import client_codec as cc
from danube.mqtt.codec import (DISCONNECT, MAXIMUM_PACKET_SIZE, PINGRESP, PROTOCOL_ERROR,
                               PUBCOMP, PUBLISH, PUBREL, REASON_STRING, RECEIVE_MAXIMUM,
                               SESSION_EXPIRY, SUBACK, UNSPECIFIED, ProtocolError)

log = logging.getLogger("danube.connectors.mqtt")

PUBACK_FIRST, PUBREC_FIRST = 0x40, 0x50

# CONNACK refusals, by their code (MQTT 5 reason codes; 3.1.1 return codes 1-5).
_REFUSED_V3 = {1: "unacceptable protocol version", 2: "client identifier rejected",
               3: "server unavailable", 4: "bad user name or password",
               5: "not authorized"}
_REFUSED_V5 = {0x80: "unspecified error", 0x81: "malformed packet", 0x82: "protocol error",
               0x83: "implementation specific error", 0x84: "unsupported protocol version",
               0x85: "client identifier not valid", 0x86: "bad user name or password",
               0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy",
               0x8A: "banned", 0x8C: "bad authentication method",
               0x90: "topic name invalid", 0x95: "packet too large",
               0x97: "quota exceeded", 0x99: "payload format invalid",
               0x9A: "retain not supported", 0x9B: "QoS not supported",
               0x9C: "use another server", 0x9D: "server moved",
               0x9F: "connection rate exceeded"}


class Unreachable(Exception):
    """The server could not be reached, refused the connection, or did not answer."""


class Options:
    """What a connection needs; ``level`` 4 (3.1.1) or 5."""

    def __init__(self, host, port, client_id, *, level=5, clean=True, keep_alive=60,
                 username=None, password=None, ssl=None, connect_timeout=30.0,
                 max_packet_size=10 * 1024 * 1024, session_expiry=0, max_inflight=2000,
                 subscriptions=(), tcp_nodelay=True):
        self.host, self.port, self.client_id = host, port, client_id
        self.level, self.clean, self.keep_alive = level, clean, keep_alive
        self.username, self.password, self.ssl = username, password, ssl
        self.connect_timeout = connect_timeout
        self.max_packet_size = max_packet_size
        self.session_expiry = session_expiry
        self.max_inflight = max_inflight
        self.subscriptions = list(subscriptions)
        self.tcp_nodelay = tcp_nodelay

    def connect_packet(self):
        props = []
        if self.level == 5:
            props = [(SESSION_EXPIRY, 0 if self.clean else self.session_expiry),
                     (RECEIVE_MAXIMUM, self.max_inflight),
                     (MAXIMUM_PACKET_SIZE, self.max_packet_size)]
        return cc.encode_connect(self.level, self.client_id, clean=self.clean,
                                 keep_alive=self.keep_alive, username=self.username,
                                 password=self.password, properties=props)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection's protocol."""

    def __init__(self, client, generation):
        self.client = client
        self.generation = generation
        opts = client.options
        self.decoder = cc.ClientDecoder(opts.max_packet_size, opts.level)
        # MQTT 5 announces the limit (Maximum Packet Size) and the server keeps to it.
        self.decoder.skip_oversized = opts.level != 5
        self.transport = None
        self.connack = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self.inflight = 0
        self.paused = False
        self.last_write = time.monotonic()
        self.ping_sent = None
        self.reason = None              # why it ended, when we ended it

    # -- asyncio ---------------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and not self.client.options.tcp_nodelay:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
            except OSError:
                pass

    def data_received(self, data):
        if self.reason is not None:
            return
        try:
            self._received(data)
        except ProtocolError as exc:
            self.fail(exc.reason, f"the MQTT broker sent a packet that breaks the protocol: "
                                  f"{exc}")
        except Exception as exc:       # noqa: BLE001 - a bug must not leave a dead socket
            log.exception("handling what the MQTT broker sent failed")
            self.fail(UNSPECIFIED, f"handling what the MQTT broker sent failed: {exc!r}")

    def _received(self, data):
        decoder = self.decoder
        packets = decoder.feed(data)
        if not packets:
            return
        self.inflight += decoder.acked_publishes
        if not decoder.controls:
            self._deliver(packets)          # a stream of PUBLISH: the usual case
            return
        start = 0
        for i, p in enumerate(packets):
            if type(p) is not tuple:
                # In order: the PUBLISH packets before it are handed over first.
                if i > start:
                    self._deliver(packets[start:i])
                start = i + 1
                self._control(p)
                if self.reason is not None:
                    return
        if start < len(packets):
            self._deliver(packets[start:])

    def connection_lost(self, exc):
        if self.reason is None:
            self.reason = f"connection lost: {exc}" if exc else "connection closed by the " \
                                                                 "MQTT broker"
        if not self.connack.done():
            self.connack.set_exception(Unreachable(self.reason))
        if not self.closed.done():
            self.closed.set_result(self.reason)

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass

    # -- packets ----------------------------------------------------------------------------

    def _deliver(self, publishes):
        if self.inflight >= self.client.options.max_inflight and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self.client.on_publish(publishes, self.generation)

    def _control(self, p):
        if type(p) is cc.Connack:
            if not self.connack.done():
                if not p.reason:
                    # Current at once: PUBLISH packets may follow in this very read, and
                    # their acks must find this connection.
                    self.client.conn = self
                self.connack.set_result(p)
            else:
                self.fail(PROTOCOL_ERROR, "a second CONNACK from the MQTT broker")
            return
        if not self.connack.done():
            self.fail(PROTOCOL_ERROR,
                      f"packet type {p.kind} from the MQTT broker before its CONNACK")
            return
        kind = p.kind
        if kind == PUBLISH:
            # Larger than max_packet_size (MQTT 3.1.1): passed over, and acknowledged so
            # that the server does not send it again on every connection.
            topic, size = p.data
            log.error("a PUBLISH of %d bytes on %r exceeds max_packet_size (%d bytes): "
                      "dropped", size, topic, self.client.options.max_packet_size)
            if p.reason:
                self.write(bytes((PUBACK_FIRST if p.reason == 1 else PUBREC_FIRST, 2,
                                  p.packet_id >> 8, p.packet_id & 0xFF)))
            self.client.on_oversized(topic, size)
        elif kind == PUBREL:
            self.write(bytes((PUBCOMP << 4, 2, p.packet_id >> 8, p.packet_id & 0xFF)))
        elif kind == PINGRESP:
            self.ping_sent = None
        elif kind == SUBACK:
            self.client.on_suback(p.data)
        elif kind == DISCONNECT:
            text = next((v for k, v in p.data if k == REASON_STRING), "")
            self.reason = f"the MQTT broker disconnected (reason 0x{p.reason:02x}" \
                          f"{': ' + text if text else ''})"
            self.transport.close()

    def acked(self, n):
        self.inflight -= n
        if self.paused and self.inflight < self.client.options.max_inflight and \
                not self.transport.is_closing():
            self.paused = False
            self.transport.resume_reading()

    def write(self, data):
        self.last_write = time.monotonic()
        self.transport.write(data)

    def fail(self, reason, message):
        """End the connection for ``message`` (MQTT 5: DISCONNECT with ``reason`` first)."""
        if self.reason is not None:
            return
        self.reason = message
        log.error("%s; disconnecting", message, extra={"mqtt_reason": reason})
        if self.client.options.level == 5 and self.transport is not None:
            try:
                self.transport.write(cc.encode_disconnect(5, reason))
            except (OSError, RuntimeError):
                pass
        if self.transport is not None:
            self.transport.close()


class MqttClient:
    def __init__(self, options, *, on_publish, backoff, on_connect=None, on_disconnect=None,
                 on_retry=None, on_refused=None, on_oversized=None):
        self.options = options
        self.on_publish = on_publish            # (list of PUBLISH tuples, generation)
        self.on_connect = on_connect or (lambda session_present, generation: None)
        self.on_disconnect = on_disconnect or (lambda reason: None)
        self.on_retry = on_retry or (lambda error: None)
        self.on_refused = on_refused or (lambda message: None)
        self.on_oversized = on_oversized or (lambda topic, size: None)
        self.backoff = backoff
        self.generation = 0
        self.conn = None
        self._task = None
        self._closing = False
        self._sub_id = 0

    @property
    def connected(self):
        return self.conn is not None and self.conn.reason is None

    async def start(self):
        """The first connection (Unreachable if it fails), then a task that keeps one."""
        await self._connect()
        self._task = asyncio.ensure_future(self._keep())

    async def _connect(self):
        opts = self.options
        loop = asyncio.get_running_loop()
        self.generation += 1
        generation = self.generation
        where = f"{opts.host}:{opts.port}"
        conn = None
        try:
            async with asyncio.timeout(opts.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, generation), opts.host, opts.port,
                    ssl=opts.ssl, server_hostname=opts.host if opts.ssl else None)
                conn.write(opts.connect_packet())
                connack = await conn.connack
        except TimeoutError:
            if conn is not None:
                conn.transport.abort()
            raise Unreachable(f"no CONNACK from the MQTT broker at {where} within "
                              f"{opts.connect_timeout:g} s") from None
        except (OSError, Unreachable) as exc:
            if conn is not None:
                conn.transport.abort()
            raise Unreachable(f"cannot reach the MQTT broker at {where}: {exc}") from None
        if connack.reason:
            conn.reason = "refused"
            conn.transport.close()
            table = _REFUSED_V5 if opts.level == 5 else _REFUSED_V3
            raise Unreachable(f"the MQTT broker at {where} refused the connection: "
                              f"{table.get(connack.reason, 'reason')} "
                              f"(0x{connack.reason:02x})")
        self.conn = conn
        if opts.subscriptions:
            self._sub_id = self._sub_id % 0xFFFF + 1
            conn.write(cc.encode_subscribe(self._sub_id, opts.subscriptions, opts.level))
        self.on_connect(connack.session_present, generation)
        return conn

    async def _keep(self):
        """Watch the connection (keep-alive); when it ends, connect again with backoff."""
        while not self._closing:
            conn = self.conn
            await self._watch(conn)
            if self._closing:
                return
            self.on_disconnect(conn.reason)
            attempt = 0
            while not self._closing:
                await asyncio.sleep(self.backoff.delay(attempt))
                if self._closing:
                    return
                try:
                    await self._connect()
                    break
                except Unreachable as exc:
                    attempt += 1
                    self.on_retry(str(exc))
                    log.warning("%s; retrying (attempt %d)", exc, attempt,
                                extra={"target": "external", "attempt": attempt})

    async def _watch(self, conn):
        keep_alive = self.options.keep_alive
        if not keep_alive:
            await asyncio.shield(conn.closed)
            return
        while not conn.closed.done():
            now = time.monotonic()
            if conn.ping_sent is not None and now - conn.ping_sent > keep_alive * 1.5:
                conn.reason = f"no answer from the MQTT broker within {keep_alive * 1.5:g} s " \
                              f"(keep-alive)"
                conn.transport.abort()
                break
            if conn.ping_sent is None and now - conn.last_write >= keep_alive * 0.75:
                conn.ping_sent = now
                conn.write(cc.PINGREQ_BYTES)
            try:
                await asyncio.wait_for(asyncio.shield(conn.closed), keep_alive / 4)
            except TimeoutError:
                pass
        await asyncio.shield(conn.closed)

    def on_suback(self, codes):
        """A refused filter is logged and reported: nothing comes for it."""
        for (topic_filter, qos), code in zip(self.options.subscriptions, codes):
            if code >= 0x80:
                message = f"the MQTT broker refused the subscription to {topic_filter!r} " \
                          f"(0x{code:02x})"
                log.error(message)
                self.on_refused(message)
            elif code < qos:
                log.warning("the MQTT broker granted QoS %d for %r (asked %d)", code,
                            topic_filter, qos)

    def ack(self, tokens):
        """PUBACK (QoS 1) or PUBREC (QoS 2) for ``tokens`` [(qos, packet id, generation)], in
        one write; tokens of an earlier connection (and QoS 0) are skipped."""
        conn = self.conn
        if conn is None or conn.reason is not None:
            return 0
        generation = conn.generation
        out = bytearray()
        n = 0
        for qos, packet_id, gen in tokens:
            if qos and gen == generation:
                out += bytes((PUBACK_FIRST if qos == 1 else PUBREC_FIRST, 2, packet_id >> 8,
                              packet_id & 0xFF))
                n += 1
        if n:
            conn.write(out)
            conn.acked(n)
        return n

    def ack_now(self, qos, packet_id, generation):
        """One message acknowledged at once (one no route takes)."""
        self.ack(((qos, packet_id, generation),))

    async def close(self):
        """DISCONNECT (normal: the server keeps the session as agreed) and stop."""
        self._closing = True
        conn, self.conn = self.conn, None
        if conn is not None and conn.reason is None:
            conn.reason = "closed"
            try:
                conn.transport.write(cc.encode_disconnect(self.options.level))
            except (OSError, RuntimeError):
                pass
            conn.transport.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if conn is not None:
            try:
                await asyncio.wait_for(asyncio.shield(conn.closed), 5)
            except TimeoutError:
                conn.transport.abort()

