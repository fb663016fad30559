"""danube_ext.TopicHistory: offset-addressed reads of reliable topics (see
protocol/DanubeExt.proto and danube.broker.history). Requests are checked at the edge
(danube.services.checks) before the broker reads anything."""

from danube.broker import errors as e
from danube.broker import history
from danube.proto import DanubeExt_pb2 as ext
from danube.services import checks
from danube.services.errors import maps_errors, to_rpc_error

class TopicHistoryService:
    def __init__(self, core):
        self.topics = core.topic_table

    @maps_errors()
    async def GetOffsets(self, request, context):
        checks.offsets_request(request)
        partitioned, parts = await history.topic_offsets(self.topics, request.topic)
        return ext.OffsetsResponse(partitioned=partitioned, partitions=[
            ext.PartitionOffsets(topic=name, partition=index, earliest=earliest, latest=latest)
            for name, index, earliest, latest in parts])

    async def ReadRange(self, request, context):
        # A coroutine that awaits each write (not an async generator): the write waits for
        # the client's flow-control window, so a slow reader holds one batch, not the range,
        # and the finally closes the reader at once when the call is cancelled.
        try:
            checks.read_range_request(request)
            reader = await history.open_range(self.topics, request.topic, request.start_offset,
                                              request.end_offset, request.max_messages,
                                              columnar=request.columnar)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        try:
            while True:
                batch = await reader.next_batch()
                if batch is None:
                    return
                # A columnar batch comes serialized (danube.broker._columns).
                await context.write(batch if request.columnar
                                    else ext.ReadRangeBatch(messages=batch))
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        finally:
            reader.close()


def register(server, core):
    server.add_service(ext.DESCRIPTOR.services_by_name["TopicHistory"],
                       TopicHistoryService(core))
