"""danube.HealthCheck: is this producer or consumer still served here? CLOSE tells the
client to look the topic up again (reference b.7)."""

from danube.proto import DanubeApi_pb2 as pb
from danube.rpc import RpcError, StatusCode

_OK = pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)
_CLOSE = pb.HealthCheckResponse(status=pb.HealthCheckResponse.CLOSE)


class HealthCheckService:
    def __init__(self, registry):
        self.registry = registry

    async def HealthCheck(self, request, context):
        if request.client == pb.HealthCheckRequest.Producer:
            active = self.registry.producer_active(request.id)
        elif request.client == pb.HealthCheckRequest.Consumer:
            active = self.registry.consumer_active(request.id)
        else:
            raise RpcError(StatusCode.INVALID_ARGUMENT,
                           f"invalid health check client type {request.client}")
        return _OK if active else _CLOSE


def register(server, registry):
    server.add_service(pb.DESCRIPTOR.services_by_name["HealthCheck"],
                       HealthCheckService(registry))
