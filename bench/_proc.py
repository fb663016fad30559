"""Child processes and CPU accounting shared by the benchmark runners (Linux /proc)."""

import atexit
import ctypes
import importlib.machinery
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_bench_only = None


def repo_env():
    """The environment for a child that imports bench.* (and danube): PYTHONPATH gets the
    repository root only when danube is not installed (built in place); otherwise the root's
    source tree, which has no compiled modules, would shadow the installed package in
    children that never import bench (a broker started with ``-m danube``), so it gets a
    directory that holds nothing but a link to bench/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_import_root(), env.get("PYTHONPATH")) if p)
    return env


def _import_root():
    global _bench_only
    elsewhere = [p for p in sys.path if os.path.realpath(p or os.curdir) != REPO]
    if importlib.machinery.PathFinder.find_spec("danube", elsewhere) is None:
        return REPO
    if _bench_only is None:
        _bench_only = tempfile.mkdtemp(prefix="danube-bench-path-")
        os.symlink(os.path.join(REPO, "bench"), os.path.join(_bench_only, "bench"))
        atexit.register(shutil.rmtree, _bench_only, True)
    return _bench_only

children = []


def pdeathsig():
    """In the child: get SIGTERM if the benchmark process dies without cleaning up."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort
        pass


def popen(cmd, **kw):
    """Start a child that is stopped by reap_all() and dies with us."""
    p = subprocess.Popen(cmd, preexec_fn=pdeathsig, **kw)
    children.append(p)
    return p


def reap(p, timeout=10.0):
    """Stop a child we started: close its stdin (our workers exit on EOF), then SIGTERM,
    then SIGKILL."""
    try:
        if p.stdin and not p.stdin.closed:
            p.stdin.close()
    except OSError:
        pass
    if p.poll() is None:
        try:
            p.wait(min(timeout, 2.0))
        except subprocess.TimeoutExpired:
            try:
                p.terminate()
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            except ProcessLookupError:
                pass
    if p in children:
        children.remove(p)


def reap_all():
    for p in reversed(list(children)):   # load generators first, the servers last
        try:
            reap(p, 5.0)
        except Exception:  # noqa: BLE001 - cleanup must go on
            pass


def proc_cpu(pid):
    """utime+stime of a whole process (all threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu(pid):
    """utime+stime of a process and its live children (an upload worker), in seconds; 0 for
    a process that is gone."""
    try:
        total = proc_cpu(pid)
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            kids = f.read().split()
    except OSError:
        return 0.0
    return total + sum(tree_cpu(int(k)) for k in kids)


def system_busy():
    """CPU seconds spent busy by the whole machine (all CPUs) since boot, from /proc/stat."""
    with open("/proc/stat", "rb") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    return (sum(vals[:8]) - vals[3] - vals[4]) / CLK_TCK


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class LineWorker:
    """A child process that takes JSON commands on stdin and reports JSON events (one per
    line, {"event": ...}) on stdout; its stderr goes to `log_path`."""

    def _start(self, cmd, *, env, cwd, log_path, label):
        self.label = label
        self.log_path = log_path
        self.stderr = open(log_path, "w")
        self.proc = popen(cmd, cwd=cwd, env=env, text=True, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=self.stderr)
        self.pid = self.proc.pid
        self.lines = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                self.lines.put(line)
            self.lines.put(None)
        threading.Thread(target=pump, daemon=True).start()

    def expect(self, event, timeout):
        """The next event called `event` (earlier other events and stray lines skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(0.01, left))
            except queue.Empty:
                raise RuntimeError(f"{self.label}: no {event!r} within {timeout:.0f}s; "
                                   f"stderr:\n{tail(self.log_path)}") from None
            if line is None:
                raise RuntimeError(f"{self.label} exited (rc={self.proc.wait()}) before "
                                   f"{event!r}; stderr:\n{tail(self.log_path)}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue          # stray output
            if msg.get("event") == event:
                return msg

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def stop(self):
        try:
            if self.proc.poll() is None:
                self.send(cmd="exit")
        except OSError:
            pass
        reap(self.proc, 5.0)
        self.stderr.close()


class start:
    """A child process, its output to a log; ready when ``pattern`` (and ``ready``, if
    given) have appeared in it."""

    def __init__(self, cmd, log_path, pattern, ready=None):
        self.log = open(log_path, "w")
        self.log_path = log_path
        self.proc = popen(cmd, env=repo_env(), cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
        self.match = None
        seen = threading.Event()

        def pump():
            got_ready = ready is None
            for line in self.proc.stdout:
                self.log.write(line)
                self.log.flush()
                self.match = self.match or pattern.search(line)
                got_ready = got_ready or ready in line
                if self.match and got_ready:
                    seen.set()
            seen.set()
        threading.Thread(target=pump, daemon=True).start()
        if not seen.wait(60) or self.match is None or self.proc.poll() is not None:
            raise RuntimeError(f"{cmd[3:6]} did not start; see {log_path}:\n"
                               + tail(log_path))

    def stop(self):
        self.proc.send_signal(2)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
