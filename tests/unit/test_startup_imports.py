"""What a broker or CLI start imports: libraries only some configurations need are imported
on first use, each being a tenth of a second or more of every start (the single executable's
start-up target is under 1 s)."""

import subprocess
import sys

import pytest

LAZY = ("fastavro", "fastjsonschema", "jwt", "jsonschema", "prometheus_client",
        # a config file, a misspelt key's suggestion, a protobuf schema: ~40 ms together, of
        # every broker start without them
        "yaml", "difflib", "tempfile")


@pytest.mark.parametrize("entry", ["danube.cli.main", "danube.process.app"])
def test_start_up_leaves_optional_libraries_unimported(entry):
    code = (f"import sys, {entry}; "
            f"print(' '.join(m for m in {LAZY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""
