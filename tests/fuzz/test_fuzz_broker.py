"""Short fuzz run of every request of every service against a real broker (one per module,
tests/support/fuzz_broker.py): valid requests of each method as seeds, then random and
mutated ones as raw bytes on the client and admin ports. A status of INTERNAL or UNKNOWN, a
traceback or failed handler in the broker's log, or a broker that stops answering is a
finding."""

import pytest
from hypothesis import given, strategies as st

from fuzz_broker import BrokerTarget
from fuzz_mutate import fuzz_inputs, fuzz_settings


@pytest.fixture(scope="module")
def target():
    t = BrokerTarget()
    yield t
    t.close()


def test_every_method_with_its_seeds(target):
    for seed in target.seeds():
        target(seed)
    target.check_alive()
    assert len(target.methods) > 60
    # The seeds get past the transport: most methods answer something other than
    # UNIMPLEMENTED and INVALID_ARGUMENT for a valid request.
    assert target.codes["OK"] + target.codes["NOT_FOUND"] > 30, target.codes


@fuzz_settings(400)
@given(st.data())
def test_fuzz_broker_requests(target, data):
    target(data.draw(fuzz_inputs(target.seeds())))


def test_broker_still_serving_after_the_fuzz(target):
    target.check_alive()
