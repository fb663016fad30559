"""Which uploaded segments a topic has, for `danube.StorageService/ListSegmentDescriptors`
(what danube-iceberg polls to find sealed segments to convert).

Read from the durable catalogue in metadata (the descriptors the tiered uploads write under
``{metadata_prefix}/storage/topics/{ns}/{topic}/segments/``), not from a loaded topic's
memory: any broker sharing the metadata answers for any topic, as upstream's, which reads its
segment catalogue the same way. A broker without a durable tier (``storage.mode: local``)
has no descriptors, so the list is empty, as upstream's."""

from danube.broker import names
from danube.storage.tiered.catalog import CatalogKeys, SegmentDescriptor

#: A reply is bounded: a topic uploads a segment per interval, and a poller that asks with
#: its checkpoint gets the next ones in later calls.
MAX_DESCRIPTORS = 10_000


async def list_descriptors(core, topic: str, after_offset: int) -> list[SegmentDescriptor]:
    """The topic's uploaded segments whose first offset is above ``after_offset``, in
    offset order; ``after_offset`` 0 lists them all (upstream's documented meaning; its code
    compares ``start_offset > 0`` and so never lists the segment that starts at offset 0)."""
    if isinstance(topic, str) and topic and not topic.startswith("/"):
        # Upstream's proto documents "default/sensor-data"; danube-iceberg sends
        # "/default/sensor-data": upstream takes both.
        topic = "/" + topic
    names.validate_topic(topic, "topic")
    prefix = CatalogKeys(core.cfg.metadata_prefix).segments_prefix(topic) + "/"
    found = []
    for _key, value in await core.store.scan(prefix):
        desc = SegmentDescriptor.from_json(value) if isinstance(value, dict) else None
        if desc is None or (after_offset and desc.start_offset <= after_offset):
            continue        # the `cur` pointer, or an unreadable record
        found.append(desc)
    found.sort(key=lambda d: d.start_offset)
    return found[:MAX_DESCRIPTORS]
