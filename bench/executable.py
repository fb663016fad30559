"""Start-up of the single executable against the virtualenv's entry point, and its size.

    .venv/bin/python -m bench.executable --exe dist/danube [--runs 5]
    .venv/bin/python -m bench.executable --build      # builds it first (PyInstaller, ~3 min)

For each: `--version` (process start to exit) and `broker` (process start to the "broker
ready" line, fresh data directory each run), median and best of --runs. The one-file
executable unpacks itself into a temporary directory at every start, which is most of its
cost; the virtualenv's entry point imports from installed files.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench._proc import REPO
from bench.e2e.common import format_table

BARE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", help="a built danube executable")
    ap.add_argument("--build", action="store_true", help="build one with PyInstaller first")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="danube-exe-")
    try:
        exe = args.exe or (build(work) if args.build else None)
        if exe is None:
            ap.error("give --exe PATH or --build")
        run(os.path.abspath(exe), args.runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(work):
    print("building with PyInstaller (a few minutes) ...", flush=True)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "pyinstaller"),
                    "--noconfirm", "--distpath", os.path.join(work, "dist"), "--workpath",
                    os.path.join(work, "build"), os.path.join(REPO, "packaging", "danube.spec")],
                   check=True, capture_output=True)
    return os.path.join(work, "dist", "danube")


def timed_version(cmd, env):
    t = time.perf_counter()
    subprocess.run([*cmd, "--version"], check=True, capture_output=True, env=env)
    return time.perf_counter() - t


def timed_broker(cmd, env, work, i):
    data = os.path.join(work, f"data-{i}")
    t = time.perf_counter()
    proc = subprocess.Popen([*cmd, "broker", "--mode", "standalone", "--data-dir", data,
                             "--broker-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in proc.stdout:
            if "broker ready" in line:
                return time.perf_counter() - t
        raise RuntimeError("the broker exited before it was ready")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def run(exe, runs, work):
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    peers = {"single executable": ([exe], BARE_ENV),
             "virtualenv (python -m danube)": ([sys.executable, "-P", "-m", "danube"],
                                               dict(os.environ))}
    rows = []
    for name, (cmd, env) in peers.items():
        version = [timed_version(cmd, env) for _ in range(runs)]
        ready = [timed_broker(cmd, env, work, i) for i in range(runs)]
        rows.append([name, f"{statistics.median(version):.2f} / {min(version):.2f}",
                     f"{statistics.median(ready):.2f} / {min(ready):.2f}"])
    print()
    print(format_table(["", "--version s (median / best)", "broker ready s (median / best)"],
                       rows))
    print(f"\nsize of {exe}: {os.path.getsize(exe) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
