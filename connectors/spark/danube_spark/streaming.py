"""Streaming read (`spark.readStream.format("danube")`): the source's offset is a JSON
object partition name -> next offset to read. Spark journals it in the checkpoint, so a
restarted query goes on exactly where the last committed micro-batch ended; the broker
keeps no cursor for the reader (commit has nothing to tell it)."""

import pyspark
from pyspark.sql.datasource import DataSourceStreamReader

from danube_spark.datasource import DanubePartition, read_split, topic_offsets
from danube_spark.errors import DataLoss, OptionError
from danube_spark.options import EARLIEST, LATEST
from danube_spark.planning import Split, cap_offsets
from danube_spark.owners import Owners

try:
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # PySpark < 4.2: no admission control, no Trigger.AvailableNow
    ReadAllAvailable = ReadMaxRows = None
    # Spark wraps this source for Trigger.AvailableNow itself (one latestOffset() call at
    # the start) only with spark.sql.streaming.triggerAvailableNowWrapper.enabled; without
    # it, it falls back to Trigger.Once. The trigger is not visible from here, so it cannot
    # be refused as maxOffsetsPerTrigger is.

    class SupportsTriggerAvailableNow:
        pass


class DanubeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts, projection):
        if opts.max_offsets_per_trigger is not None and ReadMaxRows is None:
            # Before 4.2 Spark passes a Python source no read limit, and capping on our own
            # cannot work: the first latestOffset() of a restarted query is not told where
            # the checkpoint starts, so its micro-batch would take the whole backlog.
            raise OptionError(f"option maxOffsetsPerTrigger needs PySpark >= 4.2 (this is "
                              f"{pyspark.__version__}, which gives a Python streaming source "
                              f"no read limit)")
        self.opts = opts
        self.projection = projection
        self._target = None        # Trigger.AvailableNow's end, fixed at the query's start
        self._last_end = None      # for PySpark < 4.2, whose latestOffset() gets no start
        self._owners = None        # the driver's channels to the partitions' owners

    def __getstate__(self):
        # The reader is shipped to the executors for read(); channels stay on the driver.
        state = dict(self.__dict__)
        state["_owners"] = None
        return state

    def _offsets(self):
        # One Owners for the query's life: each micro-batch asks every partition's owner
        # for its offsets over channels already open.
        if self._owners is None:
            self._owners = Owners(self.opts.service_url, self.opts.timeout,
                                  self.opts.owner_wait)
        return topic_offsets(self._owners, self.opts.topic)

    def initialOffset(self):
        # A new query starts at startingOffsets; its default is "latest" when streaming.
        spec = self.opts.starting if self.opts.starting_given else LATEST
        out = {}
        for part in self._offsets():
            offset = spec.get(part.topic, LATEST) if isinstance(spec, dict) else spec
            out[part.topic] = (part.earliest if offset == EARLIEST
                               else part.latest if offset == LATEST else offset)
        return out

    def prepareForTriggerAvailableNow(self):
        self._target = {p.topic: p.latest for p in self._offsets()}

    def getDefaultReadLimit(self):
        if self.opts.max_offsets_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start=None, limit=None):
        parts = self._offsets()
        max_offsets = getattr(limit, "max_rows", None)
        if start is None:
            # PySpark < 4.2 passes neither start nor limit (and maxOffsetsPerTrigger was
            # refused): go on from the last answer, so an offset never goes back; on the
            # first call the checkpoint's start is unknown here.
            start = self._last_end if self._last_end is not None else self.initialOffset()
        # A partition added since the query started is read from its earliest offset.
        begin = {p.topic: start.get(p.topic, p.earliest) for p in parts}
        latest = {p.topic: p.latest for p in parts}
        if self._target is not None:
            # Trigger.AvailableNow: nothing published after the query started, not even in
            # a partition created since.
            latest = {p: min(o, self._target.get(p, begin[p])) for p, o in latest.items()}
        end = cap_offsets(begin, latest, max_offsets)
        end = {p: max(o, begin[p]) for p, o in end.items()}
        self._last_end = end
        return end

    def partitions(self, start, end):
        earliest = None
        out = []
        for name, stop in sorted(end.items()):
            begin = start.get(name)
            if begin is not None and begin >= stop:
                continue
            if earliest is None:
                earliest = {p.topic: p.earliest for p in self._offsets()}
            kept = earliest.get(name, 0)
            if begin is None:
                begin = kept       # a partition new in this micro-batch
            if begin < kept:
                if self.opts.fail_on_data_loss:
                    raise DataLoss(f"offsets [{begin}, {min(kept, stop)}) of {name} are no "
                                   f"longer available (earliest kept: {kept}); set "
                                   f"failOnDataLoss=false to skip them")
                begin = min(kept, stop)
            at = begin
            while at < stop:
                step = min(at + self.opts.max_offsets_per_split, stop)
                out.append(Split(name, _partition_number(name), at, step))
                at = step
        return [DanubePartition(s) for s in out]

    def read(self, partition):
        return read_split(self.opts, self.projection, partition.split)

    def commit(self, end):
        pass

    def stop(self):
        if self._owners is not None:
            self._owners.close()
            self._owners = None


def _partition_number(name):
    head, sep, tail = name.rpartition("-part-")
    return int(tail) if sep and tail.isdigit() else 0
