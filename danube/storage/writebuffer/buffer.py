"""The broker's write buffer: one connection that every topic's appends go through, and one
worker that commits them in groups.

A pass of the worker takes what every topic appended since the last pass, sends it as one
pipeline (an XADD per append) ending in one ``WAIT wait_replicas wait_timeout_ms``, and
then answers each topic's waiters. So, as with the WAL's fdatasync, the number of round
trips tracks Redis' speed, not the publish rate, across topics too. One connection carries
every write because ``WAIT`` counts the replicas that have the *connection's* last write:
a pass's WAIT then covers every entry written before it, including those of an earlier pass
whose WAIT timed out. Reads (a new owner's recovery) and trims use a second, pooled client.
"""

from __future__ import annotations

import asyncio
import logging
import time

from danube.storage.errors import (WriteBufferError, WriteBufferFencedError,
                                   WriteBufferStartupError)
from danube.storage.writebuffer.entries import (APPEND_SCRIPT, CLAIM_SCRIPT, ENDS, PAYLOAD,
                                                entry_id, epoch_key, stream_key)
from danube.storage.writebuffer.topic import TopicBuffer
from danube.tasks import cancel_and_wait

log = logging.getLogger("danube.storage.writebuffer")

#: Bytes of entries one pass sends at most (the rest goes in the next pass).
PASS_BYTES = 16 << 20
#: After a failed pass, the next try of what is still unconfirmed.
RETRY_SECONDS = 1.0
#: A write that WAIT can count when a pass has no entry to write (a retried WAIT after a
#: reconnection: a fresh connection's WAIT would count no write of its own).
HEARTBEAT_SUFFIX = "/write_buffer_heartbeat"


def _url(endpoint: str) -> str:
    """valkey:// is redis:// to the client."""
    for ours, theirs in (("valkeys://", "rediss://"), ("valkey://", "redis://")):
        if endpoint.startswith(ours):
            return theirs + endpoint[len(ours):]
    return endpoint


