"""The tests' wait helper (tests/support/waiting.py): it polls often at first and then less
and less often, so that a wait on an expensive condition (a metrics scrape, a table read
from S3) does not keep the shared cores busy, and it still fails with the condition named."""

import asyncio
import itertools
import time

import pytest

import waiting
from waiting import async_wait_for, wait_for


def test_the_pauses_grow_from_the_first_to_the_cap():
    pauses = list(itertools.islice(waiting._intervals(0.01), 30))
    assert pauses[0] == 0.01
    assert all(b >= a for a, b in zip(pauses, pauses[1:]))
    assert pauses[-1] == waiting.MAX_POLL_INTERVAL
    # a caller's longer interval is kept, not cut to the cap
    assert set(itertools.islice(waiting._intervals(0.5), 5)) == {0.5}


def test_a_long_wait_polls_a_few_times_a_second_not_a_hundred():
    calls = []
    until = time.monotonic() + 1.0

    def condition():
        calls.append(1)
        return time.monotonic() >= until
    wait_for(condition, timeout=30)
    # 10 ms, 15 ms, ... then every 200 ms: about a dozen polls in the second (a slower
    # machine makes fewer); at a fixed 10 ms it was a hundred
    assert len(calls) <= 20


async def test_the_async_wait_backs_off_too_and_returns_the_value():
    calls = []
    until = time.monotonic() + 1.0

    def condition():
        calls.append(1)
        return "done" if time.monotonic() >= until else None
    assert await async_wait_for(condition, timeout=30) == "done"
    assert len(calls) <= 20


def test_a_timeout_names_what_it_waited_for():
    with pytest.raises(AssertionError, match="timed out after 0.3 s waiting for the moon"):
        wait_for(lambda: False, timeout=0.3, what="the moon")
    with pytest.raises(AssertionError, match="waiting for the sun"):
        asyncio.run(async_wait_for(lambda: False, timeout=0.3, what="the sun"))
