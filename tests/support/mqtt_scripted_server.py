"""An MQTT server that follows a script, for what a real broker never does: a packet that
breaks the protocol, more unacknowledged messages than the client allows, a burst of QoS 0
faster than anyone reads. It runs in its own thread and event loop on a free port; each
accepted connection runs the next script of the list (the last one again after that), an
async function of a ``ScriptedConnection``.

Everything the client sent is kept (``packets``: (connection number, type, body)), so a
test reads what the client answered from its own thread."""

import asyncio
import struct
import threading

from mqtt_raw import packet, string, varint


class ScriptedConnection:
    def __init__(self, server, number, reader, writer):
        self.server, self.number = server, number
        self.reader, self.writer = reader, writer
        self.level = 4

    async def read(self):
        """The next packet from the client: (type, flags, body), or None when it closed."""
        try:
            first = (await self.reader.readexactly(1))[0]
            length = shift = 0
            while True:
                b = (await self.reader.readexactly(1))[0]
                length |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            body = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.server.packets.append((self.number, first >> 4, body))
        return first >> 4, first & 0x0F, body

    async def expect(self, kind):
        got = await self.read()
        if got is None or got[0] != kind:
            raise AssertionError(f"connection {self.number}: expected packet type {kind}, "
                                 f"got {got}")
        return got

    async def handshake(self, session_present=False):
        """Read CONNECT, answer CONNACK; read SUBSCRIBE, answer SUBACK granting its QoS."""
        _, _, body = await self.expect(1)
        self.level = body[6]
        props = b"\x00" if self.level == 5 else b""
        self.write(packet(0x20, bytes([int(session_present), 0]) + props))
        _, _, body = await self.expect(8)
        packet_id = body[:2]
        pos = 2
        if self.level == 5:
            pos += 1 + body[2]
        codes = []
        while pos < len(body):
            n = struct.unpack_from(">H", body, pos)[0]
            pos += 2 + n
            codes.append(body[pos] & 0x03)
            pos += 1
        self.write(packet(0x90, packet_id + (b"\x00" if self.level == 5 else b"")
                          + bytes(codes)))

    def publish(self, topic, payload, qos=1, packet_id=1):
        """A well-formed PUBLISH at this connection's protocol level."""
        body = string(topic)
        if qos:
            body += struct.pack(">H", packet_id)
        if self.level == 5:
            body += varint(0)
        return packet(0x30 | (qos << 1), body + payload)

    def write(self, data):
        self.writer.write(data)

    async def wait(self, event, timeout=60):
        """Until the test sets ``event`` (a threading.Event)."""
        if not await asyncio.to_thread(event.wait, timeout):
            raise AssertionError(f"connection {self.number}: the test never let it go on")

    async def acks(self, kind, count):
        """Read until ``count`` packets of ``kind`` came (answering PINGREQ); their packet
        ids, in order."""
        ids = []
        while len(ids) < count:
            got = await self.read()
            if got is None:
                raise AssertionError(f"connection {self.number} closed after {len(ids)} acks")
            if got[0] == 12:
                self.write(b"\xd0\x00")
            elif got[0] == kind:
                ids.append(struct.unpack_from(">H", got[2])[0])
        return ids

    async def until_closed(self):
        while await self.read() is not None:
            pass


class ScriptedMqttServer:
    def __init__(self, scripts):
        self.scripts = list(scripts)
        self.connections = 0
        self.packets = []
        self.errors = []
        self.port = None
        self._loop = None
        self._server = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the scripted MQTT server did not start")
        return self

    def _run(self):
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._loop.run_forever()
        self._loop.close()

    async def _serve(self):
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()

    async def _accept(self, reader, writer):
        self.connections += 1
        number = self.connections
        script = self.scripts[min(number, len(self.scripts)) - 1]
        conn = ScriptedConnection(self, number, reader, writer)
        try:
            await script(conn)
        except Exception as exc:       # noqa: BLE001 - reported to the test through errors
            self.errors.append(f"connection {number}: {exc!r}")
        finally:
            writer.close()

    def acks(self, kind, number=None):
        """Packet ids of every ``kind`` packet the client sent (on connection ``number``)."""
        return [struct.unpack_from(">H", body)[0] for n, k, body in list(self.packets)
                if k == kind and (number is None or n == number)]

    def stop(self):
        async def close():
            self._server.close()
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
