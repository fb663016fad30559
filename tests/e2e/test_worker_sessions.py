"""tests/support/worker_sessions.py, in a pytest session of its own with two workers: each
worker leads a session of its own, and Ctrl-C at the controller (SIGINT to its process group,
as a terminal sends it) still reaches the workers' process groups: their tests and the
processes those started are interrupted, and the tests' clean-up runs."""

import os
import signal
import subprocess
import sys
import textwrap

from waiting import wait_for

SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")

SLEEPY_TESTS = textwrap.dedent("""\
    import os, subprocess, sys, time

    def _run(name):
        out = os.environ["SESSIONS_OUT"]
        # The child says when it sleeps: a Ctrl-C that came while its interpreter was
        # still starting ended it with status 1 (a KeyboardInterrupt in its start-up),
        # not by the signal (beside a CPU hog, once).
        ready = os.path.join(out, f"{name}.child")
        child = subprocess.Popen([sys.executable, "-c",
                                  "import sys, time; open(sys.argv[1], 'w').close(); "
                                  "time.sleep(120)", ready])
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(os.path.join(out, f"{name}.started"), "w") as f:
            f.write(f"{os.getpid()} {os.getsid(0)} {os.getpgrp()} {child.pid}")
        try:
            time.sleep(120)
        finally:
            try:    # a Ctrl-C reaches the child too, if it came to the worker's group
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
            with open(os.path.join(out, f"{name}.cleaned"), "w") as f:
                f.write(str(child.wait()))

    def test_one():
        _run("one")

    def test_two():
        _run("two")
    """)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_lead_their_own_sessions_and_ctrl_c_still_reaches_them(tmp_path):
    (tmp_path / "test_sleepy.py").write_text(SLEEPY_TESTS)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, SESSIONS_OUT=str(out),
               PYTHONPATH=os.pathsep.join([SUPPORT, os.environ.get("PYTHONPATH", "")]))
    # Its own process group, as a terminal's foreground job: the SIGINT below goes to it.
    controller = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "worker_sessions", "-p", "no:cacheprovider",
         "-n", "2", "--dist", "load", "-q", "test_sleepy.py"],
        cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(list(out.glob("*.started"))) == 2, timeout=120,
                 what="both workers' tests started")
        started = [tuple(map(int, p.read_text().split())) for p in out.glob("*.started")]
        for pid, sid, pgrp, _ in started:
            assert sid == pid and pgrp == pid      # a session, and its process group, of its own
            assert sid != controller.pid

        os.killpg(controller.pid, signal.SIGINT)  # what Ctrl-C does
        wait_for(lambda: len(list(out.glob("*.cleaned"))) == 2, timeout=60,
                 what="both tests interrupted and cleaned up")
        # The SIGINT came to each worker's process group, the child included (sent to the
        # worker alone, as execnet does once the controller has gone, the child is killed).
        assert [p.read_text() for p in out.glob("*.cleaned")] == [str(-signal.SIGINT)] * 2
        controller.wait(60)
        for pid, _, _, child in started:
            wait_for(lambda: not _alive(pid) and not _alive(child), timeout=30,
                     what=f"worker {pid} and its child {child} gone")
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()
        output = controller.stdout.read().decode(errors="replace")
        controller.stdout.close()
    assert "KeyboardInterrupt" in output, output
