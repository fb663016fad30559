"""Short fuzz runs of the codec targets (tests/support/fuzz_codecs.py): random bytes and
mutated valid inputs through the HTTP/2 frame reader, the HPACK decoder, the gRPC deframer
and the WAL frame codec. The long runs are tests/fuzz/run.py (docs/fuzzing.md)."""

import pytest
from hypothesis import given

from fuzz_mutate import fuzz_inputs, fuzz_settings
from fuzz_targets import TARGETS
import fuzz_codecs as fc

CODECS = ("h2_frames", "hpack", "grpc_frames", "wal_frames", "mqtt_packets")


@pytest.mark.parametrize("name", CODECS)
def test_seeds_are_accepted(name):
    with TARGETS[name].open() as (target, seeds):
        assert seeds
        for seed in seeds:
            target(seed)


@fuzz_settings(700)
@given(fuzz_inputs(fc.h2_seeds()))
def test_fuzz_h2_frames(data):
    fc.h2_frames(data)


@fuzz_settings(700)
@given(fuzz_inputs(fc.hpack_seeds()))
def test_fuzz_hpack_blocks(data):
    fc.hpack_block(data)


@fuzz_settings(400)
@given(fuzz_inputs(fc.grpc_seeds()))
def test_fuzz_grpc_frames(data):
    fc.grpc_frames(data)


@fuzz_settings(600)
@given(fuzz_inputs(fc.wal_seeds()))
def test_fuzz_wal_frames(data):
    fc.wal_frames(data)


@fuzz_settings(700)
@given(fuzz_inputs(fc.mqtt_seeds()))
def test_fuzz_mqtt_packets(data):
    fc.mqtt_packets(data)


def test_the_targets_catch_what_they_check():
    """A target that could not fail would find nothing: each refuses a broken codec."""
    with pytest.raises(fc.Finding):
        fc.check(False, "checked")
    good = fc.wal_seeds()[0]
    offsets, _, valid_end, _ = fc.wf.scan_frames(good)
    assert len(offsets) == 6 and valid_end == len(good)
