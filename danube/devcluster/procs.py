"""Processes of a local cluster: started detached (their own session, output to a log
file), found again by pid from the state file, stopped with a signal and a deadline."""

from __future__ import annotations

import functools
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


@functools.cache
def _candidate_ports() -> tuple[int, ...]:
    # Built once: the test servers pick hundreds of ports a run, and the list took ~1 ms.
    low, high = _ephemeral_range()
    return tuple(p for p in range(20000, 65000) if not low <= p <= high)


def free_port() -> int:
    """A port nothing listens on, outside the range the system takes outgoing connections'
    ports from: a port from that range (what binding port 0 gives) can be taken by any
    client's connection meanwhile, and a broker restarted on it (`danube cluster roll`)
    would then fail with "address already in use"."""
    candidates = _candidate_ports()
    for _ in range(200):
        port = random.choice(candidates)
        if not port_busy(port):
            return port
    raise OSError("no free port found outside the ephemeral range")


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def spawn(cmd: list[str], log: Path, env: dict | None = None) -> int:
    """Start ``cmd`` in a session of its own (it outlives this command, and a Ctrl-C in
    the terminal does not reach it), its output appended to ``log``; returns its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, **(env or {})))
    return proc.pid


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        # A child of this command that exited is a zombie until reaped: not alive.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def stop(pid: int, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Send ``sig`` and wait up to ``timeout`` s for the process to end; SIGKILL after
    that. Returns whether it ended by ``sig``."""
    if not alive(pid):
        return True
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    while alive(pid):
        time.sleep(0.05)
    return False


def log_tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""
