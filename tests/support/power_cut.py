"""A power cut, simulated: what a process made durable under one directory survives, the rest
of what it wrote is dropped, as it would be if the machine lost power (a SIGKILL alone keeps
the page cache, so it cannot tell a missing fsync from a present one).

The process runs with the shim power_cut/synclog.c in LD_PRELOAD. After each successful
fsync/fdatasync under the directory the shim keeps a copy of what that sync made durable: a
file's whole content, or a directory's entries (name -> inode). `PowerCut.cut()`, called
after the process was killed, rebuilds the directory from those copies, with the POSIX rules
and nothing kinder:

* a file's content is what its last sync saw; a file never synced since the baseline is
  as it was then, or empty if it is new;
* a directory's entries are those of its last sync: a file created, renamed or removed
  after it is not there, not renamed, still there. A directory never synced since the
  baseline keeps the baseline's entries (none if it is new).

The baseline is the directory as it was when `arm()` was called (every file then is on disk
already: the test made it, or it is what the previous cut left). Files are followed by inode;
an inode freed and reused by a new file within one run would be mistaken for the old one (the
tests' files are few and a reuse would only make a lost file look kept, never the reverse).
A successful syncfs() (the WAL journal's trim) makes the whole directory, as it was when the
call was made, durable. Not modelled, because the product uses none of them: sync(),
O_SYNC/O_DSYNC.
"""

import os
import shutil
import subprocess
import tempfile
import threading

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "power_cut", "synclog.c")
_built = {}
_build_lock = threading.Lock()


def shim_library():
    """Build synclog.so once per test process (each pytest-xdist worker its own copy)."""
    with _build_lock:
        if "path" not in _built:
            out = os.path.join(tempfile.mkdtemp(prefix="synclog-"), "synclog.so")
            subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", SOURCE,
                            "-o", out, "-ldl", "-lpthread"], check=True,
                           capture_output=True, text=True)
            _built["path"] = out
        return _built["path"]


class SyncRecord:
    __slots__ = ("kind", "copy", "ino", "size", "started", "returned", "path")

    def __init__(self, line, shadow):
        kind, seq, ino, size, t0, t1, path = line.rstrip("\n").split(" ", 6)
        self.kind = kind
        self.copy = os.path.join(shadow, seq)
        self.ino, self.size = int(ino), int(size)
        self.started, self.returned = int(t0) / 1e9, int(t1) / 1e9   # time.monotonic()
        self.path = path


class PowerCut:
    def __init__(self, directory, work):
        """`directory`: what the process under test writes (its data dir); `work`: a
        scratch directory of the test's for the copies."""
        self.root = os.path.realpath(directory)
        self.work = str(work)
        self.round = 0
        self.shadow = None
        os.makedirs(self.root, exist_ok=True)

    def arm(self):
        """Take the baseline and start a fresh record; returns the environment the process
        under test must be started with."""
        self.round += 1
        self.shadow = os.path.join(self.work, f"round-{self.round}")
        os.makedirs(self.shadow)
        self.base_files, self.base_dirs = {}, {}
        base = os.path.join(self.shadow, "baseline")
        os.makedirs(base)
        for dirpath, dirnames, filenames in os.walk(self.root):
            entries = []
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                kind = "d" if name in dirnames else "f"
                entries.append((kind, st.st_ino, name))
                if kind == "f":
                    copy = os.path.join(base, str(st.st_ino))
                    shutil.copyfile(os.path.join(dirpath, name), copy)
                    self.base_files[st.st_ino] = copy
            self.base_dirs[os.lstat(dirpath).st_ino] = entries
        return {"LD_PRELOAD": shim_library(), "SYNCLOG_ROOT": self.root,
                "SYNCLOG_SHADOW": self.shadow}

    def records(self):
        """Every sync the shim recorded since arm(), in the order they returned."""
        try:
            with open(os.path.join(self.shadow, "log")) as f:
                # A line still being written (the process is alive) is left for later.
                return [SyncRecord(line, self.shadow) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def cut(self, before=None):
        """Rebuild the directory as the power cut leaves it (the process must be dead);
        returns the sync records of the round. ``before`` (a ``time.monotonic()``): the cut
        came then, so a sync that returned later made nothing durable, however soon after it
        the process was killed."""
        records = self.records()
        if before is not None:
            records = [r for r in records if r.returned < before]
        files, dirs = dict(self.base_files), dict(self.base_dirs)
        for r in records:
            if r.kind == "F":
                files[r.ino] = r.copy
            else:
                with open(r.copy) as f:
                    dirs[r.ino] = [(k, int(i), n) for k, i, n in
                                   (line.rstrip("\n").split(" ", 2) for line in f)]
        new = os.path.join(self.shadow, "after-cut")
        os.makedirs(new)
        self._build(new, os.lstat(self.root).st_ino, files, dirs, set())
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        for name in os.listdir(new):
            os.rename(os.path.join(new, name), os.path.join(self.root, name))
        return records

    def _build(self, target, ino, files, dirs, seen):
        if ino in seen:         # a directory reached twice would be a model error
            raise AssertionError(f"directory inode {ino} reached twice")
        seen.add(ino)
        for kind, child, name in dirs.get(ino, []):
            path = os.path.join(target, name)
            if kind == "d":
                os.mkdir(path)
                self._build(path, child, files, dirs, seen)
            elif child in files:
                shutil.copyfile(files[child], path)
            else:
                open(path, "wb").close()
