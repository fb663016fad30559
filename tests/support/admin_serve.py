"""`danube admin serve` as a subprocess for tests: the HTTP side (web console and /ui/v1 API)
on a free port, found from the line it prints, and a clean stop with Ctrl-C."""

import json
import queue
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

LISTENING = re.compile(r"listening on (http://\S+/)")


class AdminServe:
    def __init__(self, *args, startup_timeout=30):
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "danube", "admin", "serve", "--listen", "127.0.0.1:0",
             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = None
        while self.url is None:
            try:
                line = self.lines.get(timeout=startup_timeout)
            except queue.Empty:
                break
            if line is None:
                break
            m = LISTENING.search(line)
            if m:
                self.url = m.group(1).rstrip("/")
        if self.url is None:
            self.stop()
            raise RuntimeError("admin serve did not start:\n" + "".join(self.seen))

    def _pump(self):
        for line in self.proc.stdout:
            self.seen.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, headers, parsed JSON or text) of one HTTP request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None
                                            else None)
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, rh, text = r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as exc:
            status, rh, text = exc.code, exc.headers, exc.read().decode()
        try:
            return status, rh, json.loads(text)
        except ValueError:
            return status, rh, text

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body=body, **kw)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                return self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode
