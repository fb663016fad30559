"""The broker for `bench.tiered --probe`: `python -m danube broker ...` unchanged, except that
it measures what holds up its event loop, and writes that to a JSON file when it stops.

* Loop lag: a task sleeps 1 ms at a time and records how late each wake-up was (a callback
  that runs for 3 ms shows up as ~3 ms of lag). Every lag over `LAG_KEEP_MS` is kept with its
  wall-clock time, so the orchestrator can count the ones inside its measuring window.
* Attribution: a handful of functions that run on the loop and may block it (metadata
  writes, WAL rotation and its parts, segment growth, the tiered uploader's bookkeeping)
  are wrapped to time each call made on the loop thread. Every call is counted; calls over
  `CALL_KEEP_MS` are kept with their wall-clock time.
* Events, from any thread, kept with their time: every fdatasync of the WAL, its sync
  jobs, checkpoint and directory fsyncs, the metadata writer's batches, uploads (submitted,
  done), and how long work waited for a thread of the WAL executor.

It costs the broker a wake-up per millisecond (~1-2% of a core), so it is opt-in and not
used for the headline figures. Run only by bench.tiered.runner:

    python -P -m bench.tiered.broker_probe OUT_JSON broker --mode standalone ...
"""

import asyncio
import functools
import importlib
import json
import sys
import threading
import time

LAG_KEEP_MS = 0.5
CALL_KEEP_MS = 0.2
TICK = 0.001

#: (module, qualified name) of what is timed when it runs on the loop thread; a name that
#: does not exist (any more) is skipped.
TARGETS = (
    ("danube.metadata.embedded", "EmbeddedStore._begin"),      # before the writer thread
    ("danube.metadata.embedded", "EmbeddedStore._commit"),     # (names that are gone are
    ("danube.metadata.embedded", "EmbeddedStore._row"),        # skipped)
    ("danube.metadata._local", "LocalStore.put"),
    ("danube.metadata._local", "LocalStore.put_many"),
    ("danube.storage.wal.append", "Appender._rotate"),
    ("danube.storage.wal.group_commit", "GroupCommit.write_all_pending"),
    ("danube.storage.wal", "WAL.segments"),
    ("danube.storage.wal.group_commit", "GroupCommit._make_job"),
    ("danube.storage.segment", "Segment.create"),
    ("danube.storage.segment", "Segment.seal"),
    ("danube.storage.segment", "Segment.grow_to"),
    ("danube.storage.checkpoint", "build_checkpoint"),
    ("danube.storage.tiered.upload_worker", "ProcessUploader.submit"),
    ("danube.storage.tiered.manager", "TopicTier.export"),
    ("danube.storage.tiered.catalog", "SegmentDescriptor.from_json"),
    ("danube.storage.tiered.catalog", "SegmentDescriptor.to_json"),
)

#: Calls of these are all kept with their time (from any thread), for correlating with
#: the latency samples.
EVENTS = ("fdatasync", "EmbeddedStore._commit", "Appender._rotate", "ProcessUploader.submit",
          "upload done", "TopicTier.export")          # (and every THREAD_TARGETS call)

_main = threading.main_thread().ident
_events = []        # (wall time at start, name, seconds, on the loop thread)
_calls = {}         # name -> [count, total s, max s]
_slow = []          # (wall time, name, seconds)
_lags = []          # (wall time, seconds late)
_lag_hist = [0] * 8  # <0.1, <0.25, <0.5, <1, <2, <5, <10, >=10 ms
_LAG_BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01)


def _wrap(name, fn):
    is_async = asyncio.iscoroutinefunction(fn)
    clock = time.perf_counter
    keep = CALL_KEEP_MS / 1000

    def record(dt):
        if name in EVENTS:
            _events.append((time.time() - dt, name, dt, True))
        c = _calls.get(name)
        if c is None:
            c = _calls[name] = [0, 0.0, 0.0]
        c[0] += 1
        c[1] += dt
        if dt > c[2]:
            c[2] = dt
        if dt >= keep:
            _slow.append((time.time(), name, dt))

    if is_async:
        # Only the synchronous stretches count (the longest one of the call is recorded):
        # the time between resumptions is not the loop's.
        @functools.wraps(fn)
        async def timed_async(*args, **kwargs):
            if threading.get_ident() != _main:
                return await fn(*args, **kwargs)
            return await _Stepper(fn(*args, **kwargs), record)
        return timed_async

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if threading.get_ident() != _main:
            return fn(*args, **kwargs)
        t = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            record(clock() - t)
    return timed


class _Stepper:
    """Awaits a coroutine step by step, timing each step; reports the longest one."""

    def __init__(self, coro, record):
        self.coro = coro
        self.record = record

    def __await__(self):
        it = self.coro.__await__()
        clock = time.perf_counter
        value, exc, longest = None, None, 0.0
        while True:
            t = clock()
            try:
                y = it.throw(exc) if exc is not None else it.send(value)
            except StopIteration as stop:
                self.record(max(longest, clock() - t))
                return stop.value
            except BaseException:
                self.record(max(longest, clock() - t))
                raise
            longest = max(longest, clock() - t)
            try:
                value, exc = (yield y), None
            except BaseException as e:  # noqa: BLE001 - passed on to the coroutine
                value, exc = None, e


