"""The soak (issue 25) as the test command runs it: two minutes of bench.soak with consumers
and the broker killed at random; every acknowledged reliable message must arrive, first
deliveries in the order each subscription type promises, memory and descriptors flat."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)


def test_two_minute_soak_with_kills(tmp_path):
    out = tmp_path / "soak.json"
    # The load of the documented hour (bench/README.md): 50 messages/s per producer, ~6,000
    # a topic in two minutes, with the broker and the consumers killed far more often.
    r = subprocess.run([sys.executable, "-P", "-m", "bench.soak", "--duration", "120",
                        "--broker-kill-every", "30", "--consumer-kill-every", "10",
                        "--rate", "50", "--seed", "2511", "--json", str(out)],
                       capture_output=True, text=True, timeout=560,
                       cwd=str(tmp_path), env=_bench_env(tmp_path))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["ok"] and result["drained"]
    assert result["events"]["broker_kills"] >= 1 and result["events"]["consumer_kills"] >= 3
    reliable = [s for s in result["subscriptions"] if s["topic"] == "reliable"]
    assert len(reliable) == 4 and all(s["lost"] == 0 and s["acked"] > 1000 for s in reliable)


def _bench_env(tmp_path):
    """bench/ importable, without the source tree's danube/ (no compiled modules) shadowing
    the installed package: a directory holding only a link to bench/."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = tmp_path / "path"
    path.mkdir()
    os.symlink(os.path.join(root, "bench"), path / "bench")
    return dict(os.environ, PYTHONPATH=str(path))
