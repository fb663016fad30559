"""The fastest broker the load generator could meet: `python -P -m bench.scale.noop_server`.

Our gRPC transport with a ProducerService that answers at once (CreateProducer gives an id,
SendMessage acknowledges): no topic, no log, no fsync. bench.scale's `active` section runs its
generator against it to show the generator's own ceiling, so that a broker's figure below it
is the broker's. Prints `ready <port>` once it listens."""

import asyncio
import itertools

import uvloop

from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.server import Server


class NoopProducers:
    def __init__(self):
        self.ids = itertools.count(1)

    async def CreateProducer(self, request, context):
        return pb.ProducerResponse(request_id=request.request_id, producer_id=next(self.ids),
                                   producer_name=request.producer_name)

    async def SendMessage(self, request, context):
        return pb.MessageResponse(request_id=request.request_id)


async def serve():
    server = Server()
    server.add_service(pb.DESCRIPTOR.services_by_name["ProducerService"], NoopProducers())
    port = await server.start("127.0.0.1", 0)
    print(f"ready {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve())
