"""danube_ext.TopicHistory: offset-addressed reads of reliable topics (see
protocol/DanubeExt.proto and danube.broker.history). Requests are checked here, at the edge,
before the broker reads anything."""

from danube.broker import errors as e
from danube.broker import history, names
from danube.proto import DanubeExt_pb2 as ext
from danube.services.errors import maps_errors, to_rpc_error

# Offsets are uint64 on the wire but never reach 2**63: a value there is a client's -1 (or
# another negative number) sent unsigned.
MAX_OFFSET = (1 << 63) - 1
MAX_BATCH = 100_000


def offsets_request(r):
    names.validate_topic(r.topic, "topic")


def read_range_request(r):
    names.validate_topic(r.topic, "topic")
    for field in ("start_offset", "end_offset"):
        value = getattr(r, field)
        if value > MAX_OFFSET:
            raise e.InvalidArgument(f"{field}: {value} is not an offset (more than {MAX_OFFSET}"
                                    f"; a negative number sent unsigned?)")
    if r.end_offset < r.start_offset:
        raise e.InvalidArgument(f"end_offset {r.end_offset} is below start_offset "
                                f"{r.start_offset}")
    if r.max_messages > MAX_BATCH:
        raise e.InvalidArgument(f"max_messages: {r.max_messages} is more than {MAX_BATCH}")


class TopicHistoryService:
    def __init__(self, core):
        self.core = core

    @maps_errors()
    async def GetOffsets(self, request, context):
        offsets_request(request)
        partitioned, parts = await history.topic_offsets(self.core, request.topic)
        return ext.OffsetsResponse(partitioned=partitioned, partitions=[
            ext.PartitionOffsets(topic=name, partition=index, earliest=earliest, latest=latest)
            for name, index, earliest, latest in parts])

    async def ReadRange(self, request, context):
        # A coroutine that awaits each write (not an async generator): the write waits for
        # the client's flow-control window, so a slow reader holds one batch, not the range,
        # and the finally closes the reader at once when the call is cancelled.
        try:
            read_range_request(request)
            reader = await history.open_range(self.core, request.topic, request.start_offset,
                                              request.end_offset, request.max_messages)
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        try:
            while True:
                batch = await reader.next_batch()
                if batch is None:
                    return
                await context.write(ext.ReadRangeBatch(messages=batch))
        except e.BrokerError as exc:
            raise to_rpc_error(exc) from None
        finally:
            reader.close()


def register(server, core):
    server.add_service(ext.DESCRIPTOR.services_by_name["TopicHistory"],
                       TopicHistoryService(core))
