"""Long fuzz runs of the targets in tests/support/fuzz_targets.py.

    .venv/bin/python -P tests/fuzz/run.py TARGET [--runs N] [--seconds S]
                     [--engine atheris|mutate] [--crashes DIR] [--seed N]
    .venv/bin/python -P tests/fuzz/run.py TARGET --replay FILE...
    .venv/bin/python -P tests/fuzz/run.py --list

--engine atheris (the default when atheris is installed: pip install '.[fuzz]') runs the
target coverage-guided under libFuzzer, with the target's seeds as the starting corpus;
--engine mutate (the default otherwise) runs the built-in mutation engine of
tests/support/fuzz_mutate.py over the seeds and random bytes. Either way the run prints its
progress (executions, executions per second, findings), saves every finding's input in
--crashes (default fuzz-crashes/) with its traceback beside it, and goes on; it ends after
--runs inputs or --seconds, whichever comes first, and exits 1 if anything was found.
A single input that runs for more than --timeout seconds is a hang: it is saved as one and
the run stops there (exit 3).

atheris runs in a child process: libFuzzer ends the process with exit(), so the parent is
what takes down the temporary files and the broker process a target may have started.
"""

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))

from fuzz_mutate import mutate  # noqa: E402

CHILD_ENV = "DANUBE_FUZZ_ATHERIS_CHILD"
# What atheris instruments for coverage: the project's Python and the HPACK library (the
# compiled Cython modules are opaque to it; instrumenting everything loaded would take
# minutes to start).
INSTRUMENT = ["danube", "hpack", "fuzz_codecs", "fuzz_server", "fuzz_wal", "fuzz_broker"]
if os.environ.get(CHILD_ENV):
    import atheris

    with atheris.instrument_imports(include=INSTRUMENT):
        from fuzz_targets import TARGETS
else:
    from fuzz_targets import TARGETS
PROGRESS_EVERY = 5.0


def _have_atheris():
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


class Findings:
    """Saves what a target raised on, and counts it."""

    def __init__(self, directory, target):
        self.directory = directory
        self.target = target
        self.count = 0
        self.kinds = {}
        os.makedirs(directory, exist_ok=True)

    def save(self, data, exc, kind="crash"):
        self.count += 1
        digest = hashlib.sha1(data).hexdigest()[:16]
        path = os.path.join(self.directory, f"{self.target}-{kind}-{digest}")
        with open(path + ".bin", "wb") as f:
            f.write(data)
        text = "".join(traceback.format_exception(exc)) if exc is not None else kind
        with open(path + ".txt", "w") as f:
            f.write(text)
        summary = f"{type(exc).__name__}: {str(exc)[:160]}" if exc is not None else kind
        if summary not in self.kinds:
            self.kinds[summary] = path
            print(f"FINDING {summary}\n  saved as {path}.bin", flush=True)
        return path


class Progress:
    def __init__(self, name):
        self.name = name
        self.start = self.last = time.monotonic()
        self.execs = 0

    def tick(self, findings, force=False):
        self.execs += 1
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY:
            self.last = now
            elapsed = now - self.start
            print(f"[{self.name}] {self.execs} execs in {elapsed:.0f} s, "
                  f"{self.execs / max(elapsed, 1e-9):.0f} execs/s, {findings.count} findings",
                  flush=True)


class Watchdog(threading.Thread):
    """Stops the run on an input that does not return (a hang is a finding too)."""

    def __init__(self, timeout, findings):
        super().__init__(daemon=True)
        self.timeout = timeout
        self.findings = findings
        self.current = None
        self.started = None

    def enter(self, data):
        self.current, self.started = data, time.monotonic()

    def leave(self):
        self.started = None

    def run(self):
        while True:
            time.sleep(1.0)
            started = self.started
            if started is not None and time.monotonic() - started > self.timeout:
                path = self.findings.save(self.current, None, "hang")
                print(f"HANG: an input ran for more than {self.timeout} s; saved as {path}.bin",
                      flush=True)
                os._exit(3)


def run_mutate(target, seeds, spec, args, findings):
    rnd = random.Random(args.seed)
    progress = Progress(spec.name)
    watchdog = Watchdog(args.timeout, findings)
    watchdog.start()
    deadline = time.monotonic() + args.seconds if args.seconds else None
    inputs = iter(seeds)
    while args.runs is None or progress.execs < args.runs:
        if deadline is not None and time.monotonic() >= deadline:
            break
        data = next(inputs, None)
        if data is None:
            if rnd.random() < 0.1:
                data = rnd.randbytes(rnd.randrange(min(spec.max_len, 1024)))
            else:
                data = mutate(rnd.choice(seeds), rnd, seeds, max_size=spec.max_len)
        watchdog.enter(data)
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - every escape is a finding
            findings.save(data, exc)
        watchdog.leave()
        progress.tick(findings)
    progress.tick(findings, force=True)


