"""danube.edge.EdgeReplicatorService on the client port (protocol/EdgeReplicator.proto,
wire-identical to upstream's): edge brokers register, heartbeat and replicate here
(danube.broker.edges does the work).

Codes as upstream's handler answers them: RegisterEdge answers OK with a per-topic error
for a topic it could not set up, INTERNAL when the edge's state cannot be stored;
EdgeHeartbeat NOT_FOUND for an edge that never registered; ReplicateData acks each batch
with its batch_last_offset, skips an empty batch without an ack, and ends the stream with
INTERNAL "ingestion failed: ..." on the first batch it cannot store. Ours adds
INVALID_ARGUMENT for an edge_name no namespace can have and for more than
MAX_EDGE_TOPICS topics (upstream takes both)."""

import logging

from danube.broker import errors as e
from danube.broker.edges import EdgeRegistry
from danube.proto import EdgeReplicator_pb2 as pb
from danube.rpc import RpcError, StatusCode
from danube.services.errors import to_rpc_error

log = logging.getLogger("danube.broker.services")


def _schema(d):
    return None if d is None else pb.ResolvedSchema(**d)


class EdgeReplicatorService:
    def __init__(self, core):
        self.edges = EdgeRegistry(core)

    async def RegisterEdge(self, request, context):
        declarations = [(t.topic_name, t.schema_subject if t.HasField("schema_subject")
                         else None) for t in request.topics]
        try:
            version, results = await self.edges.register(request.edge_name, declarations)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        return pb.RegisterEdgeResponse(
            success=True, message="edge registered", config_version=version,
            topics=[pb.TopicRegistrationResult(
                topic_name=r["topic_name"], topic_created=r["topic_created"],
                schema_resolved=r["schema_resolved"], schema=_schema(r["schema"]),
                error=r["error"]) for r in results])

    async def EdgeHeartbeat(self, request, context):
        try:
            answer = await self.edges.heartbeat(request.edge_name, request.config_version)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        if answer is None:
            raise RpcError(StatusCode.NOT_FOUND, f"edge '{request.edge_name}' not registered "
                                                 f"— call RegisterEdge first")
        changed, version, changes = answer
        return pb.EdgeHeartbeatResponse(
            changed=changed, config_version=version,
            changes=[pb.EdgeChange(topic_name=c["topic_name"], change_type=c["change_type"],
                                   schema=_schema(c["schema"]), detail=c["detail"])
                     for c in changes])

    async def ReplicateData(self, batches, context):
        async for batch in batches:
            if not batch.messages:
                continue                    # upstream: no ack for an empty batch
            try:
                await self.edges.ingest(batch.topic_name, batch.batch_last_offset,
                                        list(batch.messages))
            except e.BrokerError as exc:
                log.warning("edge batch for %s (edge offsets up to %d) not stored: %s",
                            batch.topic_name, batch.batch_last_offset, exc)
                raise RpcError(StatusCode.INTERNAL, f"ingestion failed: {exc}") from None
            yield pb.ReplicateAck(topic_name=batch.topic_name,
                                  acked_offset=batch.batch_last_offset)


def register(server, core):
    server.add_service(pb.DESCRIPTOR.services_by_name["EdgeReplicatorService"],
                       EdgeReplicatorService(core))