def _install_fdatasync():
    from danube.storage.wal import group_commit as wal
    real = wal._fdatasync

    def timed_fdatasync(fd):
        t0, t = time.time(), time.perf_counter()
        try:
            real(fd)
        finally:
            _events.append((t0, "fdatasync", time.perf_counter() - t,
                            threading.get_ident() == _main))
    wal._fdatasync = timed_fdatasync


def _install_upload_events():
    from danube.storage.tiered import upload_worker
    real = upload_worker.ProcessUploader.submit

    def submit(self, *args):
        fut = real(self, *args)
        t0 = time.time()
        fut.add_done_callback(
            lambda f: _events.append((t0, "upload done", time.time() - t0, False)))
        return fut
    upload_worker.ProcessUploader.submit = submit


#: Blocking work of the WAL's executor threads, kept as events from any thread.
THREAD_TARGETS = (
    ("danube.metadata._writer", "Writer._process"),
    ("danube.storage.wal.group_commit", "_Job.run"),
    ("danube.storage.checkpoint", "write_checkpoint"),
    ("danube.storage.checkpoint", "fsync_dir"),
)


def _resolve(module_name, qualname):
    """(module, owner, attribute name) of ``module_name``'s ``qualname``, or None when it
    is not there (a target a given build does not have)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    parts = qualname.split(".")
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
    return None if owner is None else (module, owner, parts[-1])


def _replace(module, owner, name, real, wrapped):
    setattr(owner, name, wrapped)
    if owner is module:
        # Modules that imported the function by name call their own reference.
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("danube") \
                    and getattr(mod, name, None) is real:
                setattr(mod, name, wrapped)


def _install_thread_events():
    for module_name, qualname in THREAD_TARGETS:
        found = _resolve(module_name, qualname)
        if found is None:
            continue
        module, owner, attr = found
        real = getattr(owner, attr, None)
        if real is None:
            continue

        def make(real, name):
            @functools.wraps(real)
            def timed(*args, **kwargs):
                t0, t = time.time(), time.perf_counter()
                try:
                    return real(*args, **kwargs)
                finally:
                    _events.append((t0, name, time.perf_counter() - t,
                                    threading.get_ident() == _main))
            return timed
        _replace(module, owner, attr, real, make(real, qualname))


def _install_executor_waits():
    """How long work submitted to the WAL executor waited for a free thread, and what ran
    there for 2 ms or more (what a waiting job waited for)."""
    import concurrent.futures
    real = concurrent.futures.ThreadPoolExecutor.submit

    def submit(self, fn, /, *args, **kwargs):
        if not getattr(self, "_thread_name_prefix", "").startswith("danube-wal"):
            return real(self, fn, *args, **kwargs)
        t0, t = time.time(), time.perf_counter()
        name = getattr(fn, "__qualname__", "?")

        def run(*a, **k):
            waited = time.perf_counter() - t
            if waited >= 0.0002:
                _events.append((t0, f"executor wait ({name})", waited, False))
            t1 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                ran = time.perf_counter() - t1
                if ran >= 0.002:
                    _events.append((t0 + waited, f"executor run ({name})", ran, False))
        return real(self, run, *args, **kwargs)
    concurrent.futures.ThreadPoolExecutor.submit = submit


def install():
    _install_executor_waits()
    _install_fdatasync()
    _install_upload_events()
    _install_thread_events()
    for module_name, qualname in TARGETS:
        found = _resolve(module_name, qualname)
        if found is None:
            continue
        module, owner, attr = found
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else \
            getattr(owner, attr, None)
        if raw is None:
            continue
        if isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(_wrap(qualname, raw.__func__)))
        elif isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(_wrap(qualname, raw.__func__)))
        elif callable(raw):
            _replace(module, owner, attr, raw, _wrap(qualname, raw))


async def _monitor():
    clock = time.perf_counter
    keep = LAG_KEEP_MS / 1000
    bounds = _LAG_BOUNDS
    while True:
        t = clock()
        await asyncio.sleep(TICK)
        lag = clock() - t - TICK
        if lag < 0:
            lag = 0.0
        i = 0
        while i < len(bounds) and lag >= bounds[i]:
            i += 1
        _lag_hist[i] += 1
        if lag >= keep:
            _lags.append((time.time(), lag))


def main():
    out_path = sys.argv[1]
    install()
    from danube.process import app

    real_start = app.Broker.start
    task = []

    async def start(self):
        await real_start(self)
        task.append(asyncio.get_running_loop().create_task(_monitor(), name="loop-probe"))
    app.Broker.start = start

    from danube.cli.main import main as danube_main
    try:
        return danube_main(sys.argv[2:])
    finally:
        with open(out_path, "w") as f:
            json.dump({"calls": _calls, "slow": _slow, "lags": _lags, "events": _events,
                       "lag_hist": _lag_hist,
                       "lag_bounds_ms": [b * 1000 for b in _LAG_BOUNDS]}, f)


if __name__ == "__main__":
    sys.exit(main())
