"""Run the hand-picked mutants of tests/mutation/mutants.py: each one is a copy of the
INSTALLED danube package (the compiled modules included) with one change, put first on
PYTHONPATH for a pytest run of its killing tests (broker subprocesses inherit it). A mutant
is killed when those tests fail; a mutant that survives, or whose change no longer applies
to the code, fails the run.

    bin/mutants            every mutant
    bin/mutants --list     the list
    bin/mutants NAME ...   some of them
    bin/mutants -j 2       two at a time (bin/test's setting)

docs/testing.md lists them with their killing tests."""

import argparse
import concurrent.futures
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import danube

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants import MUTANTS  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED = os.path.dirname(os.path.abspath(danube.__file__))


def apply(mutant, scratch):
    """Copy the installed package under `scratch` and make the mutant's change there."""
    target = os.path.join(scratch, "danube")
    # With the installed bytecode: each process of a mutant's tests (pytest, the brokers it
    # starts) compiled the whole package again otherwise. copytree keeps the sources'
    # modification times, which the bytecode is checked against; the changed module's own
    # bytecode goes, so that it is compiled from the change.
    shutil.copytree(INSTALLED, target)
    path = os.path.join(target, mutant.file)
    folder, name = os.path.split(path)
    stem = name[:-3] + "."
    for cached in glob.glob(os.path.join(folder, "__pycache__", glob.escape(stem) + "*.pyc")):
        os.remove(cached)
    with open(path) as f:
        text = f.read()
    count = text.count(mutant.original)
    if count != 1:
        raise SystemExit(f"mutant {mutant.name}: the line to change occurs {count} times in "
                         f"danube/{mutant.file} (the code moved: update tests/mutation/mutants.py)")
    with open(path, "w") as f:
        f.write(text.replace(mutant.original, mutant.replacement))
    return path


def run(mutant, verbose):
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        path = apply(mutant, scratch)
        # Run from the suite (test_mutants.py), the killing tests' pytest is a session of its
        # own, not a part of the xdist worker's.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
        env.update(PYTHONPATH=scratch + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONDONTWRITEBYTECODE="1")
        # The mutated module must be the one imported, or the run proves nothing.
        module = "danube." + mutant.file[:-3].replace("/", ".")
        where = subprocess.run(
            [sys.executable, "-P", "-c", f"import {module} as m; print(m.__file__)"],
            env=env, capture_output=True, text=True, cwd=scratch)
        if os.path.realpath(where.stdout.strip()) != os.path.realpath(path):
            raise SystemExit(f"mutant {mutant.name}: {module} is imported from "
                             f"{where.stdout.strip() or where.stderr}, not the scratch copy")
        started = time.monotonic()
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "pytest"), *mutant.tests,
             "-x", "-q", "-p", "no:cacheprovider", "--benchmark-disable", "-n", "0"],
            env=env, cwd=REPO, capture_output=not verbose, text=True)
        took = time.monotonic() - started
    # 1: tests failed (killed). 0: survived. Anything else (no tests, a usage or collection
    # error) proves nothing either way.
    if proc.returncode not in (0, 1):
        raise SystemExit(f"mutant {mutant.name}: pytest exited {proc.returncode}:\n"
                         f"{proc.stdout[-3000:] if proc.stdout else ''}")
    return proc.returncode == 1, took


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once")
    args = parser.parse_args()
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutants {unknown}; --list shows them")
    chosen = [known[n] for n in args.names] or MUTANTS
    if args.list:
        for m in chosen:
            print(f"{m.name}: danube/{m.file}: {m.what}\n    killed by {' '.join(m.tests)}")
        return 0
    survivors = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {pool.submit(run, m, args.verbose): m for m in chosen}
        for future in concurrent.futures.as_completed(futures):
            m = futures[future]
            killed, took = future.result()
            print(f"{'killed  ' if killed else 'SURVIVED'} {m.name} ({took:.0f} s): {m.what}",
                  flush=True)
            if not killed:
                survivors.append(m.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants killed")
    if survivors:
        print(f"survived: {' '.join(survivors)}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
