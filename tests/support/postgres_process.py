"""A real PostgreSQL server (Debian's `postgresql`, installed by bin/test) in its own
directory on a free loopback port, for the PostgreSQL connectors' tests: ``wal_level =
logical`` (change data capture needs it), trust authentication for the superuser
``postgres``, stopped fast (SIGINT), immediately (SIGQUIT: a crash, recovery at the next
start) or killed.

initdb and postgres refuse to run as root: as root the server runs as the system user
``postgres`` (the Debian package creates it), in a directory of its own under /tmp (pytest's
tmp_path is private to root)."""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading

import pytest

from ports import free_port
from waiting import wait_for


def _bin(name):
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    exe = shutil.which(name)
    if exe is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed; bin/test installs it "
                           f"(apt: postgresql)")
    return exe


class Postgres:
    def __init__(self, port=None, settings=None):
        self.port = port or free_port()
        self.settings = {"wal_level": "logical", "max_replication_slots": "10",
                         "max_wal_senders": "10", "fsync": "on",
                         "shared_buffers": "32MB", **(settings or {})}
        self.as_user = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            self.as_user = (entry.pw_uid, entry.pw_gid)
        self.dir = tempfile.mkdtemp(prefix="danube-pg-")
        self.data = os.path.join(self.dir, "data")
        if self.as_user:
            os.chown(self.dir, *self.as_user)
        self.proc = None
        self.lines = []
        self._initdb()

    @property
    def url(self):
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run_as(self):
        if self.as_user is None:
            return {}
        return {"user": self.as_user[0], "group": self.as_user[1], "extra_groups": []}

    def _initdb(self):
        subprocess.run([_bin("initdb"), "-D", self.data, "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync", "--locale=C"], check=True,
                       capture_output=True, cwd=self.dir, **self._run_as())

    def start(self, timeout=60):
        args = [_bin("postgres"), "-D", self.data, "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}"]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        self.lines = []
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=self.dir, **self._run_as())
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        wait_for(self._ready, timeout, what=f"PostgreSQL ready on {self.port}")
        return self

    def _pump(self, proc):
        for line in proc.stdout:
            self.lines.append(line)

    def _ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError("postgres exited:\n" + "".join(self.lines))
        done = subprocess.run([_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(self.port),
                               "-U", "postgres", "-t", "1"], capture_output=True)
        return done.returncode == 0

    def stop(self, how=signal.SIGINT, timeout=60):
        """SIGINT: a fast shutdown (checkpoint, slots saved); SIGQUIT: immediate (a crash:
        recovery at the next start)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(how)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, how=signal.SIGINT):
        self.stop(how)
        return self.start()

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self):
        return "".join(self.lines)


@pytest.fixture(scope="module")
def pg():
    """A PostgreSQL for the test module (import the fixture: ``from postgres_process import
    pg``)."""
    p = Postgres().start()
    yield p
    p.close()


def sql(pg, *statements):
    """Run ``statements`` in autocommit mode."""
    import psycopg
    with psycopg.connect(pg.url, autocommit=True) as c:
        for s in statements:
            c.execute(s)
