"""danube.HealthCheck: is this producer or consumer still served here? CLOSE tells the
client to look the topic up again (reference b.7)."""

from danube.proto import DanubeApi_pb2 as pb
from danube.services import checks
from danube.services.errors import maps_errors

_OK = pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)
_CLOSE = pb.HealthCheckResponse(status=pb.HealthCheckResponse.CLOSE)


class HealthCheckService:
    def __init__(self, registry):
        self.registry = registry

    @maps_errors()
    async def HealthCheck(self, request, context):
        checks.health_request(request)
        if request.client == pb.HealthCheckRequest.Producer:
            active = self.registry.producer_active(request.id)
        else:
            active = self.registry.consumer_active(request.id)
        return _OK if active else _CLOSE


def register(server, registry):
    server.add_service(pb.DESCRIPTOR.services_by_name["HealthCheck"],
                       HealthCheckService(registry))
