"""Each pytest-xdist worker in a session of its own, so that the suite shares a loaded machine
like the six jobs it is, not like one.

Linux's autogroup scheduling (CONFIG_SCHED_AUTOGROUP, on in Debian's kernels) shares the CPU
among sessions first and among a session's processes second. One busy process started from
another shell is a session of its own: beside it the whole suite, one session, kept ~1.4 of the
2 cores (a run took 678 s instead of ~480 s). As sessions of their own, the workers get each
session's share, as they would with autogroup off.

Two things a worker outside the terminal's session no longer gets are handed on by the
controller: Ctrl-C (SIGINT goes to the terminal's foreground process group only), sent on to
each worker's process group, its brokers included, as the terminal would; and the end of the
controller, which execnet already turns into a SIGINT in the worker (its stdin closes)."""

import os
import signal


def _worker_pids():
    """The controller's children that lead a process group of their own: its workers."""
    me = str(os.getpid())
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:     # gone meanwhile
            continue
        # fields after the name: state, ppid, pgrp, session, ...
        if fields[1] == me and fields[2] == entry:
            pids.append(int(entry))
    return pids


def _forward_interrupt(previous):
    def handler(signum, frame):
        for pid in _worker_pids():
            try:
                os.killpg(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt
    return handler


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        if os.getpgrp() != os.getpid():     # a group leader cannot start a session
            os.setsid()
    elif config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        signal.signal(signal.SIGINT, _forward_interrupt(signal.getsignal(signal.SIGINT)))
