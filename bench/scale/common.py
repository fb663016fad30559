"""What every section of bench.scale shares: a standalone broker of a given interpreter (ours
or --baseline-python's) on ports of its own that survive a restart, and what /proc and the
data directory say about it."""

import os
import re
import signal
import subprocess
import time

from bench._proc import popen, proc_cpu, reap, repo_env, tail
from danube.devcluster.procs import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def disk_bytes(path):
    """(allocated, apparent) bytes under `path`, as `du -s` counts them: preallocated but
    unwritten space shows in the first only."""
    def du(*flags):
        out = subprocess.run(["du", "-s", "--block-size=1", *flags, path], check=True,
                             capture_output=True, text=True).stdout
        return int(out.split()[0])
    return du(), du("--apparent-size")


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def disk_free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Broker:
    """`PYTHON -P -m danube broker --mode standalone` with a data directory and ports that
    stay the same across stop()/start(), so a restarted broker is found where it was."""

    def __init__(self, python, workdir, name, config=None):
        self.python = python
        self.name = name
        self.data = os.path.join(workdir, f"data-{name}")
        self.port = free_port()
        self.admin_port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.config_path = None
        if config:
            self.config_path = os.path.join(workdir, f"{name}.yml")
            with open(self.config_path, "w") as f:
                f.write(config)
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc = None
        self.starts = 0

    @property
    def pid(self):
        return self.proc.pid

    def launch(self):
        """Start the process and return at once (see wait_ready)."""
        self.starts += 1
        log = open(self.log_path, "a")
        log.write(f"\n---- start {self.starts} ----\n")
        log.flush()
        cmd = [self.python, "-P", "-m", "danube", "broker", "--mode", "standalone",
               "--data-dir", self.data, "--broker-addr", self.addr,
               "--admin-addr", f"127.0.0.1:{self.admin_port}"]
        if self.config_path:
            cmd += ["--config-file", self.config_path]
        self.proc = popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=repo_env(), cwd=REPO)
        log.close()

    def wait_ready(self, timeout=120):
        """Wait for this start's "broker ready" line."""
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, errors="replace") as f:
                text = f.read().rsplit(f"---- start {self.starts} ----", 1)[-1]
            if "broker ready" in text:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"broker {self.name} did not start; {self.log_path}:\n"
                                   + tail(self.log_path))
            time.sleep(0.05)

    def start(self):
        self.launch()
        self.wait_ready()
        return self

    def cpu(self):
        return proc_cpu(self.proc.pid)

    def rss_kib(self):
        return rss_kib(self.proc.pid)

    def fds(self):
        return fd_count(self.proc.pid)

    def terminate(self, timeout=60.0):
        """SIGTERM; the seconds until the process exited, or None if it had not within
        `timeout` (then it is killed)."""
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            took = time.perf_counter() - t0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            took = None
        reap(self.proc, 1.0)
        return took

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.terminate(30.0)
