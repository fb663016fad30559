"""A Python child process that a crash test kills with SIGKILL mid-work."""

import os
import signal
import subprocess
import sys
import threading


class KilledChild:
    """``python -P -c code *args``: the installed package (or the caller's PYTHONPATH), never
    the source tree, whose danube/ has no compiled modules. Used as a context manager:
    leaving the block kills the child and closes its pipes; a child that hangs is killed
    after ``watchdog`` seconds, so a hang fails the test instead of blocking it."""

    def __init__(self, code, *args, watchdog=120):
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", code, *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._watchdog = threading.Timer(watchdog, self.proc.kill)
        self._watchdog.start()

    def line(self):
        """The child's next line of output; fails with its stderr if it died."""
        line = self.proc.stdout.readline()
        assert line, f"child died: {self.proc.stderr.read()}"
        return line

    def sigkill(self):
        os.kill(self.proc.pid, signal.SIGKILL)

    @property
    def returncode(self):
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._watchdog.cancel()
        self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
