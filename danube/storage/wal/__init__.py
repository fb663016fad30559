"""Per-topic write-ahead log: mmap'd segment files, group commit, a hot-tail cache, retention.

One ``WAL`` owns one directory (one topic). Messages get offsets from 0 (or ``start_offset``) up,
contiguous and never reused while the data that carried them survives. ``append`` frames a batch in
C (``danube.storage._walframes``, no Python per message) and returns at once; the frames go to the
active segment with ``pwrite`` (see segment.py for why not through the mapping, which serves reads),
at once or, in mode ``always``, from the sync worker (see "Writes" below). Durability is a separate,
shared step (``sync_to``), so one ``fdatasync`` covers every append made before it started ("group
commit").

Layout of the directory::

    wal.00000000000000000000.log    sealed segment: frames of offsets 0..N, no zero tail
    wal.0000000000000000N+1.log     active segment: preallocated, zero tail after the data
    wal.ckpt                        checkpoint (a hint for recovery, see checkpoint.py)
    wal.lock                        flock'ed while a WAL has the directory open

Each frame is ``[u64 offset][u32 len][u32 crc32c(header[0:12] + payload)][payload]``
(see ``danube/storage/_walframes.pyx``).

Durability modes, and exactly what each promises
------------------------------------------------

Appends are written into the kernel's page cache for the file (``pwrite``; the segments'
``MAP_SHARED`` mappings readers use are that same cache). So:

**Process crash** (kill -9, OOM kill, a segfault, ``os._exit``) -- every append that was
written is recovered: the page cache belongs to the kernel, not the process, and is written
back later whatever happened to the writer. In ``interval`` and ``none`` modes that is every
append that returned. In ``always`` mode it is at least every append a completed sync covers
(every acknowledged one); appends made after the last sync started may be lost, as on a
machine crash. A batch being written at the instant of the kill can be cut; recovery drops
that torn frame (nobody was told about it) and keeps everything before it.

**Machine crash** (power loss, kernel panic, VM reset) -- what reached stable storage:

* ``always``: every offset covered by a completed sync is kept -- that is, every offset for
  which ``append_durable`` or ``sync_to`` returned. A sync is ``fdatasync`` of each segment
  with unsynced data (plus an fsync of the directory when a segment was created: before the
  new segments' fdatasync, after the others'; see ``group_commit._Job``), run in the
  executor. Appends whose sync had not completed may be lost; recovery keeps the longest
  clean prefix. Concurrent callers share syncs: while one sync runs, new appends queue for
  the next, so the number of fdatasync calls tracks the disk's speed, not the request rate.
  Plain ``append`` in this mode also schedules a sync, it just does not wait for it.
* ``interval``: a background sync every ``sync_interval_ms`` (and when a segment is sealed);
  ``append_durable`` returns after the write, not the sync. Up to about one interval of
  acknowledged appends can be lost, from the end of the log.
* ``none``: the WAL never syncs while running (only at open and at close, or when a caller
  asks with ``sync_to``); the kernel writes back when it likes (``vm.dirty_expire_centisecs``,
  30 s by default). Anything not written back can be lost, including part of an already
  sealed segment -- which recovery then reports as ``CorruptSegmentError``, since it cannot
  tell that apart from disk damage.

After a machine crash in ``interval`` or ``none`` mode the log continues right after the last
surviving offset, so offsets that were lost are given out again to new messages; a reader
that saw the lost messages before the crash may see different ones at the same offsets.
``always`` never hands out an offset twice for data that was acknowledged. (All of this
assumes a disk that honours cache flushes, as any fsync-based store does.)

Readers see data as soon as it is appended, before it is durable (and, in ``always`` mode,
before it is written: ``read`` serves it from the pending buffers). A caller that must not
expose data that could still be lost (in ``always`` mode) bounds its reads by
``durable_offset``.

Writes
------

In ``interval`` and ``none`` modes ``append`` writes its frames before it returns. In
``always`` mode nobody is told about an append before a sync covers it, so the write can wait
for the sync: ``append`` frames the batch into a buffer (a PendingWrite) and returns, and the
sync job, in the executor, writes every pending buffer (one ``pwritev`` per run of them) just
before its ``fdatasync``. (An append under 16 KiB while nothing is pending, such as a single
message, is written at once: that costs less than the bookkeeping.) The event loop then
never waits on the copy into the page cache, which is the largest cost of a durable append
when the page cache grows (on the reference VM ~480 us of CPU per 230 KB batch, see
bench/reliable): with several batches in flight the loop works on the next ones while the
executor writes and syncs. Rotation writes whatever is
pending before the segment is sealed and its successor created, so a process crash never
leaves a gap between segments. A rotation forced by an append (the batch does not fit, or
the segment is too old) does that on the loop, once per segment, waiting for a write in
flight if there is one; ``rotate()`` (the tiered uploader's, every upload interval) asks the
sync worker instead, which rotates between two syncs after writing the pending frames in the
executor, so the loop waits for nothing and copies only what was appended meanwhile.

A sync is ``fdatasync``: appends are ``pwrite`` calls, so it covers them on any POSIX system;
the file size only changes when a segment grows or is sealed, and fdatasync covers that too.
(Before appends used ``pwrite`` they were stores into the ``MAP_SHARED`` mapping, which on
Linux is the page cache too; the msync of the dirty range on other Unixes is kept, harmless.)

Threads and tasks
-----------------

The WAL is used from one event loop. It owns one background task (the sync worker: group
commit, interval syncs, closing the descriptors of sealed segments, rotations asked for by
``rotate()``, checkpoint writes) and runs blocking file work in an executor: a two-thread
executor of its own by default (a sync and a deletion may overlap; syncs never do), or one
shared by many WALs (pass ``executor=``; a broker with thousands of topics should).
Checkpoints are written by one more thread, shared by every WAL of the process, after the
sync job whose state they record, not in it: appends waiting for that sync (the first after
a rotation, say) are acknowledged without waiting for the checkpoint's own fsyncs, and
checkpoints never hold the threads that syncs wait for. That is safe because a checkpoint is
only a hint that recovery checks against the files, and a new segment's directory entry is
made durable by the sync job itself. ``close()`` stops the task and waits for work in the
executors.

The package, by job (one ``WAL`` facade composing one object per job; each is given the
shared state and the other parts it calls at construction, and calls them only through
their public methods):

* ``config``        -- the durability modes and ``WALConfig``
* ``state``         -- ``WalState``: the segments, the active one, the offsets, the pending
  writes and the lifecycle, shared by the parts below
* ``log``           -- the ``WAL`` facade: opening (recovery), closing, and one-statement
  delegations (the hot ones bound on the instance, see log.py)
* ``append``        -- ``Appender``: appends, and rotation of the active segment
* ``read``          -- ``Reader``: reads (hot-tail cache, segments, pending buffers), the
  readers waiting at the head, mappings of sealed segments
* ``group_commit``  -- ``GroupCommit``: the sync worker: group commit, write-ahead, interval
  syncs, checkpoints
* ``retention``     -- ``Retention``: deleting old sealed segments
"""

from danube.storage.recovery import RecoveryReport
from danube.storage.segment import SegmentInfo
from danube.storage.wal.config import ALWAYS, INTERVAL, NONE, WALConfig
from danube.storage.wal.log import WAL

__all__ = ["ALWAYS", "INTERVAL", "NONE", "WAL", "WALConfig", "SegmentInfo", "RecoveryReport"]
