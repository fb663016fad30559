"""The mutation check (docs/testing.md) as part of the suite: each hand-picked mutant of
tests/mutation/mutants.py, applied to a scratch copy of the installed package, must make its
killing tests fail (tests/mutation/run.py does the work; `bin/mutants` runs the same list
on its own). In the suite, pytest-xdist hands this file to a worker like any other, so the
mutants run in the time the other workers wait on brokers and sockets."""

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


_spec = importlib.util.spec_from_file_location("danube_mutation_run",
                                               os.path.join(HERE, "run.py"))
RUNNER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RUNNER)
MUTANTS = RUNNER.MUTANTS         # the list run.py reads, not a second copy of it


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed(mutant):
    try:
        killed, _ = RUNNER.run(mutant, verbose=False)
    except SystemExit as exc:          # the change no longer applies, or pytest could not run
        pytest.fail(str(exc), pytrace=False)
    assert killed, (f"mutant {mutant.name} survived: with danube/{mutant.file} changed so that "
                    f"{mutant.what}, these pass: {' '.join(mutant.tests)}")
