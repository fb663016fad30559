"""A real Prometheus (Debian `prometheus`, installed by bin/test) on a free 127.0.0.1 port,
scraping a broker's exporter every second, for the /ui/v1 API's and the MCP metrics tools'
--prometheus-url. Each target carries a `broker` label with the broker's ID, as upstream's
brokers put on every series (their registry's global label). Stopped at teardown, and at
interpreter exit should a run be cut short."""

import atexit
import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

from ports import free_port
from waiting import wait_for

INSTALL_HINT = "prometheus is not installed: run `bash bin/test` (it installs Debian prometheus)"
_live = set()


@atexit.register
def _kill_leftovers():
    for p in list(_live):
        p.stop()


class PrometheusProcess:
    def __init__(self, workdir, targets):
        """``targets``: {"HOST:PORT" of an exporter: broker ID}."""
        self.binary = shutil.which("prometheus")
        if self.binary is None:
            raise RuntimeError(INSTALL_HINT)
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets = targets
        self.proc = None

    def start(self, timeout=60):
        config = self.workdir / "prometheus.yml"
        lines = ["global:", "  scrape_interval: 1s", "  evaluation_interval: 1s",
                 "scrape_configs:", "  - job_name: danube", "    static_configs:"]
        for addr, broker_id in self.targets.items():
            lines += [f"      - targets: [\"{addr}\"]", "        labels:",
                      f"          broker: \"{broker_id}\""]
        config.write_text("\n".join(lines) + "\n")
        self.log = open(self.workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={config}",
             f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        _live.add(self)
        wait_for(lambda: self._ready() or self.proc.poll() is not None, timeout=timeout,
                 what="prometheus ready")
        if self.proc.poll() is not None:
            raise RuntimeError("prometheus exited:\n" +
                               (self.workdir / "prometheus.log").read_text())
        return self

    def _ready(self):
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def query(self, promql):
        """The instant query's result list."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)["data"]["result"]

    def value(self, promql):
        """The sum of the query's samples (0 when none)."""
        return sum(float(s["value"][1]) for s in self.query(promql))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _live.discard(self)
        if getattr(self, "log", None):
            self.log.close()
