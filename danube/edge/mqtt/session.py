"""One MQTT connection (an asyncio Protocol): CONNECT and credentials, PUBLISH at QoS 0, 1
and 2 into the local WALs, keep-alive, and the bounds a hostile client runs into.

Acknowledgements: a QoS 1 PUBLISH is answered with PUBACK (QoS 2: PUBREC) only once the WAL
sync covers it. PUBLISH packets are stored as they are read, and their acks wait in
``_unacked`` (in arrival order, as MQTT requires acks to go out; the messages of one read
are appended to each topic's WAL at once) for one task that waits for
the syncs and writes every ack they cover at once, so a connection's throughput is not one
message per fsync. More than ``max_inflight`` unacknowledged messages: an MQTT 5 client
announced it would not (Receive Maximum) and is disconnected with 0x93; a 3.1.1 client is
not read from until acks catch up.

As upstream (mqtt/session.rs): SUBSCRIBE is refused (0x80 for every filter: the edge is an
ingestion gateway), the retain flag is ignored (the message is stored like any other) and
will messages are not published; sessions are not kept across connections
(session_present is always 0)."""

import asyncio
import hmac
import logging
import secrets
import time

from danube.codec.mqtt import encode_run
from danube.edge.ingest import Invalid, NotReady
from danube.mqtt import codec
from danube.mqtt.codec import ProtocolError

log = logging.getLogger("danube.edge.mqtt")

#: keep_alive 0 means "no keep-alive" to MQTT; the edge still ends a silent session after
#: this long (upstream's DEFAULT_KEEP_ALIVE_SECS).
DEFAULT_KEEP_ALIVE = 300.0


