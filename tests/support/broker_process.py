"""Run the real `danube broker` process for tests: free ports, readiness from its log, and a
clean stop."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

READY = re.compile(r"broker ready")
# Set to the path of a built `danube` executable to run every BrokerProcess from it.
EXECUTABLE_ENV = "DANUBE_TEST_EXECUTABLE"
LISTEN = re.compile(r"(client|admin) gRPC .* listening on ([\d.]+):(\d+)")
PROM = re.compile(r"prometheus exporter listening on http://([\d.]+):(\d+)")


class BrokerProcess:
    def __init__(self, *args, data_dir, env=None):
        self.data_dir = data_dir
        self.args = ["--mode", "standalone", "--data-dir", str(data_dir),
                     "--broker-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", *args]
        self.env = env
        # -P: the working directory (the repo, whose danube/ has no compiled modules) must
        # not shadow the installed package.
        self.command = [sys.executable, "-P", "-m", "danube", "broker"]
        exe = os.environ.get(EXECUTABLE_ENV)
        if exe:
            # The single executable's test runs the attack suites against it this way.
            self.command = [exe, "broker"]
        self.proc = None
        self._pumper = None
        self.lines = []
        self.client_port = self.admin_port = self.prom_port = None
        self._ready = threading.Event()

    def start(self, timeout=30):
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(
            [*self.command, *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self._pumper = threading.Thread(target=self._pump, daemon=True)
        self._pumper.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError("broker did not become ready:\n" + "".join(self.lines))
        if self.proc.poll() is not None or not READY.search("".join(self.lines)):
            # The output ended without "broker ready": it exited (perhaps not reaped yet).
            self.proc.wait(10)
            raise RuntimeError("broker exited:\n" + "".join(self.lines))
        return self

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = LISTEN.search(line)
            if m:
                setattr(self, f"{m.group(1)}_port", int(m.group(3)))
            m = PROM.search(line)
            if m:
                self.prom_port = int(m.group(2))
            if READY.search(line):
                self._ready.set()
        self._ready.set()

    @property
    def pid(self):
        """The pid of the process serving: the one-file executable's bootloader runs the
        broker as its child, and /proc figures (memory, descriptors) are the child's."""
        if not os.environ.get(EXECUTABLE_ENV):
            return self.proc.pid
        path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        with open(path) as f:
            children = f.read().split()
        return int(children[0]) if children else self.proc.pid

    @property
    def client_addr(self):
        return f"127.0.0.1:{self.client_port}"

    @property
    def admin_addr(self):
        return f"127.0.0.1:{self.admin_port}"

    def log(self):
        return "".join(self.lines)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        # The broker's own budget on SIGTERM: up to 30 s to upload what the durable tier
        # lacks (SHUTDOWN_UPLOAD_TIMEOUT), then 10 s for RPCs in flight. A loaded machine has
        # taken over 20 s for a tiered broker's last uploads.
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        # The process's last lines may still be in the pipe: read them before the caller
        # looks at the log.
        if self._pumper is not None:
            self._pumper.join(timeout)
        return code

    def wait_for_log(self, pattern, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if re.search(pattern, self.log()):
                return True
            time.sleep(0.05)
        return False