def run_atheris_child(target, seeds, spec, args, findings):
    progress = Progress(spec.name)
    corpus = tempfile.mkdtemp(prefix=f"corpus-{spec.name}-")
    for i, seed in enumerate(seeds):
        with open(os.path.join(corpus, f"seed-{i}"), "wb") as f:
            f.write(seed)

    def one_input(data):
        try:
            target(data)
        except Exception as exc:  # noqa: BLE001 - saved, and the run goes on
            findings.save(data, exc)
        progress.tick(findings)

    argv = [sys.argv[0], corpus, f"-max_len={spec.max_len}", f"-timeout={args.timeout}",
            f"-artifact_prefix={os.path.join(args.crashes, spec.name + '-')}",
            f"-seed={args.seed}", "-print_final_stats=1"]
    if args.runs is not None:
        argv.append(f"-runs={args.runs}")
    if args.seconds:
        argv.append(f"-max_total_time={int(args.seconds)}")
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def run_atheris_parent(args):
    """Run the atheris engine in a child with its own temporary directory, then clean up."""
    tmp = tempfile.mkdtemp(prefix="danube-fuzz-")
    env = dict(os.environ, **{CHILD_ENV: "1", "TMPDIR": tmp, "DANUBE_FUZZ_TMP": tmp})
    before = set(os.listdir(args.crashes)) if os.path.isdir(args.crashes) else set()
    try:
        proc = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), *sys.argv[1:]],
                              env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # libFuzzer exits 0 at the end of a run whatever the target raised (the child saves and
    # goes on): what it found is what it saved.
    found = sorted(set(os.listdir(args.crashes)) - before) if os.path.isdir(args.crashes) else []
    saved = [name for name in found if name.endswith(".bin")]
    print(f"{len(saved)} new findings saved in {args.crashes}")
    return proc.returncode or (1 if saved else 0)


def replay(spec, paths):
    failed = 0
    with spec.open() as (target, _):
        for path in paths:
            with open(path, "rb") as f:
                data = f.read()
            try:
                target(data)
            except Exception:  # noqa: BLE001 - reported, as a finding is
                failed += 1
                print(f"{path}: still a finding")
                traceback.print_exc()
            else:
                print(f"{path}: passes")
    return 1 if failed else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", choices=sorted(TARGETS))
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("--runs", type=int, help="stop after this many inputs")
    parser.add_argument("--seconds", type=float, help="stop after this long")
    parser.add_argument("--engine", choices=("atheris", "mutate"),
                        default="atheris" if _have_atheris() else "mutate")
    parser.add_argument("--crashes", default="fuzz-crashes",
                        help="where findings are saved (default: fuzz-crashes/)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the engine")
    parser.add_argument("--timeout", type=int, default=30,
                        help="seconds one input may take before it counts as a hang")
    parser.add_argument("--replay", nargs="+", metavar="FILE",
                        help="run these saved inputs through the target and stop")
    args = parser.parse_args(argv)
    if args.list or not args.target:
        for name, spec in TARGETS.items():
            print(f"{name:18} {spec.description}")
        return 0
    if args.replay:
        return replay(TARGETS[args.target], args.replay)
    if args.engine == "atheris" and not _have_atheris():
        parser.error("atheris is not installed (pip install '.[fuzz]'); use --engine mutate")
    if args.runs is None and args.seconds is None:
        args.runs = 1_000_000
    if args.engine == "atheris" and not os.environ.get(CHILD_ENV):
        return run_atheris_parent(args)
    spec = TARGETS[args.target]
    findings = Findings(args.crashes, spec.name)
    print(f"fuzzing {spec.name} ({spec.description}) with {args.engine}", flush=True)
    with spec.open() as (target, seeds):
        if args.engine == "atheris":
            run_atheris_child(target, seeds, spec, args, findings)
        else:
            run_mutate(target, seeds, spec, args, findings)
    print(f"{findings.count} findings" + "".join(f"\n  {k}: {v}.bin"
                                                for k, v in findings.kinds.items()))
    return 1 if findings.count else 0


if __name__ == "__main__":
    sys.exit(main())
