"""Child processes and CPU accounting shared by the benchmark runners (Linux /proc)."""

import ctypes
import os
import signal
import subprocess

CLK_TCK = os.sysconf("SC_CLK_TCK")

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


def system_busy():
    """CPU seconds spent busy by the whole machine (all CPUs) since boot, from /proc/stat."""
    with open("/proc/stat", "rb") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    return (sum(vals[:8]) - vals[3] - vals[4]) / CLK_TCK
