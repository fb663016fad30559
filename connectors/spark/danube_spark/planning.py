"""Batch read planning: which offsets of which partitions each Spark task reads. Pure
functions of the broker's per-partition offsets and the options, so they are unit-tested
without Spark or a broker."""

from dataclasses import dataclass

from danube_spark.errors import DataLoss, OptionError
from danube_spark.options import EARLIEST, LATEST


@dataclass(frozen=True)
class PartitionRange:
    """One topic partition as the broker reports it (danube_ext.PartitionOffsets)."""
    topic: str
    partition: int
    earliest: int
    latest: int


@dataclass(frozen=True)
class Split:
    """Offsets [start, end) of one partition: one Spark task."""
    topic: str
    partition: int
    start: int
    end: int


def _resolve(spec, part, option):
    offset = spec.get(part.topic, None) if isinstance(spec, dict) else spec
    if offset is None:
        offset = EARLIEST if option == "startingOffsets" else LATEST
    if offset == EARLIEST:
        return part.earliest
    if offset == LATEST:
        return part.latest
    return offset


def check_names(spec, partitions, option, topic):
    """A JSON offsets option naming a partition the topic does not have is a mistake."""
    if not isinstance(spec, dict):
        return
    known = {p.topic for p in partitions}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise OptionError(f"option {option} names {', '.join(unknown)}, not a partition of "
                          f"{topic} (its partitions: {', '.join(sorted(known))})")


def ranges(partitions, starting, ending, fail_on_data_loss, topic):
    """[(partition, start, end)] to read, checked against what the broker holds. A start
    before the earliest offset kept is data loss: an error naming the missing range, or,
    with failOnDataLoss=false, read from the earliest offset kept. An end past the latest is
    capped at the latest (as the broker does)."""
    check_names(starting, partitions, "startingOffsets", topic)
    check_names(ending, partitions, "endingOffsets", topic)
    out = []
    for part in sorted(partitions, key=lambda p: p.partition):
        start = _resolve(starting, part, "startingOffsets")
        end = min(_resolve(ending, part, "endingOffsets"), part.latest)
        if start > end:
            raise OptionError(f"startingOffsets {start} of {part.topic} is after its "
                              f"endingOffsets {end} (the partition holds "
                              f"[{part.earliest}, {part.latest}))")
        if start < part.earliest:
            if fail_on_data_loss:
                raise DataLoss(f"offsets [{start}, {min(end, part.earliest)}) of {part.topic} "
                               f"are no longer available (earliest kept: {part.earliest}); "
                               f"set failOnDataLoss=false to read from the earliest")
            start = min(part.earliest, end)
        out.append((part, start, end))
    return out


def splits(partition_ranges, max_offsets_per_split):
    """One split per partition, cut into pieces of at most max_offsets_per_split offsets.
    Empty ranges get no split; an all-empty read still gets one (empty) split, so Spark has
    a task to run."""
    out = []
    for part, start, end in partition_ranges:
        at = start
        while at < end:
            stop = min(at + max_offsets_per_split, end)
            out.append(Split(part.topic, part.partition, at, stop))
            at = stop
    if not out and partition_ranges:
        part, start, _ = partition_ranges[0]
        out.append(Split(part.topic, part.partition, start, start))
    return out


def cap_offsets(start, latest, max_offsets):
    """End offsets of one micro-batch from `start` towards `latest` (both partition name ->
    offset) reading at most `max_offsets` messages in all, shared out in proportion to each
    partition's backlog (as Kafka's maxOffsetsPerTrigger); every micro-batch with a backlog
    makes progress."""
    backlog = {p: max(0, latest[p] - start.get(p, latest[p])) for p in latest}
    total = sum(backlog.values())
    if max_offsets is None or total <= max_offsets:
        return dict(latest)
    end = {p: start.get(p, latest[p]) + (backlog[p] * max_offsets) // total for p in latest}
    left = max_offsets - sum(end[p] - start.get(p, latest[p]) for p in latest)
    for p in sorted(latest, key=lambda name: -backlog[name]):
        if left <= 0:
            break
        extra = min(left, latest[p] - end[p])
        end[p] += extra
        left -= extra
    return end
