"""A real HAProxy (Debian's `haproxy`, installed by bin/test) as the ingress of proxy mode,
configured by danube.devcluster.ingress: HTTP/2 on both sides, calls routed on
x-danube-broker-url, calls without it to any live broker."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from danube.devcluster.ingress import haproxy_config
from ports import free_port
from waiting import wait_for


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class HAProxyProcess:
    def __init__(self, workdir, port: int | None = None):
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(binary).exists():
            raise AssertionError("HAProxy is not installed: apt-get install -y haproxy "
                                 "(bash bin/test installs it)")
        self.binary = binary
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.config = self.workdir / "haproxy.cfg"
        self.log = self.workdir / "haproxy.log"
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, broker_urls: list[str]) -> HAProxyProcess:
        self.config.write_text(haproxy_config(f"127.0.0.1:{self.port}", broker_urls))
        # -c first: a configuration HAProxy refuses fails here with its own words.
        check = subprocess.run([self.binary, "-c", "-f", str(self.config)],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([self.binary, "-db", "-f", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.proc.poll() is not None or _accepts(self.port),
                 what="HAProxy listening")
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