class WriteBuffer:
    """Start with ``await start()``; ``topic(name, next_offset)`` gives a topic's buffer."""

    def __init__(self, cfg):
        import redis.asyncio as aioredis
        from redis.backoff import NoBackoff
        from redis.asyncio.retry import Retry

        self.cfg = cfg
        self.endpoint = cfg.endpoints[0]
        url = _url(self.endpoint)
        # WAIT blocks the connection for up to wait_timeout_ms: the socket waits longer.
        timeout = cfg.wait_timeout_ms / 1000 + 10
        # No retries inside the client: a pipeline sent twice would write entries twice (the
        # second XADD refused); the worker re-reads the stream's end and goes on instead.
        common = dict(socket_connect_timeout=5, socket_timeout=timeout,
                      retry=Retry(NoBackoff(), 0))
        self._common = common
        # Reads (and trims) may be sent again: a pooled connection the server closed (it
        # restarted) fails once, then a fresh one is made.
        reads = dict(common, retry=Retry(NoBackoff(), 2))
        #: Several endpoints: a Redis Cluster (as upstream). Each topic's stream lives on
        #: one primary; the worker writes to each primary over a connection of its own.
        self.clustered = len(cfg.endpoints) > 1
        self._writers: dict[str, object] = {}      # "host:port" -> a one-connection client
        if self.clustered:
            from redis.asyncio.cluster import ClusterNode, RedisCluster
            from urllib.parse import urlsplit

            nodes = [ClusterNode(u.hostname, u.port or 6379)
                     for u in (urlsplit(_url(e)) for e in cfg.endpoints)]
            self.reader = RedisCluster(startup_nodes=nodes, max_connections=16,
                                       ssl=_url(self.endpoint).startswith("rediss://"),
                                       **reads)
            self._writer = None
        else:
            self._writer = aioredis.Redis.from_url(url, max_connections=1,
                                                   health_check_interval=0, **common)
            self.reader = aioredis.Redis.from_url(url, max_connections=16,
                                                  health_check_interval=0, **reads)
        self.topics: dict[str, TopicBuffer] = {}
        self.stats = {"passes": 0, "entries": 0, "bytes": 0, "wait_timeouts": 0,
                      "failures": 0, "trims": 0}
        self._dirty: set[TopicBuffer] = set()
        self._kick = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._resync_all = False
        self._reconnect = False
        self._warned_at = 0.0
        #: The last pass failed (Redis down or short of replicas): closing topics do not
        #: wait for it.
        self.failing = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Reach the primary (every primary of a cluster) once, so a wrong URL or a replica
        is a start-up error."""
        from redis.exceptions import RedisError

        try:
            if self.clustered:
                await self.reader.initialize()
                primaries = self.reader.get_primaries()
                infos = [await self._node_writer(n.host, n.port).info("replication")
                         for n in primaries]
                info = {"role": "master",
                        "connected_slaves": min(int(i.get("connected_slaves", 0))
                                                for i in infos)}
            else:
                await self.reader.ping()
                info = await self.reader.info("replication")
        except (RedisError, OSError) as exc:
            await self._close_clients()
            raise WriteBufferStartupError(
                f"storage.write_buffer: cannot reach {', '.join(self.cfg.endpoints)}: "
                f"{exc}") from exc
        role = info.get("role")
        if role != "master":
            await self._close_clients()
            raise WriteBufferStartupError(
                f"storage.write_buffer: {self.endpoint} is a {role}, not a primary; give the "
                f"primary's URL (writes to a replica are refused)")
        replicas = int(info.get("connected_slaves", 0))
        if replicas < self.cfg.wait_replicas:
            log.warning("write buffer %s has %d connected replica(s) but wait_replicas is %d: "
                        "publishes %s until enough replicas are connected", self.endpoint,
                        replicas, self.cfg.wait_replicas,
                        "fail" if self.cfg.on_wait_timeout == "fail"
                        else "are acknowledged without replication")
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="write-buffer")
        log.info("write buffer on %s (%s%s, %d replica(s) connected, WAIT %d within %d ms, "
                 "on_wait_timeout %s)", ", ".join(self.cfg.endpoints), self.cfg.backend,
                 " cluster" if self.clustered else "", replicas,
                 self.cfg.wait_replicas, self.cfg.wait_timeout_ms, self.cfg.on_wait_timeout)

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        for topic in list(self.topics.values()):
            topic.fail_waiters(WriteBufferError("the write buffer is closed"))
        await self._close_clients()

    def _node_writer(self, host: str, port: int):
        import redis.asyncio as aioredis

        name = f"{host}:{port}"
        writer = self._writers.get(name)
        if writer is None:
            writer = aioredis.Redis(host=host, port=port, max_connections=1,
                                    health_check_interval=0, **self._common)
            self._writers[name] = writer
        return writer

    def _writer_for(self, key: str):
        """The one-connection client of the primary holding ``key``."""
        if not self.clustered:
            return self._writer
        node = self.reader.get_node_from_key(key)
        return self._node_writer(node.host, node.port)

    async def _drop_connections(self) -> None:
        clients = [self._writer, *self._writers.values()]
        if not self.clustered:
            clients.append(self.reader)     # a cluster client renews its own on errors
        for client in clients:
            if client is not None:
                try:
                    await client.connection_pool.disconnect()
                except Exception:  # noqa: BLE001 - a broken connection is dropped anyway
                    pass

    async def _close_clients(self) -> None:
        for client in (self._writer, self.reader, *self._writers.values()):
            if client is None:
                continue
            try:
                await client.aclose()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    # -- topics ---------------------------------------------------------------------------

    async def claim(self, name: str, epoch: int) -> None:
        """Begin an ownership of ``name``'s stream with ``epoch``, before reading it back:
        from then on the stream refuses any earlier owner's appends (so what the new owner
        rebuilds from cannot change under it). WriteBufferFencedError if a later owner has
        claimed it already."""
        from redis.exceptions import RedisError

        try:
            stored = int(await self.reader.eval(CLAIM_SCRIPT, 1, epoch_key(name), epoch))
        except (RedisError, OSError) as exc:
            raise WriteBufferError(f"{name}: could not claim its write buffer stream on "
                                   f"{self.endpoint}: {exc}") from exc
        if stored > epoch:
            raise WriteBufferFencedError(f"{name}: a later owner (epoch {stored}) holds its "
                                         f"write buffer stream; this broker's epoch is {epoch}")

    def topic(self, name: str, next_offset: int, epoch: int | None = None) -> TopicBuffer:
        """The buffer of a topic whose next append gets ``next_offset``; ``epoch``: the
        ownership its appends carry (None: no other broker can own the topic)."""
        old = self.topics.get(name)
        if old is not None:
            old.detach()
        buf = TopicBuffer(self, name, next_offset, epoch)
        self.topics[name] = buf
        return buf

    async def delete_topic(self, name: str) -> None:
        """A deleted topic's stream goes too: a topic created again under the name must not
        recover the old one's messages."""
        from redis.exceptions import RedisError

        old = self.topics.get(name)
        if old is not None:
            old.detach()
        try:
            key = stream_key(name)
            await self.reader.delete(key)
            await self.reader.delete("{%s}%s" % (key, HEARTBEAT_SUFFIX))
            await self.reader.delete(epoch_key(name))
        except (RedisError, OSError) as exc:
            log.error("%s: could not delete its write buffer stream %s on %s (%s): a topic "
                      "created again under this name would recover its messages; delete the "
                      "key by hand", name, stream_key(name), self.endpoint, exc)

    def forget(self, buf: TopicBuffer) -> None:
        if self.topics.get(buf.name) is buf:
            del self.topics[buf.name]
        self._dirty.discard(buf)

    def wake(self, buf: TopicBuffer) -> None:
        """``buf`` has entries to write or to confirm."""
        self._dirty.add(buf)
        self._kick.set()

    # -- the worker -----------------------------------------------------------------------

    async def _run(self) -> None:
        from redis.exceptions import RedisError

        while True:
            await self._kick.wait()
            self._kick.clear()
            if not self._dirty:
                continue
            topics = [t for t in self._dirty if not t.detached]
            self._dirty.clear()
            if self._reconnect:
                self._reconnect = False
                await self._drop_connections()
            if self._resync_all:
                for t in topics:
                    t.resync = True
                self._resync_all = False
            groups: dict = {}
            try:
                for t in topics:
                    groups.setdefault(self._writer_for(t.key), []).append(t)
            except (RedisError, OSError) as exc:
                self._failed(topics, exc)
                continue
            # A cluster's primaries are written at once, each with its own WAIT.
            await asyncio.gather(*(self._pass_guarded(w, ts) for w, ts in groups.items()))

    async def _pass_guarded(self, writer, topics: list[TopicBuffer]) -> None:
        from redis.exceptions import RedisError

        try:
            await self._pass(writer, topics)
        except asyncio.CancelledError:
            raise
        except (RedisError, OSError, WriteBufferError) as exc:
            log.debug("write buffer pass failed", exc_info=True)
            self._failed(topics, exc)
        except Exception as exc:  # noqa: BLE001 - never leave producers waiting
            log.exception("write buffer pass failed")
            self._failed(topics, exc)

    async def _pass(self, writer, topics: list[TopicBuffer]) -> None:
        for t in topics:
            if t.resync:
                await t.resync_from_stream()
        pipe = writer.pipeline(transaction=False)
        # (topic, its entries in one command): an XADD each, or in a cluster one script
        # per topic that checks the ownership epoch first.
        sent: list[tuple[TopicBuffer, list]] = []
        budget = PASS_BYTES
        for t in topics:
            if t.fenced:
                continue
            entries = t.unsent(budget)
            budget -= sum(e.nbytes for e in entries)
            if t.epoch is None:
                for entry in entries:
                    pipe.xadd(t.key, {PAYLOAD: entry.data, ENDS: entry.ends},
                              id=entry_id(entry.first))
                    sent.append((t, [entry]))
            elif entries:
                args = [t.epoch]
                for entry in entries:
                    args += (entry_id(entry.first), entry.data, entry.ends)
                pipe.execute_command("EVAL", APPEND_SCRIPT, 2, t.key, t.epoch_key, *args)
                sent.append((t, entries))
        confirm = [t for t in topics if t.needs_confirmation()]
        if not confirm:
            return
        wait = self.cfg.wait_replicas
        if wait:
            if not sent:
                # Hash-tagged by a topic's key: in a cluster, on that topic's primary.
                pipe.execute_command("INCR", "{%s}%s" % (confirm[0].key, HEARTBEAT_SUFFIX))
            pipe.execute_command("WAIT", wait, self.cfg.wait_timeout_ms)
        results = await pipe.execute(raise_on_error=False)
        failed = None
        for (t, entries), result in zip(sent, results):
            if isinstance(result, Exception):
                if str(result).startswith("FENCED"):
                    t.fence(WriteBufferFencedError(
                        f"{t.name}: the write buffer {self.endpoint} refused this broker's "
                        f"appends: {result} (another broker owns the topic now)"))
                    continue
                t.resync = True      # what of it landed is read back before the next write
                failed = failed or result
            elif not t.resync:
                for entry in entries:
                    t.mark_written(entry)
        self.stats["passes"] += 1
        self.stats["entries"] += sum(len(es) for _, es in sent)
        self.stats["bytes"] += sum(e.nbytes for _, es in sent for e in es)
        if failed is not None:
            raise WriteBufferError(f"{self.endpoint} refused a write: {failed}")
        if wait:
            replicas = results[-1]
            if isinstance(replicas, Exception):
                raise WriteBufferError(f"WAIT on {self.endpoint} failed: {replicas}")
            if replicas < wait:
                self.stats["wait_timeouts"] += 1
                if self.cfg.on_wait_timeout == "fail":
                    raise WriteBufferError(
                        f"WAIT timed out: {replicas} of {wait} replica(s) of {self.endpoint} "
                        f"confirmed within {self.cfg.wait_timeout_ms} ms "
                        f"(on_wait_timeout: fail)")
                self._warn(f"WAIT timed out: {replicas} of {wait} replica(s) confirmed within "
                           f"{self.cfg.wait_timeout_ms} ms; acknowledged anyway "
                           f"(on_wait_timeout: ack)")
        self.failing = False
        for t in confirm:
            t.confirm_written()
        # What did not fit in this pass, or was appended while it ran, goes next.
        for t in topics:
            if t.needs_confirmation():
                self.wake(t)

    def _failed(self, topics: list[TopicBuffer], exc: BaseException) -> None:
        from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError

        self.stats["failures"] += 1
        self.failing = True
        if isinstance(exc, (RedisConnectionError, TimeoutError, OSError)):
            # The connection was lost mid-pass: which writes landed is unknown. Every pooled
            # connection may be to a server that is gone: all are made afresh.
            self._resync_all = True
            self._reconnect = True
        detail = str(exc) if isinstance(exc, WriteBufferError) else \
            f"{self.endpoint}: {type(exc).__name__}: {exc}"
        err = WriteBufferError(f"write buffer: {detail}")
        self._warn(f"{err}; unacknowledged appends are written again every "
                   f"{RETRY_SECONDS:g}s")
        for t in topics:
            t.fail_waiters(err)
            if t.needs_confirmation():
                self._dirty.add(t)
        if self._dirty and self._retry is None:
            def retry():
                self._retry = None
                self._kick.set()
            self._retry = asyncio.get_running_loop().call_later(RETRY_SECONDS, retry)

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 10:
            self._warned_at = now
            log.warning("%s", message)
