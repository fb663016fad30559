"""The durable catalogue of a topic: which offsets are in which uploaded object.

Each uploaded WAL segment is described in metadata under upstream's key
``{metadata_prefix}/storage/topics/{ns}/{topic}/segments/{start_offset:020d}`` with upstream's
descriptor fields, and ``…/segments/cur`` points at the newest one. Object names carry both
the first and the last offset (``data-{start:020d}-{end:020d}.dnb1``) rather than upstream's
upload time, so an object is self-describing: the catalogue can be rebuilt from a listing
when the metadata is lost too, and a retried upload of the same segment targets the same key
(which is what makes the conditional put detect a duplicate).

The key layout is defined here (``CatalogKeys``), by the layer that stores under it, rather
than imported from ``danube.metadata.keys``: storage does not depend on the metadata layer.
The keys are upstream's, and ``danube.metadata.keys`` lists the same ones for readers of the
whole layout; a test checks that the two agree.
"""

from __future__ import annotations

import bisect
import dataclasses
import re

SPARSE_EVERY = 1000          # upstream: one (offset, byte_pos) entry every 1000 frames
_OBJECT_RE = re.compile(r"data-(\d{20})-(\d{20})(?:-e(\d+))?\.dnb1$")
#: Upstream's ``metadata_prefix``, under which the catalogue lives.
DEFAULT_METADATA_PREFIX = "/danube"
OFFSET_DIGITS = 20


def split_topic(topic: str) -> tuple[str, str]:
    """``"/ns/topic"`` -> ``("ns", "topic")``; ValueError unless the name is canonical."""
    parts = topic.split("/") if isinstance(topic, str) else ()
    if len(parts) != 3 or parts[0]:
        raise ValueError(f"topic name must have the form /namespace/topic, got {topic!r}")
    return parts[1], parts[2]


class CatalogKeys:
    """The metadata keys of the durable catalogue, under ``metadata_prefix``:
    ``{prefix}/storage/topics/{ns}/{topic}`` (the topic's subtree), ``…/segments/{start:020d}``
    (a descriptor; zero-padded so keys sort by offset) and ``…/segments/cur`` (the pointer to
    the newest one)."""

    __slots__ = ("prefix",)

    def __init__(self, metadata_prefix: str = DEFAULT_METADATA_PREFIX):
        self.prefix = metadata_prefix

    def topic_prefix(self, topic: str) -> str:
        """Subtree of the topic's catalogue."""
        ns, name = split_topic(topic)
        return f"{self.prefix}/storage/topics/{ns}/{name}"

    def segments_prefix(self, topic: str) -> str:
        """Subtree of the topic's segment descriptors (and the ``cur`` pointer)."""
        return f"{self.topic_prefix(topic)}/segments"

    def segment(self, topic: str, start_offset: int) -> str:
        """Value: ``SegmentDescriptor.to_json()``."""
        if isinstance(start_offset, bool) or not isinstance(start_offset, int) or \
                start_offset < 0:
            raise ValueError(f"start offset must be a non-negative int, got {start_offset!r}")
        return f"{self.segments_prefix(topic)}/{start_offset:0{OFFSET_DIGITS}d}"

    def segments_cur(self, topic: str) -> str:
        """Value: ``{"start": "<20-digit start offset>", "end_offset": n}``."""
        return f"{self.segments_prefix(topic)}/cur"

    @staticmethod
    def owner_epoch(topic: str) -> str:
        """The topic's ownership epoch (``danube.metadata.keys.topic_owner_epoch``, not under
        the prefix): a descriptor is written only while it holds the writer's epoch."""
        ns, name = split_topic(topic)
        return f"/topics/{ns}/{name}/owner_epoch"


def topic_object_prefix(topic: str) -> str:
    ns, name = split_topic(topic)
    return f"storage/topics/{ns}/{name}/segments/"


