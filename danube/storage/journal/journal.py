"""``Journal``: the broker's one write-ahead journal (see the package docstring).

Threads: one writer thread makes every group commit (records into the active file, one
``fdatasync``, then the same frames into their topics' segment files), so a commit never
waits for the event loop and the loop never waits for a commit; one trim thread syncs the
file system behind closed files (``syncfs``), recycles them and prepares the next file.
The loop hands appends over with ``submit`` (a deque and an event, no lock on the hot path)
and hears back through one ``call_soon_threadsafe`` per group.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import threading
import time

from danube.dirsync import fsync_dir, makedirs_durable, sync_filesystem
from danube.fslock import try_lock
from danube.storage.errors import WALLockedError
from danube.storage.exhaustion import DISK_FULL_ERRNOS
from danube.storage.journal.records import FORGET, FRAMES, encode_header
from danube.storage.segment_writes import write_pending

log = logging.getLogger("danube.storage.journal")

DIRECTORY = ".journal"
LOCK_NAME = "lock"
SPARE_NAME = "spare"
PREFIX = "journal."
#: Closed files not trimmed yet beyond which the writer waits for the trim thread: bounds
#: the journal's disk and the replay after a crash.
MAX_CLOSED = 4
_ZEROS = bytes(1 << 20)
_IOV_MAX = 1024
#: The syscall a commit makes; tests wrap it.
_fdatasync = getattr(os, "fdatasync", os.fsync)


def file_name(seq: int) -> str:
    return f"{PREFIX}{seq:016d}"


def parse_file_name(name: str) -> int | None:
    if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
        return int(name[len(PREFIX):])
    return None


def journal_files(directory: str) -> list[tuple[int, str]]:
    """The journal files in ``directory``, oldest first: (sequence number, path)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((seq, os.path.join(directory, n)) for n in names
                  if (seq := parse_file_name(n)) is not None)


def lock_journal(directory: str) -> int:
    makedirs_durable(directory)         # (its files' entries are synced as they come)
    fd = try_lock(os.path.join(directory, LOCK_NAME))
    if fd is None:
        raise WALLockedError(f"WAL journal {directory} is open in another broker process "
                             f"(one broker per WAL root)")
    return fd


def recycle(directory: str, paths: list[str]) -> None:
    """Journal files whose records are durable elsewhere (their segments synced): the
    first becomes the spare if there is none, the rest go; then the directory is synced."""
    if not paths:
        return
    spare = os.path.join(directory, SPARE_NAME)
    for path in paths:
        if not os.path.exists(spare):
            os.rename(path, spare)
        else:
            os.unlink(path)
    fsync_dir(directory)


def _zero_fill(fd: int, size: int) -> None:
    """Write zeros over ``[0, size)``, so that the file's blocks are allocated and written
    and a later ``fdatasync`` has only data to write (no extent conversion, no size)."""
    pos = 0
    while pos < size:
        n = os.pwrite(fd, _ZEROS[:min(len(_ZEROS), size - pos)], pos)
        pos += n
    _fdatasync(fd)


def read_next_seq(lock_fd: int) -> int:
    """The sequence number a clean close recorded (0: none). Sequence numbers only grow, so
    the old records in a recycled file never pass for a new file's."""
    raw = os.pread(lock_fd, 64, 0)
    try:
        return int(raw.split(b"\n", 1)[0] or 0)
    except ValueError:
        return 0


def write_next_seq(lock_fd: int, seq: int) -> None:
    data = f"{seq}\n".encode()
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, data, 0)
    os.fsync(lock_fd)


class JournalFailedError(OSError):
    """A write or sync of the journal failed: nothing more is acknowledged through it."""


