"""Waiting on an event instead of sleeping a fixed time and hoping it happened.

`wait_for` polls a condition until it holds, with a generous timeout: a slow machine makes
the test slower, not flaky, and a fast one does not wait for nothing. `holds_for` is for
"must NOT happen" checks, which can only be observed over a bounded window: it fails as soon
as the condition breaks, and otherwise watches for the whole window."""

import asyncio
import time

# Long enough for a loaded 2-core CI machine; a passing test never waits this long.
DEFAULT_TIMEOUT = 30.0
POLL_INTERVAL = 0.01
# A wait polls at POLL_INTERVAL first (most conditions hold within milliseconds), then less
# and less often up to this: many predicates are not cheap (a scrape of a process's
# metrics, a Delta table read from S3, an admin RPC), and at 100 polls a second the suite's
# waits kept the 2 shared cores busy polling.
MAX_POLL_INTERVAL = 0.2
BACKOFF = 1.5


def _intervals(first):
    """The sleeps between polls: ``first``, then growing by BACKOFF up to MAX_POLL_INTERVAL
    (or ``first``, if a caller asked for a longer one)."""
    cap = max(first, MAX_POLL_INTERVAL)
    interval = first
    while True:
        yield interval
        interval = min(interval * BACKOFF, cap)


def wait_for(predicate, timeout=DEFAULT_TIMEOUT, what=None, interval=POLL_INTERVAL):
    """Poll `predicate()` until it returns something truthy and return that; fail the test
    (AssertionError naming `what`) if it has not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    for pause in _intervals(interval):
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for "
                                 f"{what or _describe(predicate)}")
        time.sleep(pause)


async def async_wait_for(predicate, timeout=DEFAULT_TIMEOUT, what=None,
                         interval=POLL_INTERVAL):
    """`wait_for` for code on an event loop: the loop keeps running while it waits.
    `predicate` may be a plain function or return an awaitable."""
    deadline = time.monotonic() + timeout
    for pause in _intervals(interval):
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for "
                                 f"{what or _describe(predicate)}")
        await asyncio.sleep(pause)


def holds_for(predicate, seconds, what=None, interval=POLL_INTERVAL):
    """Check that `predicate()` stays truthy for `seconds` (a bounded observation window:
    "it does not happen" can only be watched for so long); fail at the first lapse."""
    deadline = time.monotonic() + seconds
    while True:
        if not predicate():
            raise AssertionError(f"no longer true: {what or _describe(predicate)}")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


async def async_holds_for(predicate, seconds, what=None, interval=POLL_INTERVAL):
    """`holds_for` on an event loop."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if not value:
            raise AssertionError(f"no longer true: {what or _describe(predicate)}")
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(interval)


def _describe(predicate):
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    return f"{code.co_name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