def object_key(topic: str, start: int, end: int, epoch: int | None = None) -> str:
    """An owner with an ownership epoch (a cluster) names it in its objects, so two owners
    never write the same object: an earlier owner still running writes beside the new
    owner's objects, never over them, and the catalogue names only the owner's."""
    tail = "" if epoch is None else f"-e{epoch}"
    return f"{topic_object_prefix(topic)}data-{start:020d}-{end:020d}{tail}.dnb1"


def segment_id(key: str) -> str:
    """The descriptor's ``segment_id``: the object's name without its extension."""
    return key.rsplit("/", 1)[-1].removesuffix(".dnb1")


def parse_object_key(key: str) -> tuple[int, int] | None:
    m = _OBJECT_RE.search(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def object_epoch(key: str) -> int:
    """The ownership epoch an object's name carries (-1 for none)."""
    m = _OBJECT_RE.search(key)
    return int(m.group(3)) if m and m.group(3) else -1


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentDescriptor:
    """An uploaded segment: frames for offsets ``start_offset..end_offset`` in ``size`` bytes
    of ``object_key``. ``offset_index`` holds ``(offset, byte_pos)`` of every
    ``SPARSE_EVERY``-th frame (the first frame always), so a read can start near any offset."""
    segment_id: str
    object_key: str
    start_offset: int
    end_offset: int
    size: int
    etag: str | None
    created_at: float
    offset_index: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict:
        return {"segment_id": self.segment_id, "object_key": self.object_key,
                "start_offset": self.start_offset, "end_offset": self.end_offset,
                "size": self.size, "etag": self.etag, "created_at": self.created_at,
                "completed": True, "offset_index": [list(e) for e in self.offset_index]}

    @classmethod
    def from_json(cls, value) -> SegmentDescriptor | None:
        try:
            return cls(segment_id=str(value["segment_id"]), object_key=str(value["object_key"]),
                       start_offset=int(value["start_offset"]),
                       end_offset=int(value["end_offset"]), size=int(value["size"]),
                       etag=value.get("etag"), created_at=float(value.get("created_at", 0)),
                       offset_index=tuple((int(o), int(p))
                                          for o, p in value.get("offset_index") or ()))
        except (KeyError, TypeError, ValueError):
            return None

    def seek(self, offset: int) -> tuple[int, int]:
        """``(offset, byte_pos)`` of the indexed frame at or before ``offset``."""
        index = self.offset_index
        i = bisect.bisect_right(index, (offset, float("inf"))) - 1
        return index[i] if i >= 0 else (self.start_offset, 0)


class Catalog:
    """The uploaded segments of one topic, in offset order (kept in memory; metadata is the
    record)."""

    def __init__(self, descriptors=()):
        self.segments: list[SegmentDescriptor] = sorted(descriptors,
                                                        key=lambda d: d.start_offset)
        self._starts = [d.start_offset for d in self.segments]

    @property
    def end_offset(self) -> int:
        """The last uploaded offset, -1 when nothing is."""
        return self.segments[-1].end_offset if self.segments else -1

    @property
    def first_offset(self) -> int | None:
        return self.segments[0].start_offset if self.segments else None

    def add(self, desc: SegmentDescriptor) -> None:
        if self.segments and desc.start_offset <= self.segments[-1].end_offset:
            raise ValueError(f"segment {desc.segment_id} overlaps the catalogue (ends at "
                             f"{self.segments[-1].end_offset})")
        self.segments.append(desc)
        self._starts.append(desc.start_offset)

    def locate(self, offset: int) -> SegmentDescriptor | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and self.segments[i].end_offset >= offset:
            return self.segments[i]
        return None

    def next_start_after(self, offset: int) -> int | None:
        """The first uploaded offset above ``offset`` (where a reader that finds ``offset``
        missing resumes), or None."""
        i = bisect.bisect_right(self._starts, offset)
        return self._starts[i] if i < len(self._starts) else None
