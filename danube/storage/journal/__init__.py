"""The broker's journal: one write-ahead journal for every reliable topic of a WAL root, so
that making appends durable costs one ``fdatasync`` per group of appends of all topics,
not one per topic (BookKeeper's bookie journal, RabbitMQ's Ra shared WAL).

How a WAL in mode ``always`` uses it (``WALConfig.journal``; see group_commit.py):

1. ``append`` frames the batch into the topic's index and a buffer (a ``PendingWrite``)
   and hands it to the journal (``Journal.submit``); readers see it at once from the buffer.
2. The journal's writer thread takes everything handed over since its last commit, writes
   it as records into the active journal file (one ``pwritev``) and calls ``fdatasync``
   once: the group is durable. It then writes the same frames into each topic's segment
   file (``pwrite``, no sync) and tells the WALs, which acknowledge.
3. A journal file that is full is closed and a new one opened (a zero-filled or recycled
   file, so a commit's ``fdatasync`` writes data only). The trim thread then calls
   ``syncfs`` once for the file system: every segment write made before it, of every
   topic, is durable, and the closed files are recycled. A topic's segments are therefore
   synced in batches, whatever the number of topics, and a WAL opens, rotates and closes
   with no ``fsync`` of its own on the common path.
4. At start (``open_journal``), what the files hold is replayed into the WALs (replay.py):
   after a power cut, the frames a segment lost are appended again; a crash of the process
   alone leaves them in the page cache. Then the journal starts empty.

What it promises is what mode ``always`` promises: an acknowledged append is on stable
storage (in the journal until its segment is synced). Deleting or setting aside a WAL
directory first commits a ``FORGET`` record, so no replay brings it back.

Files, in ``{wal_root}/.journal/``: ``journal.{seq}`` (the active file and closed ones not
trimmed yet), ``spare`` (the next file, ready), ``lock`` (flock'ed by the broker that owns
the root; it holds the sequence number to continue from). Record layout: records.py.

Not used with ``storage.failover: shared_wal_root`` (every broker's WALs in one root: each
topic keeps its own syncs) nor for the durability modes ``interval`` and ``none``.
"""

from danube.storage.journal.journal import Journal, JournalFailedError
from danube.storage.journal.replay import open_journal

__all__ = ["Journal", "JournalFailedError", "open_journal"]
