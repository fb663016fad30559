"""Run scenarios with the OFFICIAL Python client (`danube-client` 0.5.0) against our broker.

The official client's import name, `danube`, clashes with ours, so it lives in a separate
virtualenv (env var DANUBE_OFFICIAL_PYTHON, default <repo>/.venv-official/bin/python) and every
scenario runs in a subprocess of that interpreter:

* isolated mode (`-I`), no PYTHON* variables in the environment, and a temporary working
  directory, so our own `danube` package can never shadow the official one (the runner also
  checks where `danube` was imported from);
* the scenario is a Python file under tests/support/official_scripts/ (give its file name) or a source
  string; it defines `async def main(args)` and returns something JSON-serialisable. It may use
  the helpers of tests/support/official_scripts/_lib.py (`from _lib import ...`);
* `args` is passed as JSON; the runner prints the JSON result as the last stdout line;
* every subprocess has a timeout; failures raise OfficialClientError with stdout and stderr.

    from official_client import run_scenario
    result = run_scenario("produce_consume.py", {"url": broker_url, "topic": t, ...})
"""

import json
import os
import subprocess
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(TESTS))
SCRIPTS = os.path.join(TESTS, "official_scripts")
RUNNER = os.path.join(SCRIPTS, "_runner.py")
OFFICIAL_PYTHON = os.environ.get(
    "DANUBE_OFFICIAL_PYTHON", os.path.join(REPO, ".venv-official", "bin", "python"))


class OfficialClientError(AssertionError):
    """The scenario failed, timed out, or printed no JSON result."""


def official_python():
    """The official client's interpreter; fails the test (CI always provides it)."""
    if not os.path.exists(OFFICIAL_PYTHON):
        pytest.fail(
            f"official client interpreter {OFFICIAL_PYTHON} not found: create it with "
            "`python3 -m venv .venv-official && .venv-official/bin/pip install "
            "danube-client==0.5.0`, or point DANUBE_OFFICIAL_PYTHON at a python that has "
            "danube-client installed", pytrace=False)
    return OFFICIAL_PYTHON


def broker_url(broker):
    """The service URL the official client wants for a BrokerProcess."""
    return f"http://{broker.client_addr}"


def run_scenario(script, args=None, timeout=60):
    """Run `script` (a file name under tests/support/official_scripts/, or Python source defining
    `async def main(args)`) with the official client; return its parsed JSON result."""
    python = official_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with tempfile.TemporaryDirectory(prefix="danube-official-") as cwd:
        path = os.path.join(SCRIPTS, script)
        if not (script.endswith(".py") and "\n" not in script and os.path.isfile(path)):
            path = os.path.join(cwd, "scenario.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(script)
        cmd = [python, "-I", RUNNER, path, json.dumps(args or {}), str(timeout)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                                  timeout=timeout + 15)
        except subprocess.TimeoutExpired as exc:
            raise OfficialClientError(
                f"official-client scenario {script[:60]!r} timed out after {timeout + 15}s\n"
                f"--- stdout ---\n{_text(exc.stdout)}\n--- stderr ---\n{_text(exc.stderr)}"
            ) from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise OfficialClientError(
            f"official-client scenario {script[:60]!r} failed (rc={proc.returncode})\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise OfficialClientError(
            f"official-client scenario {script[:60]!r} printed no JSON result\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}") from None


def _text(data):
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


# -- shared by the tests/test_e2e_*.py modules -------------------------------------------

def start_broker(data_dir, *args):
    """A BrokerProcess on ports chosen by the OS (it advertises the ports it bound)."""
    from broker_process import BrokerProcess
    return BrokerProcess(*args, data_dir=data_dir).start()


def unique_topic(prefix, namespace="default"):
    import uuid
    return f"/{namespace}/{prefix}-{uuid.uuid4().hex[:12]}"


class SpawnedScenario:
    """An official-client scenario running in the background (see spawn_scenario): its
    stdout lines are collected as they come, so a test can wait for a progress line the
    scenario prints (with flush=True) and act on the process meanwhile (signals)."""

    def __init__(self, proc, cwd):
        import collections
        import threading
        self.proc = proc
        self._cwd = cwd
        self.lines = []
        # stderr is drained as it comes (its last lines kept): a client that logs a lot
        # (the official consumer logs every failed stream) would otherwise fill the pipe
        # and block.
        self.stderr_lines = collections.deque(maxlen=2000)
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._pump_stderr, daemon=True)
        self._err_reader.start()

    def _pump_stderr(self):
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    @property
    def stderr(self):
        return "\n".join(self.stderr_lines)

    def _pump(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append(None)          # end of output
            self._cond.notify_all()

    def wait_line(self, prefix, timeout=10.0):
        """The first stdout line starting with `prefix`; OfficialClientError on timeout or
        if the scenario ended first."""
        import time
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line is not None and line.startswith(prefix):
                        return line
                if None in self.lines:
                    raise OfficialClientError(
                        f"scenario ended without printing {prefix!r}:\n" +
                        "\n".join(x for x in self.lines if x is not None) +
                        f"\n--- stderr ---\n{self.stderr}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OfficialClientError(f"no {prefix!r} line within {timeout}s: "
                                              f"{self.lines}")
                self._cond.wait(left)

    def kill(self):
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._cwd.cleanup()


def spawn_scenario(script, args=None, timeout=60):
    """Start `script` (as for run_scenario) in the background; returns a SpawnedScenario.
    The caller must kill() it."""
    python = official_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    cwd = tempfile.TemporaryDirectory(prefix="danube-official-")
    path = os.path.join(SCRIPTS, script)
    cmd = [python, "-I", "-u", RUNNER, path, json.dumps(args or {}), str(timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd.name)
    return SpawnedScenario(proc, cwd)
