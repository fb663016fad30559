"""Edge -> cluster over danube.edge.EdgeReplicatorService: registration and heartbeats
(``ClusterLink``), and one replicator per local topic (``TopicReplicator``) that reads the
WAL from its checkpoint, sends batches on a ReplicateData stream, and moves the checkpoint
when the cluster acks one. In a cluster, each replicator streams to the broker serving its
topic (TopicLookup; looked up again after any failure); behind an ingress in proxy mode (the
lookup's ``proxy``) the stream goes to the ingress with ``x-danube-broker-url`` naming that
broker, as the client's calls do, and the ingress routes it there.

Only what a WAL sync covers is sent: a message the edge could still lose in a machine crash
must not reach the cluster, or the offset would be given to another message after the
restart and the cluster would skip that one as a resend. The cluster skips messages it has
stored already (its marker per topic), so a batch resent after a lost ack or a restart is
not stored twice. While the cluster is unreachable each replicator retries with
exponential backoff (0.2 s doubling to ``MAX_BACKOFF``, with jitter)."""

import asyncio
import logging
import random

from danube.metadata import keys
from danube.proto import DanubeApi_pb2 as api
from danube.proto import EdgeReplicator_pb2 as pb
from danube.rpc import RpcError, StatusCode
from danube.rpc.client import Channel

log = logging.getLogger("danube.edge.replicator")

SERVICE = "/danube.edge.EdgeReplicatorService/"
MIN_BACKOFF = 0.2
#: Upstream waits 30 s after its retries run out; a link back after a cut is used within
#: this long here.
MAX_BACKOFF = 5.0
#: A batch not acked within this long: the stream is taken for dead and opened again.
ACK_TIMEOUT = 30.0
CALL_TIMEOUT = 15.0
#: What an ingress in proxy mode routes a call on (danube.devcluster.ingress, the client's
#: BrokerAddress.call_metadata).
BROKER_URL_HEADER = "x-danube-broker-url"


def backoff(attempt):
    delay = min(MAX_BACKOFF, MIN_BACKOFF * (2 ** min(attempt, 10)))
    return delay * random.uniform(0.5, 1.0)


def _target(url):
    for scheme in ("http://", "https://"):
        if url.startswith(scheme):
            return url
    return "http://" + url


def _schema_dict(s):
    return {"subject": s.subject, "schema_id": s.schema_id, "schema_version": s.schema_version,
            "schema_type": s.schema_type, "schema_definition": bytes(s.schema_definition),
            "fingerprint": s.fingerprint, "compatibility_mode": s.compatibility_mode}


class ClusterLink:
    """RegisterEdge until it succeeds, then EdgeHeartbeat every heartbeat_interval_ms
    (registering again if the cluster forgot the edge, or a topic is still refused)."""

    def __init__(self, cfg, ingest, token=None):
        self.cfg = cfg
        self.ingest = ingest
        token = token if token is not None else cfg.token
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self.channel = Channel(_target(cfg.cluster_url), metadata=self._metadata)
        # In a cluster a topic is served by one broker: its replicator streams there.
        self._owners = {}               # topic -> Channel of the broker serving it
        self._channels = {_target(cfg.cluster_url): self.channel}
        self._lookup = self.channel.unary_unary(
            "/danube.Discovery/TopicLookup", api.TopicLookupRequest.SerializeToString,
            api.TopicLookupResponse.FromString)
        self.config_version = 0
        self.registered = {}            # topic -> asyncio.Event, set once the cluster has it
        for mapping in cfg.danube_topics():
            self.registered[mapping.danube_topic] = asyncio.Event()
        self._register = self.channel.unary_unary(
            SERVICE + "RegisterEdge", pb.RegisterEdgeRequest.SerializeToString,
            pb.RegisterEdgeResponse.FromString)
        self._heartbeat = self.channel.unary_unary(
            SERVICE + "EdgeHeartbeat", pb.EdgeHeartbeatRequest.SerializeToString,
            pb.EdgeHeartbeatResponse.FromString)

    async def run(self):
        attempt = 0
        while True:
            try:
                if not all(e.is_set() for e in self.registered.values()):
                    await self.register()
                else:
                    await self.heartbeat()
                attempt = 0
                await asyncio.sleep(self.cfg.heartbeat_interval_ms / 1000
                                    if all(e.is_set() for e in self.registered.values())
                                    else backoff(5))
            except RpcError as exc:
                log.warning("cluster %s: %s (retrying)", self.cfg.cluster_url, exc)
                await asyncio.sleep(backoff(attempt))
                attempt += 1

    async def register(self):
        request = pb.RegisterEdgeRequest(edge_name=self.cfg.edge_name)
        for mapping in self.cfg.danube_topics():
            decl = request.topics.add(topic_name=mapping.danube_topic)
            if mapping.schema_subject is not None:
                decl.schema_subject = mapping.schema_subject
        response = await self._register(request, timeout=CALL_TIMEOUT)
        self.config_version = response.config_version
        for result in response.topics:
            if result.error:
                log.error("cluster refused topic %s: %s", result.topic_name, result.error)
                continue
            if result.schema_resolved:
                await self.ingest.set_schema(
                    result.topic_name,
                    _schema_dict(result.schema) if result.HasField("schema") else None)
            else:
                log.warning("topic %s: schema subject not found on the cluster: the topic "
                            "takes no MQTT messages until it is", result.topic_name)
            event = self.registered.get(result.topic_name)
            if event is not None:
                event.set()
        log.info("registered with cluster %s as edge %s (config_version %d)",
                 self.cfg.cluster_url, self.cfg.edge_name, self.config_version)

    async def heartbeat(self):
        try:
            response = await self._heartbeat(pb.EdgeHeartbeatRequest(
                edge_name=self.cfg.edge_name, config_version=self.config_version),
                timeout=CALL_TIMEOUT)
        except RpcError as exc:
            if exc.code == StatusCode.NOT_FOUND:
                log.warning("the cluster does not know this edge any more: registering again")
                await self.register()
                return
            raise
        if response.changed:
            for change in response.changes:
                if change.change_type == pb.SCHEMA_UPDATED and change.HasField("schema"):
                    log.info("topic %s: schema updated on the cluster (%s)", change.topic_name,
                             change.detail)
                    await self.ingest.set_schema(change.topic_name, _schema_dict(change.schema))
                else:
                    log.warning("topic %s: %s", change.topic_name, change.detail)
                    await self.ingest.set_schema(change.topic_name, None)
        self.config_version = response.config_version

    async def channel_for(self, topic):
        """(channel, call metadata) to reach the broker serving ``topic`` (TopicLookup, as
        upstream's edge asks), remembered until ``forget``; the cluster_url broker when the
        lookup fails. Through an ingress in proxy mode the metadata is the
        ``x-danube-broker-url`` header the ingress routes on (without it the call would go
        to any broker)."""
        found = self._owners.get(topic)
        if found is not None:
            return found
        metadata = None
        try:
            answer = await self._lookup(api.TopicLookupRequest(request_id=1, topic=topic),
                                        timeout=CALL_TIMEOUT)
            # Connect: the broker asked serves it; keep the connection the edge was given
            # (its address may be one only the edge can reach, through a proxy or NAT).
            url = (answer.connect_url or answer.broker_url
                   if answer.response_type == api.TopicLookupResponse.Redirect else "")
            if answer.proxy and answer.broker_url:
                metadata = ((BROKER_URL_HEADER, answer.broker_url),)
        except RpcError as exc:
            log.warning("lookup of %s failed (%s): replicating through %s", topic, exc,
                        self.cfg.cluster_url)
            url = ""
        channel = self.channel
        if url:
            target = _target(url)
            channel = self._channels.get(target)
            if channel is None:
                channel = self._channels[target] = Channel(target, metadata=self._metadata)
        self._owners[topic] = channel, metadata
        return channel, metadata

    def forget(self, topic):
        """Look the topic's broker up again before the next stream (it may have moved)."""
        self._owners.pop(topic, None)

    async def close(self):
        for channel in self._channels.values():
            await channel.close()