class Session(asyncio.Protocol):
    def __init__(self, server):
        self.server = server
        cfg = server.cfg
        self.limits = cfg.limits
        self.decoder = codec.Decoder(cfg.max_payload_size, cfg.limits.max_topic_length)
        self.transport = None
        self.peer_ip = None
        self.connected = False          # CONNECT accepted
        self.level = 4
        self.client_id = None
        self.closed = False
        self._timer = None
        self._timeout = cfg.limits.connect_timeout_ms / 1000
        self._seen = False              # bytes arrived since the keep-alive timer was set
        self._unacked = []              # [wal, offset, ack bytes, acks] in arrival order
        self._inflight = 0              # acks in _unacked (a run's entry holds many)
        self._qos2 = set()              # packet ids PUBREC'd, waiting for PUBREL
        self._acker = None
        self._paused = False
        self._batch = None              # wal -> ([raw], [ack entry or None]) of this read
        self._now_ms = 0

    # -- asyncio -------------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer_ip = peer[0] if peer else "?"
        self._arm_timer()

    def data_received(self, data):
        if self.closed:
            return
        self._seen = True
        self._now_ms = int(time.time() * 1000)
        self._batch = {}
        try:
            for packet in self.decoder.feed(data):
                self._handle(packet)
                if self.closed:
                    break
        except ProtocolError as exc:
            self.fail(exc.reason, str(exc))
        finally:
            batch, self._batch = self._batch, None
            if batch:
                self._append(batch)
        if self.closed:
            return
        if self._unacked and self._acker is None:
            self._acker = asyncio.get_running_loop().create_task(self._send_acks())

    def connection_lost(self, exc):
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._acker is not None:
            self._acker.cancel()
        self.server.session_ended(self)

    def pause_writing(self):
        # A client that does not read its acks: stop reading its publishes too.
        self.transport.pause_reading()

    def resume_writing(self):
        if not self._paused:
            self.transport.resume_reading()

    # -- closing -------------------------------------------------------------------------

    def fail(self, reason, why):
        """Close for a protocol violation or a limit: MQTT 5 clients get a DISCONNECT with
        the reason code (CONNACK with it before CONNECT is accepted); 3.1.1 ones just see
        the connection close, as 3.1.1 gives the server no other way to say it (but a
        CONNACK return code for a refused CONNECT)."""
        if self.closed:
            return
        log.warning("mqtt %s (%s): closing: %s (reason 0x%02x)", self.peer_ip,
                    self.client_id or "before CONNECT", why, reason)
        self.server.count("closed_" + hex(reason))
        if self.connected:
            if self.level == 5:
                self.transport.write(codec.encode_disconnect(reason, why))
        elif self.level == 5:
            self.transport.write(codec.encode_connack(5, False, reason,
                                                      [(codec.REASON_STRING, why[:200])]))
        elif reason in codec.V3_RETURN:
            # 3.1.1 has a CONNACK return code for these refusals (3.2.2.3); the protocol
            # level of a CONNECT we cannot read is unknown, and 3.1.1's is the safe answer.
            self.transport.write(codec.encode_connack(4, False, reason))
        self.close()

    def close(self):
        if not self.closed:
            self.closed = True
            self.transport.close()

    # -- timers --------------------------------------------------------------------------

    def _arm_timer(self):
        self._seen = False
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._tick)

    def _tick(self):
        if self.closed:
            return
        if not self.connected:
            # The CONNECT deadline counts from the connection's start, whatever bytes came
            # before it: a CONNECT sent a byte at a time must not hold the slot open.
            self.server.count("connect_timeouts")
            log.warning("mqtt %s: no CONNECT within %gs: closing", self.peer_ip,
                        self._timeout)
            self.close()
            return
        if not self._seen:
            self.fail(codec.KEEP_ALIVE_TIMEOUT,
                      f"no packet within {self._timeout:g}s (keep-alive x 1.5)")
            return
        self._arm_timer()

    # -- packets -------------------------------------------------------------------------

    def _handle(self, packet):
        if not self.connected:
            if type(packet) is not codec.Connect:
                raise ProtocolError(codec.PROTOCOL_ERROR, "the first packet must be CONNECT")
            self._connect(packet)
            return
        kind = type(packet)
        if kind is codec.Run:
            self._run(packet)
            return
        if kind is codec.Publish:
            self._publish(packet)
            return
        if kind is codec.Connect:
            raise ProtocolError(codec.PROTOCOL_ERROR, "a second CONNECT")
        k = packet.kind
        if k == codec.PINGREQ:
            self.transport.write(codec.PINGRESP_BYTES)
        elif k == codec.PUBREL:
            known = packet.packet_id in self._qos2
            self._qos2.discard(packet.packet_id)
            self._queue_ack(None, 0, codec.encode_ack(
                codec.PUBCOMP, packet.packet_id, self.level,
                codec.SUCCESS if known else codec.PACKET_ID_NOT_FOUND))
        elif k == codec.SUBSCRIBE:
            # Upstream: the edge is an ingestion gateway, SUBSCRIBE always fails.
            self.server.count("subscribe_refused")
            self.transport.write(codec.encode_suback(packet.packet_id,
                                                     [0x80] * len(packet.filters), self.level))
        elif k == codec.UNSUBSCRIBE:
            self.transport.write(codec.encode_unsuback(packet.packet_id, len(packet.filters),
                                                       self.level))
        elif k == codec.DISCONNECT:
            self.close()
        elif k in (codec.PUBACK, codec.PUBREC, codec.PUBCOMP):
            # The edge never sends PUBLISH, so there is nothing a client could ack.
            raise ProtocolError(codec.PROTOCOL_ERROR,
                                f"acknowledgement (type {k}) for a PUBLISH never sent")
        elif k == codec.AUTH:
            raise ProtocolError(codec.PROTOCOL_ERROR, "AUTH without an authentication method")

    def _connect(self, c):
        self.level = self.decoder.level = c.level
        server = self.server
        limits = self.limits
        client_id = c.client_id
        if len(client_id.encode()) > limits.max_client_id_length:
            raise ProtocolError(codec.CLIENT_ID_INVALID,
                                f"client identifier longer than {limits.max_client_id_length} "
                                f"bytes")
        assigned = None
        if not client_id:
            if c.level != 5 and not c.clean:
                # 3.1.1 (3.1.3-8): an empty id needs a clean session.
                raise ProtocolError(codec.CLIENT_ID_INVALID,
                                    "empty client identifier without clean session")
            client_id = assigned = "edge-" + secrets.token_hex(8)
        self.client_id = client_id
        if server.users:
            expected = server.users.get(c.username) if c.username is not None else None
            if expected is None or c.password is None or not hmac.compare_digest(
                    expected.encode(), c.password):
                server.count("auth_failures")
                raise ProtocolError(codec.BAD_CREDENTIALS, "bad user name or password")
        for pid, _ in c.properties:
            if pid == codec.AUTH_METHOD:
                raise ProtocolError(codec.BAD_CREDENTIALS,
                                    "enhanced authentication is not supported")
        self.connected = True
        server.session_connected(self)
        props = []
        if c.level == 5:
            props = [(codec.RECEIVE_MAXIMUM, min(limits.max_inflight, 65535)),
                     (codec.MAXIMUM_PACKET_SIZE, self.server.cfg.max_payload_size),
                     (codec.RETAIN_AVAILABLE, 0), (codec.WILDCARD_SUB_AVAILABLE, 0),
                     (codec.SUB_ID_AVAILABLE, 0), (codec.SHARED_SUB_AVAILABLE, 0)]
            if assigned:
                props.append((codec.ASSIGNED_CLIENT_ID, assigned))
        self.transport.write(codec.encode_connack(c.level, False, codec.SUCCESS, props))
        keep_alive = c.keep_alive * 1.5 if c.keep_alive else DEFAULT_KEEP_ALIVE
        self._timer.cancel()
        self._timeout = keep_alive
        self._arm_timer()
        log.debug("mqtt %s: %s connected (MQTT level %d, keep-alive %ds)", self.peer_ip,
                  client_id, c.level, c.keep_alive)

    def _publish(self, p):
        server = self.server
        for pid, _ in p.properties:
            if pid == codec.TOPIC_ALIAS:
                # Topic Alias Maximum is not announced, so it is 0: no alias may be used.
                raise ProtocolError(codec.TOPIC_ALIAS_INVALID, "topic aliases are not accepted")
        if p.qos and self._inflight >= self.limits.max_inflight:
            if self.level == 5:
                raise ProtocolError(codec.RECEIVE_MAX_EXCEEDED,
                                    f"more than {self.limits.max_inflight} QoS 1/2 messages "
                                    f"unacknowledged (Receive Maximum)")
        if p.qos == 2 and p.packet_id in self._qos2:
            # A resent QoS 2 message already stored: acknowledge it again, store nothing.
            self._queue_ack(None, 0, codec.encode_ack(codec.PUBREC, p.packet_id, self.level))
            return
        route = server.router.resolve(p.topic)
        if route is None:
            # Upstream: dropped, but acknowledged so the device does not resend forever.
            server.count("unrouted")
            self._ack_now(p, codec.SUCCESS)
            return
        try:
            topic, raw = server.ingest.encode(route, p, self._now_ms)
        except Invalid as exc:
            server.count("invalid")
            log.info("mqtt %s: payload on %r refused by the schema: %s", self.client_id,
                     p.topic, exc)
            self._ack_now(p, codec.PAYLOAD_FORMAT_INVALID)
            return
        except NotReady as exc:
            server.count("not_ready")
            if p.qos == 0:
                return
            if self.level == 5:
                self._ack_now(p, codec.UNSPECIFIED)
                return
            # 3.1.1 cannot refuse a QoS 1/2 message but by not acknowledging it: close, so
            # the device resends it after reconnecting instead of waiting on a lost ack.
            self.fail(codec.IMPLEMENTATION_ERROR, str(exc))
            return
        server.count_in(p.qos)
        entry = None
        if p.qos:
            if p.qos == 2:
                self._qos2.add(p.packet_id)
            kind = codec.PUBACK if p.qos == 1 else codec.PUBREC
            # The offset is known once the read's messages are appended (_append).
            entry = self._queue_ack(topic.wal, -1, codec.encode_ack(kind, p.packet_id,
                                                                    self.level))
        pending = self._batch.get(topic.wal)
        if pending is None:
            pending = self._batch[topic.wal] = ([], [])
        pending[0].append(raw)
        pending[1].append(entry)

    def _run(self, run):
        """A run of plain PUBLISH packets to one topic: encoded and appended in C
        (danube.codec.mqtt.encode_run), one ack entry for all of them. What the run cannot
        take whole (no route, a topic waiting for its schema, payloads to validate, an MQTT 5
        Receive Maximum the run would pass) goes packet by packet."""
        server = self.server
        route = server.router.resolve(run.topic)
        topic = server.ingest.topics.get(route.topic) if route is not None else None
        if (topic is None or not topic.ready or (topic.enforce and topic.validator)
                or self.level == 5
                and self._inflight + run.qos1 > self.limits.max_inflight):
            decoder = codec.Decoder(len(run.raw) + 1, len(run.raw))
            decoder.level = self.level
            decoder.runs = False
            for packet in decoder.feed(run.raw):
                self._publish(packet)
                if self.closed:
                    return
            return
        data, ends, acks = encode_run(run.raw, 0, run.count, self.level == 5, topic.prefix,
                                      topic.suffix(route.attributes), self._now_ms)
        topic.received += run.count
        # Messages of this read waiting in the batch go first: one topic's order is the
        # order its messages arrived in.
        if self._batch:
            batch, self._batch = self._batch, {}
            self._append(batch)
            if self.closed:
                return
        try:
            _, last = topic.wal.append_packed(data, ends)
        except Exception as exc:  # noqa: BLE001 - the WAL failed (disk full, I/O error)
            log.error("mqtt: cannot store %d messages: %s", run.count, exc)
            self.fail(codec.IMPLEMENTATION_ERROR, f"local storage failed: {exc}")
            return
        server.received[0] += run.count - run.qos1
        server.received[1] += run.qos1
        if run.qos1:
            self._queue_ack(topic.wal, last, acks, run.qos1)

    def _append(self, batch):
        """One WAL append per topic for the messages of one read; their acks learn their
        offsets."""
        for wal, (raws, entries) in batch.items():
            try:
                first, _ = wal.append(raws)
            except Exception as exc:  # noqa: BLE001 - the WAL failed (disk full, I/O error)
                log.error("mqtt: cannot store %d messages: %s", len(raws), exc)
                self._unacked = [e for e in self._unacked if e[0] is not wal]
                self._inflight = sum(e[3] for e in self._unacked)
                self.fail(codec.IMPLEMENTATION_ERROR, f"local storage failed: {exc}")
                continue
            for i, entry in enumerate(entries):
                if entry is not None:
                    entry[1] = first + i

    def _ack_now(self, p, reason):
        """Acknowledge a PUBLISH that stores nothing (after those queued before it). Only
        an MQTT 5 client is told the reason; 3.1.1 has none to give."""
        if p.qos == 0:
            return
        if p.qos == 2 and reason == codec.SUCCESS:
            self._qos2.add(p.packet_id)
        kind = codec.PUBACK if p.qos == 1 else codec.PUBREC
        self._queue_ack(None, 0, codec.encode_ack(kind, p.packet_id, self.level, reason))

    def _queue_ack(self, wal, offset, ack, acks=1):
        entry = [wal, offset, ack, acks]
        self._unacked.append(entry)
        self._inflight += acks
        if self.level != 5 and self._inflight >= self.limits.max_inflight \
                and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        return entry

    async def _send_acks(self):
        """Write the queued acks as the syncs cover their messages, in order."""
        try:
            while self._unacked and not self.closed:
                # Wait for every WAL the queued messages went to, up to their last offsets.
                needed = {}
                for wal, offset, _, _ in self._unacked:
                    if wal is not None and offset > needed.get(wal, -1):
                        needed[wal] = offset
                for wal, offset in needed.items():
                    if wal.durable_offset < offset:
                        await wal.sync_to(offset)
                done = 0
                out = []
                for wal, offset, ack, acks in self._unacked:
                    if wal is not None and wal.durable_offset < offset:
                        break
                    out.append(ack)
                    done += 1
                    self._inflight -= acks
                del self._unacked[:done]
                if out and not self.closed:
                    self.transport.write(b"".join(out))
                if self._paused and self._inflight < self.limits.max_inflight // 2 + 1:
                    self._paused = False
                    self.transport.resume_reading()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed sync: nothing more is acked
            log.error("mqtt %s: WAL sync failed, acks withheld: %s", self.client_id, exc)
            self.fail(codec.IMPLEMENTATION_ERROR, f"local storage failed: {exc}")
        finally:
            self._acker = None
            if self._unacked and not self.closed:
                self._acker = asyncio.get_running_loop().create_task(self._send_acks())
