"""The least any broker could do for a consumer: `python -m bench.consume.noop_server WINDOW`.

Our gRPC transport with handlers that only answer: Discovery says "connect here",
Subscribe gives an id, HealthCheck says OK, ReceiveMessages streams ever-new 100 B messages
(offsets 0, 1, 2, ... per consumer) while fewer than WINDOW are unacknowledged, and Ack
counts. No log, no cursor, no checks. A client drained through it runs at the ceiling its
own costs allow, which no broker speaking the same protocol can raise: `bench.consume`'s
"official client, no-op server" case. Prints `ready <port>` once it listens."""

import asyncio
import itertools
import sys

import uvloop

from danube.proto import DanubeApi_pb2 as pb
from danube.rpc.server import Server

PAYLOAD = b"x" * 100


class NoopBroker:
    def __init__(self, window):
        self.window = window
        self.url = None
        self.ids = itertools.count(1)
        self.unacked = {}          # consumer id -> messages sent and not acked
        self.acked = {}            # consumer id -> asyncio.Event set by every ack
        self.topics = {}           # consumer id -> (topic, subscription)

    async def TopicLookup(self, request, context):
        return pb.TopicLookupResponse(request_id=request.request_id, response_type=1,
                                      connect_url=self.url, broker_url=self.url)

    async def TopicPartitions(self, request, context):
        return pb.TopicPartitionsResponse(request_id=request.request_id,
                                          partitions=[request.topic])

    async def HealthCheck(self, request, context):
        return pb.HealthCheckResponse(status=0)

    async def Subscribe(self, request, context):
        cid = next(self.ids)
        self.unacked[cid] = 0
        self.acked[cid] = asyncio.Event()
        self.topics[cid] = (request.topic_name, request.subscription)
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=cid,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request, context):
        cid = request.consumer_id
        topic, sub = self.topics[cid]
        acked = self.acked[cid]
        for offset in itertools.count():
            while self.unacked[cid] >= self.window:
                acked.clear()
                await acked.wait()
            self.unacked[cid] += 1
            yield pb.StreamMessage(
                request_id=offset, payload=PAYLOAD, publish_time=1, producer_name="p",
                subscription_name=sub,
                msg_id=pb.MsgID(producer_id=1, topic_name=topic, broker_addr=self.url,
                                topic_offset=offset))

    async def Ack(self, request, context):
        # The official client sends no consumer id with an ack: with one consumer per
        # subscription in the benchmark, any unacked count of that topic will do.
        for cid, (topic, sub) in self.topics.items():
            if topic == request.msg_id.topic_name and self.unacked[cid]:
                self.unacked[cid] -= 1
                self.acked[cid].set()
                break
        return pb.AckResponse(request_id=request.request_id)

    async def Nack(self, request, context):
        return pb.NackResponse(request_id=request.request_id)


async def serve(window):
    broker = NoopBroker(window)
    server = Server()
    for name in ("Discovery", "ConsumerService", "HealthCheck"):
        server.add_service(pb.DESCRIPTOR.services_by_name[name], broker)
    port = await server.start("127.0.0.1", 0)
    broker.url = f"http://127.0.0.1:{port}"
    print(f"ready {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
