"""The MQTT listener: accepts connections up to mqtt.max_connections in all and
mqtt.limits.max_connections_per_ip from one address (a connection over either is closed at
once, as upstream closes one over its max_connections), and keeps one session per client
identifier (a second CONNECT with the same id takes the session over: the older connection
is closed, with 0x8E for MQTT 5)."""

import asyncio
import collections
import logging

from danube.mqtt import codec
from danube.edge.mqtt.session import Session

log = logging.getLogger("danube.edge.mqtt")


class MqttServer:
    def __init__(self, cfg, router, ingest):
        self.cfg = cfg
        self.router = router
        self.ingest = ingest
        self.users = cfg.users
        self.sessions = set()
        self.by_client = {}                         # client id -> Session
        self.per_ip = collections.Counter()
        self.stats = collections.Counter()          # events, for logs and tests
        self.received = [0, 0, 0]                   # messages stored, by QoS
        self._server = None
        self.port = None

    def count(self, what):
        self.stats[what] += 1

    def count_in(self, qos):
        self.received[qos] += 1

    async def start(self, host, port):
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def _accept(self):
        return _Gate(self)

    def admit(self, session):
        """Whether a new connection may stay (counted if so)."""
        ip = session.peer_ip
        if len(self.sessions) >= self.cfg.max_connections:
            self.count("refused_max_connections")
            log.warning("mqtt %s: refused: %d connections open (mqtt.max_connections)", ip,
                        len(self.sessions))
            return False
        if self.per_ip[ip] >= self.cfg.limits.max_connections_per_ip:
            self.count("refused_per_ip")
            log.warning("mqtt %s: refused: %d connections open from this address "
                        "(mqtt.limits.max_connections_per_ip)", ip, self.per_ip[ip])
            return False
        self.sessions.add(session)
        self.per_ip[ip] += 1
        return True

    def session_connected(self, session):
        old = self.by_client.get(session.client_id)
        if old is not None and old is not session and not old.closed:
            old.fail(codec.SESSION_TAKEN_OVER,
                     f"client {session.client_id!r} connected again from {session.peer_ip}")
        self.by_client[session.client_id] = session

    def session_ended(self, session):
        if session in self.sessions:
            self.sessions.discard(session)
            self.per_ip[session.peer_ip] -= 1
            if self.per_ip[session.peer_ip] <= 0:
                del self.per_ip[session.peer_ip]
        if self.by_client.get(session.client_id) is session:
            del self.by_client[session.client_id]

    async def stop(self):
        """Stop listening and drop every connection at once (abort: a client that does not
        read would keep a closing transport, and uvloop's wait_closed with it, open)."""
        if self._server is not None:
            self._server.close()
            for session in list(self.sessions):
                session.closed = True
                session.transport.abort()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except asyncio.TimeoutError:
                log.warning("mqtt listener: connections still closing after 5 s; stopping")


class _Gate(Session):
    """A Session that asks the server whether it may stay before anything is read."""

    def connection_made(self, transport):
        super().connection_made(transport)
        if not self.server.admit(self):
            self.closed = True
            if self._timer is not None:
                self._timer.cancel()
            transport.abort()