class Journal:
    """One per WAL root. ``open`` it with the root's lock held (``lock_journal``)."""

    def __init__(self, root: str, lock_fd: int, *, file_bytes: int, first_seq: int,
                 max_open_segments: int = 1000):
        self.root = root
        self.directory = os.path.join(root, DIRECTORY)
        self.file_bytes = file_bytes
        self._lock_fd = lock_fd
        self._loop = asyncio.get_running_loop()
        self._queue: collections.deque = collections.deque()
        self._event = threading.Event()
        self._stopping = False
        self._failed: BaseException | None = None
        #: Held while frames are written to segment files, by the writer thread and by a
        #: WAL's rotation on the loop (``GroupCommit.write_all_pending``): never both.
        self.segment_lock = threading.Lock()
        # The active file.
        self._seq = first_seq - 1
        self._fd: int | None = None
        self._pos = 0
        self._size = 0
        # Closed files waiting for the trim thread, and the trim thread's bookkeeping.
        self._closed: list[tuple[int, str]] = []
        self._closed_cond = threading.Condition()
        self._trim = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="danube-journal-trim")
        self._spare_job: concurrent.futures.Future | None = None
        self._spare_asked = False
        # Whether the writer holds a group (for ``barrier``).
        self._busy = False
        self._done_cond = threading.Condition()
        #: WAL directories open in this process (the per-WAL lock file's job, in memory).
        self._open_dirs: set[str] = set()
        #: The WALs whose active segment may hold a descriptor, least recently used first
        #: (the loop's only): beyond ``max_open_segments`` idle ones close theirs.
        self._files: collections.OrderedDict = collections.OrderedDict()
        self.max_open_segments = max_open_segments
        #: Completed group commits and their fdatasync calls (metrics, tests).
        self.commits = 0
        self.trims = 0
        self._thread = threading.Thread(target=self._run, name="danube-journal", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the first file (blocking: call it from a thread) and start the writer."""
        self._roll(0)
        self._thread.start()

    def claim(self, directory: str) -> None:
        """A WAL opens ``directory`` (instead of its lock file, see recovery.py)."""
        if directory in self._open_dirs:
            raise WALLockedError(f"WAL directory {directory} is open in another WAL")
        self._open_dirs.add(directory)

    def unclaim(self, directory: str) -> None:
        self._open_dirs.discard(directory)

    def key(self, directory: str) -> bytes:
        """A WAL directory's name in the records: relative to the root."""
        return os.path.relpath(directory, self.root).encode()

    # ------------------------------------------------------------------ the loop's side

    def submit(self, key: bytes, commit, pending) -> None:
        """Journal an append: ``pending`` (a PendingWrite) goes into the next group commit;
        ``commit.journaled(pendings, error)`` is called on the loop once it is durable and
        in its segment (see ``GroupCommit.journaled``)."""
        self._queue.append((key, commit, pending))
        self._event.set()

    def touch(self, commit) -> None:
        """A WAL used its active segment (on the loop): it is the most recently used;
        beyond the bound, the least recently used idle ones close their descriptors
        (``GroupCommit.close_idle_file``), so descriptors do not grow with the topics."""
        files = self._files
        if commit in files:
            files.move_to_end(commit)
        else:
            files[commit] = None
        excess = len(files) - self.max_open_segments
        if excess > 0:
            # A busy one (frames pending) goes back to the end; a few tries per call.
            for _ in range(excess + 8):
                oldest = next(iter(files))
                if oldest is commit:
                    break
                del files[oldest]
                if not oldest.close_idle_file():
                    files[oldest] = None
                elif len(files) <= self.max_open_segments:
                    break

    def untouch(self, commit) -> None:
        self._files.pop(commit, None)

    async def forget(self, directory: str) -> None:
        """Record durably that ``directory`` is deleted or set aside (before it is), so a
        replay never brings back what the journal still holds of it."""
        fut = self._loop.create_future()
        self._queue.append((self.key(directory), fut, None))
        self._event.set()
        await fut

    def barrier(self) -> None:
        """Block until every group submitted so far is done (a WAL releasing its files
        must not have them written by the writer afterwards)."""
        with self._done_cond:
            self._done_cond.wait_for(lambda: not (self._queue or self._busy)
                                     or not self._thread.is_alive(), timeout=60)

    async def close(self) -> None:
        """After every WAL using it closed: stop the writer, make everything durable
        (``syncfs``), and remove the files (the active one kept as the spare)."""
        self._stopping = True
        self._event.set()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._thread.join)
        await loop.run_in_executor(self._trim, self._close_files)
        self._trim.shutdown(wait=True)
        os.close(self._lock_fd)

    # ------------------------------------------------------------------ the writer thread

    def _run(self) -> None:
        queue, event = self._queue, self._event
        while True:
            event.wait()
            event.clear()
            with self._done_cond:
                self._busy = True
            batch = []
            while queue:
                batch.append(queue.popleft())
            try:
                if batch:
                    self._commit(batch)
            finally:
                with self._done_cond:
                    self._busy = False
                    self._done_cond.notify_all()
            if self._stopping and not queue:
                return

    def _commit(self, batch: list) -> None:
        error = self._failed
        started = time.perf_counter()
        if error is None:
            try:
                self._write(batch)
                self.commits += 1
            except BaseException as exc:  # noqa: BLE001 - every waiter hears of it
                log.error("WAL journal %s: write or sync failed, refusing further appends: "
                          "%r", self.directory, exc)
                error = self._failed = exc
        results = []
        groups: dict = {}
        for _, commit, pending in batch:
            if pending is None:
                results.append((commit, None, error))
            else:
                groups.setdefault(commit, []).append(pending)
        for commit, pendings in groups.items():
            problem = error
            if problem is None:
                try:
                    with self.segment_lock:
                        write_pending(pendings)
                except BaseException as exc:  # noqa: BLE001 - that WAL fails
                    problem = exc
            results.append((commit, pendings, problem))
        # Each WAL counts the commit as one flush of its own (upstream's danube_wal_flush_*).
        flush_ms = (time.perf_counter() - started) * 1000.0
        try:
            self._loop.call_soon_threadsafe(_deliver, results, flush_ms)
        except RuntimeError:        # the loop is closed: nobody is waiting any more
            pass

    def _write(self, batch: list) -> None:
        seq = self._seq
        iov, total = [], 0
        for key, _, pending in batch:
            if pending is None:
                head = encode_header(seq, FORGET, key, 0, 0, b"")
                iov.append(head)
                total += len(head)
            else:
                body = memoryview(pending.buf)[:pending.nbytes]
                head = encode_header(seq, FRAMES, key, pending.first_offset, pending.count,
                                     body)
                iov += (head, body)
                total += len(head) + pending.nbytes
        if self._pos + total > self._size:
            self._roll(total)
            if self._seq != seq:        # the records name the file they are in
                self._write(batch)
                return
        pos = self._pos
        for i in range(0, len(iov), _IOV_MAX):
            chunk = iov[i:i + _IOV_MAX]
            want = sum(len(b) for b in chunk)
            done = os.pwritev(self._fd, chunk, pos)
            if done < want:                 # a short write: finish it plainly
                rest = b"".join(bytes(b) for b in chunk)[done:]
                while rest:
                    n = os.pwrite(self._fd, rest, pos + done)
                    done += n
                    rest = rest[n:]
            pos += want
        _fdatasync(self._fd)
        self._pos = pos
        if not self._spare_asked and pos > self._size // 2:
            # The next file, made ready once this one is half full (not sooner: a quiet
            # broker keeps one journal file on disk, not two).
            self._spare_asked = True
            self._spare_job = self._trim.submit(self._prepare_spare)

    def _roll(self, need: int) -> None:
        """Close the active file (for the trim thread) and open the next one: the spare
        if it is big enough, else a new zero-filled file. Its directory entry is made
        durable before any record in it counts."""
        with self._closed_cond:
            self._closed_cond.wait_for(lambda: len(self._closed) < MAX_CLOSED, timeout=120)
        if self._spare_job is not None:
            try:
                self._spare_job.result()
            except OSError as exc:      # a spare is an optimisation: a full disk, say
                log.warning("WAL journal %s: no spare file ready (%s)", self.directory, exc)
            self._spare_job = None
        old_fd, old_seq = self._fd, self._seq
        self._seq += 1
        path = os.path.join(self.directory, file_name(self._seq))
        spare = os.path.join(self.directory, SPARE_NAME)
        size = max(self.file_bytes, need)
        if os.path.exists(spare) and os.stat(spare).st_size >= size:
            os.rename(spare, path)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            size = os.fstat(fd).st_size
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                _zero_fill(fd, size)
            except BaseException as exc:
                os.close(fd)
                os.unlink(path)
                self._seq -= 1
                if (old_fd is None or not isinstance(exc, OSError)
                        or exc.errno not in DISK_FULL_ERRNOS or need > self._size):
                    raise
                self._wrap()
                return
        fsync_dir(self.directory)
        self._fd, self._pos, self._size = fd, 0, size
        self._spare_asked = False
        if old_fd is not None:
            os.close(old_fd)
            with self._closed_cond:
                self._closed.append((old_seq, os.path.join(self.directory,
                                                            file_name(old_seq))))
            self._trim.submit(self._trim_closed)

    def _wrap(self) -> None:
        """No room for a new file (the disk is full): make the file system durable behind
        the active file and start it again from its beginning, under the next sequence
        number (its old records no longer count). Commits wait for one ``syncfs``; the
        journal goes on while appends themselves are refused for lack of space."""
        log.warning("WAL journal %s: no room for a new file; syncing the file system and "
                    "reusing the active one", self.directory)
        sync_filesystem(self.root)
        old = os.path.join(self.directory, file_name(self._seq))
        self._seq += 1
        os.rename(old, os.path.join(self.directory, file_name(self._seq)))
        fsync_dir(self.directory)
        self._pos = 0

    # ------------------------------------------------------------------ the trim thread

    def _trim_closed(self) -> None:
        """Every record of the closed files is in its segment file (the writer wrote them
        before the file closed): one ``syncfs`` makes them durable there, and the files
        go (the first recycled as the spare)."""
        with self._closed_cond:
            closed = list(self._closed)
        if not closed:
            return
        try:
            sync_filesystem(self.root)
        except OSError as exc:
            log.error("WAL journal %s: syncfs failed, keeping %d closed files: %r",
                      self.directory, len(closed), exc)
            return
        recycle(self.directory, [path for _, path in closed])
        self.trims += 1
        with self._closed_cond:
            del self._closed[:len(closed)]
            self._closed_cond.notify_all()

    def _prepare_spare(self) -> None:
        """A spare file ready for the next roll (zero-filled once; recycled afterwards)."""
        spare = os.path.join(self.directory, SPARE_NAME)
        if os.path.exists(spare) and os.stat(spare).st_size >= self.file_bytes:
            return
        tmp = spare + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _zero_fill(fd, self.file_bytes)
        finally:
            os.close(fd)
        os.rename(tmp, spare)

    def _close_files(self) -> None:
        if self._spare_job is not None:
            try:
                self._spare_job.result()
            except Exception:  # noqa: BLE001 - a spare is an optimisation
                pass
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        if self._failed is not None:
            return          # kept for the replay at the next start
        write_next_seq(self._lock_fd, self._seq + 1)
        with self._closed_cond:
            self._closed.append((self._seq, os.path.join(self.directory,
                                                         file_name(self._seq))))
        self._trim_closed()


def _deliver(results: list, flush_ms: float) -> None:
    """On the loop: tell each WAL of its group's outcome and how long the commit took,
    and each ``forget`` caller."""
    for commit, pendings, error in results:
        if pendings is None:
            if not commit.done():
                if error is None:
                    commit.set_result(None)
                else:
                    commit.set_exception(JournalFailedError(
                        f"WAL journal failed: {error!r}"))
        else:
            commit.journaled(pendings, error, flush_ms)
