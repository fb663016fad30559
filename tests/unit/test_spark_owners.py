"""danube-spark's retries while a partition's owner changes (danube_spark.owners.Retry):
which failures are retried, the deadline counted from the first failure since the last
progress, and the error that names the partition once it has passed. No broker: the calls
to a real cluster are tests/e2e/test_spark_cluster.py's."""

import pickle
import time

import pytest

pytest.importorskip("danube_spark", reason="bin/test builds and installs connectors/spark")

from danube_spark.errors import DanubeSparkError  # noqa: E402
from danube_spark.owners import Owners, OwnerUnavailable  # noqa: E402

PART = "/default/t-part-3"


def failure(code):
    err = DanubeSparkError(f"call failed: {code}")
    err.code = code
    return err


def test_not_an_owner_problem_is_raised_at_once():
    retry = Owners("http://127.0.0.1:1", 5, wait=30).retry(PART, "reading")
    for code in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION", None):
        with pytest.raises(DanubeSparkError, match="call failed"):
            retry.failed(failure(code))


def test_owner_failures_are_retried_until_owner_wait_passes():
    owners = Owners("http://127.0.0.1:1,http://127.0.0.1:2", 5, wait=0.3)
    retry = owners.retry(PART, "reading offsets [0, 10)")
    started = time.monotonic()
    attempts = 0
    with pytest.raises(OwnerUnavailable) as info:
        while True:
            retry.failed(failure("UNAVAILABLE" if attempts % 2 else "NOT_FOUND"))
            attempts += 1
    assert 0.3 <= time.monotonic() - started < 5
    assert attempts >= 2
    message = str(info.value)
    assert PART in message and "ownerWaitMs" in message and "0.3 s" in message
    assert "http://127.0.0.1:1, http://127.0.0.1:2" in message
    assert "call failed" in message         # the last error


def test_progress_starts_the_wait_again():
    retry = Owners("http://127.0.0.1:1", 5, wait=0.2).retry(PART, "reading")
    retry.failed(failure("UNAVAILABLE"))
    time.sleep(0.25)
    retry.progressed()
    retry.failed(failure("DEADLINE_EXCEEDED"))      # a new wait, not past the old one
    time.sleep(0.25)
    with pytest.raises(OwnerUnavailable):
        retry.failed(failure("UNAVAILABLE"))


def test_owners_pickle_without_their_channels():
    owners = Owners("http://127.0.0.1:1", 5, wait=1)
    owners._broker("http://127.0.0.1:1")            # a channel opened
    copy = pickle.loads(pickle.dumps(owners))
    assert copy.seeds == ["http://127.0.0.1:1"] and copy._channels == {}
    owners.close()
