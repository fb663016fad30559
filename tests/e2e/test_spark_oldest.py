"""The Spark connector's e2e tests (test_spark_connector.py) once more with the oldest PySpark
it claims (connectors/spark: pyspark>=4.0), 4.0.0, which bin/test installs into
.venv-pyspark40 (it sees .venv's packages after its own). A pytest run of its own in a
subprocess, so that it runs beside the rest of the suite on a pytest-xdist worker; the newest
PySpark runs the same file in the main session (the exactly-once restart test's three rounds
there, one here)."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".venv-pyspark40", "bin", "python")
OLDEST = "4.0.0"


@pytest.mark.timeout(1500)
def test_connector_e2e_with_the_oldest_claimed_pyspark():
    if not os.path.exists(PYTHON):
        pytest.fail(f"{PYTHON} is missing: run `bash bin/test`, which installs PySpark "
                    f"{OLDEST} there", pytrace=False)
    version = subprocess.run([PYTHON, "-P", "-c", "import pyspark; print(pyspark.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == OLDEST, f".venv-pyspark40 has PySpark {version}; bin/test installs {OLDEST}"
    # -P: the source tree must not shadow the installed packages, as in the main run.
    proc = subprocess.run(
        [PYTHON, "-P", "-m", "pytest", os.path.join(ROOT, "tests/e2e/test_spark_connector.py"),
         "-p", "no:cacheprovider", "--benchmark-disable", "-q", "-n", "0",
         # The exactly-once restart test runs three rounds with the newest PySpark; one
         # round exercises the oldest's streaming paths (its repetitions are about our
         # offsets and checkpoint, not the PySpark version) and saves ~1 min of CI.
         "--deselect", "tests/e2e/test_spark_connector.py::"
         "test_stream_stopped_and_restarted_while_publishing_is_exactly_once[2]",
         "--deselect", "tests/e2e/test_spark_connector.py::"
         "test_stream_stopped_and_restarted_while_publishing_is_exactly_once[3]"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    summary = proc.stdout.strip().splitlines()[-1:] or [""]
    assert proc.returncode == 0, (f"with PySpark {OLDEST}: {summary[0]}\n"
                                  f"{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}")
    assert " passed" in summary[0] and "skipped" not in summary[0], summary[0]
