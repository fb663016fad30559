"""A real Mosquitto broker (Debian's `mosquitto`, installed by bin/test) on a free loopback
port for the MQTT connector's tests: persistence in its directory (a restart keeps the
sessions), and no limit on the messages it holds for a disconnected persistent session (its
default, 1,000, would drop the rest of a stream while a killed connector restarts)."""

import os
import shutil
import socket
import subprocess
import threading
import time

from ports import free_port
from waiting import wait_for


class Mosquitto:
    def __init__(self, tmp_path, port=None, listener_extra="", anonymous=True):
        self.dir = tmp_path
        self.port = port or free_port()
        # Lines for the listener (TLS: certfile, keyfile) and whether anonymous clients
        # are let in (else a password_file among listener_extra's lines).
        self.listener_extra = listener_extra
        self.anonymous = anonymous
        self.proc = None
        self.lines = []

    def start(self):
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not os.path.exists(exe):
            raise RuntimeError("mosquitto is not installed; bin/test installs it (apt)")
        conf = self.dir / "mosquitto.conf"
        # As root, mosquitto would switch to its own user, who cannot write here.
        user = "user root\n" if os.geteuid() == 0 else ""
        anonymous = "true" if self.anonymous else "false"
        conf.write_text(f"listener {self.port} 127.0.0.1\n{self.listener_extra}"
                        f"allow_anonymous {anonymous}\n{user}"
                        f"persistence true\npersistence_location {self.dir}/\n"
                        "autosave_interval 1\nmax_queued_messages 0\n"
                        "max_inflight_messages 0\nlog_dest stdout\nlog_type error\n"
                        "log_type warning\nlog_type notice\n")
        self.proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._pump, daemon=True).start()
        wait_for(self._accepts, 30, what=f"mosquitto listening on {self.port}")
        return self

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def _accepts(self):
        if self.proc.poll() is not None:
            raise RuntimeError("mosquitto exited:\n" + "".join(self.lines))
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.5).close()
            return True
        except OSError:
            return False

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, down_for=0.0):
        self.stop()
        time.sleep(down_for)
        self.start()
