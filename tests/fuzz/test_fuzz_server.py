"""Short fuzz run of a whole server connection in process (tests/support/fuzz_server.py):
the client preface, then random or mutated frames through a fake transport, with the
connection's invariants checked after every piece and once it is lost."""

import pytest
from hypothesis import given, strategies as st

from fuzz_codecs import Finding
from fuzz_mutate import fuzz_inputs, fuzz_settings
from fuzz_server import ServerConnectionTarget, server_seeds

SEEDS = server_seeds()


@pytest.fixture(scope="module")
def target():
    t = ServerConnectionTarget()
    yield t
    t.close()


def test_seeds_run_calls_to_the_end(target):
    for seed in SEEDS:
        target(seed)


def test_a_handler_failure_is_a_finding(target):
    """The log check is live: the test service's Raise handler fails every call."""
    from fuzz_server import _request
    from danube.codec import http2
    from danube.rpc.server import Kind

    target.extra_methods = [("Raise", Kind.UNARY_UNARY, "raise_")]
    try:
        with pytest.raises(Finding, match="failed"):
            target(b"\x00" + http2.settings_frame([]) + _request(1, "Raise", [b"x"]))
    finally:
        target.extra_methods = []


@fuzz_settings(250)
@given(st.data())
def test_fuzz_server_connection(target, data):
    target(data.draw(fuzz_inputs(SEEDS)))