class TopicReplicator:
    def __init__(self, cfg, topic, link, store):
        self.cfg = cfg
        self.topic = topic              # the LocalTopic
        self.link = link
        self.store = store
        self.checkpoint = -1            # the highest local offset the cluster acked
        self.batches = 0
        self.sent = 0

    async def run(self):
        name = self.topic.name
        stored = await self.store.get(keys.edge_checkpoint(name))
        self.checkpoint = stored if isinstance(stored, int) else -1
        await self.link.registered[name].wait()
        log.info("replicating %s from offset %d", name, self.checkpoint + 1)
        attempt = 0
        while True:
            call = None
            try:
                channel, metadata = await self.link.channel_for(name)
                call = await channel.stream_stream(
                    SERVICE + "ReplicateData", pb.ReplicateBatch.SerializeToString,
                    pb.ReplicateAck.FromString)(metadata=metadata)
                while True:
                    batch = await self._next_batch()
                    await call.write(batch)
                    ack = await asyncio.wait_for(call.read(), ACK_TIMEOUT)
                    if ack is None:
                        call.stream.raise_for_status()
                        raise _StreamEnded("the cluster ended the ReplicateData stream")
                    await self._acked(ack, batch)
                    attempt = 0
            except (RpcError, OSError, asyncio.TimeoutError, _StreamEnded) as exc:
                if call is not None:
                    call.cancel()
                self.link.forget(name)
                delay = backoff(attempt)
                attempt += 1
                log.warning("replication of %s interrupted (%s): retrying from offset %d in "
                            "%.1fs", name, exc, self.checkpoint + 1, delay)
                await asyncio.sleep(delay)

    async def _next_batch(self):
        """The next batch after the checkpoint: batch_size messages, or fewer once
        batch_timeout_ms has passed since the first one was there; only what a sync
        covers."""
        wal = self.topic.wal
        start = self.checkpoint + 1
        size = self.cfg.replicator_batch_size
        await wal.wait_for(start)
        if wal.next_offset - start < size:
            try:
                await asyncio.wait_for(wal.wait_for(start + size - 1),
                                       self.cfg.replicator_batch_timeout_ms / 1000)
            except asyncio.TimeoutError:
                pass
        last = min(start + size, wal.next_offset) - 1
        await wal.sync_to(last)
        batch = pb.ReplicateBatch(topic_name=self.topic.name, batch_last_offset=last)
        for offset, raw in wal.read(start, last - start + 1):
            msg = api.StreamMessage.FromString(bytes(raw))
            msg.msg_id.topic_offset = offset
            batch.messages.append(msg)
        return batch

    async def _acked(self, ack, batch):
        if ack.acked_offset != batch.batch_last_offset or ack.topic_name != batch.topic_name:
            raise _StreamEnded(f"ack for {ack.topic_name} offset {ack.acked_offset}, expected "
                               f"{batch.topic_name} offset {batch.batch_last_offset}")
        self.checkpoint = ack.acked_offset
        self.batches += 1
        self.sent += len(batch.messages)
        await self.store.put(keys.edge_checkpoint(self.topic.name), self.checkpoint)
        # What the cluster holds need not stay at the edge: sealed segments wholly below
        # the checkpoint go (the disk holds the backlog and the active segment).
        await self.topic.wal.truncate_before(self.checkpoint + 1)


class _StreamEnded(Exception):
    pass
