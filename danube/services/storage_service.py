"""danube.StorageService on the client port: ListSegmentDescriptors, upstream v0.15.1's
listing of a topic's sealed, uploaded segments (for the danube-iceberg sidecar)."""

from danube.broker import segments
from danube.proto import DanubeApi_pb2 as pb
from danube.services.errors import maps_errors


def _segment(desc):
    # segment_id is the object's file name: upstream's readers find the object at
    # storage/topics/{ns}/{topic}/segments/{segment_id}.
    return pb.SegmentDescriptorProto(
        segment_id=desc.object_key.rsplit("/", 1)[-1], start_offset=desc.start_offset,
        end_offset=desc.end_offset, size=desc.size, etag=desc.etag or "",
        created_at=int(desc.created_at))


class StorageService:
    def __init__(self, core):
        self.core = core

    @maps_errors()
    async def ListSegmentDescriptors(self, request, context):
        found = await segments.list_descriptors(self.core, request.topic,
                                                request.after_offset)
        return pb.ListSegmentDescriptorsResponse(segments=[_segment(d) for d in found])


def register(server, core):
    server.add_service(pb.DESCRIPTOR.services_by_name["StorageService"], StorageService(core))
