"""Short fuzz run of WAL recovery (tests/support/fuzz_wal.py): directories of real segment
files and checkpoints, damaged, or random ones; recovery gives back a prefix of what was
written or refuses with the storage error."""

import functools
import json

import pytest
from hypothesis import given, strategies as st

from fuzz_codecs import Finding
from fuzz_mutate import fuzz_inputs, fuzz_settings
from fuzz_wal import WalRecoveryTarget, pack, unpack, wal_seeds


@functools.lru_cache(maxsize=1)
def seeds():
    return wal_seeds()


@pytest.fixture(scope="module")
def target():
    t = WalRecoveryTarget()
    yield t
    t.close()


def test_seeds_recover_whole(target):
    for seed in seeds():
        target(seed)
    assert len(seeds()) == 4


def test_archives_round_trip():
    files = unpack(seeds()[0])
    assert any(name.endswith(".log") for name in files)
    again = unpack(pack(files))
    assert again.keys() == files.keys()
    assert all(again[n] == files[n] for n in files if n.endswith(".log"))
    assert json.loads(again["wal.ckpt"]) == json.loads(files["wal.ckpt"])


def test_a_forged_message_is_a_finding(target):
    """The prefix check is live: a segment whose frames are valid but carry other payloads
    than the ones written at their offsets is caught."""
    from danube.storage._walframes import encode_frame

    forged = encode_frame(0, b"not what was written")
    with pytest.raises(Finding, match="not the one written"):
        target(pack({"wal.00000000000000000000.log": forged}))


@fuzz_settings(200)
@given(st.data())
def test_fuzz_wal_recovery(target, data):
    target(data.draw(fuzz_inputs(seeds(), max_random=256)))
