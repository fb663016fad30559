"""How the benchmarks judge their targets: a target over nothing measured (no scenario ran,
or every one failed) is NOT met, never met by an empty sum or an empty ``all``.

    PYTHONPATH=. .venv/bin/pytest -p no:cacheprovider bench/test_bench_targets.py
"""

from bench.e2e import runner as e2e
from bench.reliable import runner as reliable
from bench.tiered import runner as tiered


def _failed(key):
    return {"key": key, "label": key, "section": "batched", "error": "worker exited: numpy"}


def _measured(key, errors):
    return {"key": key, "label": key, "section": "batched", "errors": errors,
            "config": {"size": 10, "batch": 10}, "msgs_per_s": 1.0}


def _send_errors_verdict(checks):
    [(text, verdict)] = [c for c in checks if c[0].startswith("no send errors")]
    return text, verdict


def test_reliable_send_errors_not_met_when_every_scenario_failed():
    text, verdict = _send_errors_verdict(
        reliable.targets([_failed("b100_1000_p1"), _failed("b100_1000_p4")], []))
    assert verdict == "NOT met"
    assert "nothing was measured" in text and "all 2 scenarios failed" in text


def test_reliable_send_errors_not_met_when_nothing_ran():
    text, verdict = _send_errors_verdict(reliable.targets([], []))
    assert verdict == "NOT met"
    assert "nothing was measured" in text and "no scenario ran" in text


def test_reliable_send_errors_judged_over_what_was_measured():
    assert reliable.send_errors_target([_measured("a", 0), _measured("b", 0)]) == \
        ("no send errors in any scenario (0)", "met")
    text, verdict = reliable.send_errors_target([_measured("a", 0), _failed("b")])
    assert verdict == "met" and "1 of 2 scenarios failed and were not measured" in text
    assert reliable.send_errors_target([_measured("a", 3)])[1] == "NOT met"


def test_e2e_loss_target_not_met_when_nothing_was_measured():
    failed = {"key": "project_batch", "label": "x", "error": "skipped", "skipped": True}
    for results in ([], [failed]):
        [(text, verdict)] = [c for c in e2e.targets(results)
                             if c[0].startswith("no message lost")]
        assert verdict == "NOT met" and "nothing was measured" in text


def test_tiered_uploads_missing_when_no_window_was_measured():
    pstats = {"effects": {"fs#1": {"p99_ms": 1.0, "p99_without_ms": 1.0, "p99_diff_ms": 0.0,
                                   "no_worse": True, "conclusive": True}},
              "aa": {"band_ms": 0.1}}
    pubs = [{"group": "fs#1", "error": "worker failed"}]
    [(text, verdict)] = [c for c in tiered.targets([], [], pubs, pstats)
                         if c[0].startswith("zero effect")]
    assert verdict == "NOT met" and "uploads MISSING" in text
    pubs = [{"group": "fs#1", "uploaded_segments_in_window": 2}]
    [(text, verdict)] = [c for c in tiered.targets([], [], pubs, pstats)
                         if c[0].startswith("zero effect")]
    assert verdict == "met" and "happened in every window" in text


def test_the_bench_extra_installs_what_the_load_workers_import():
    """`pip install '.[bench]'` then `python -m bench.reliable` failed in every worker for
    lack of numpy: the extra names every third-party module the load workers import."""
    import ast
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    declared = {d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
                for d in extras["bench"]}
    imported = set()
    for worker in (root / "bench" / "reliable").glob("worker*.py"):
        for node in ast.walk(ast.parse(worker.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert "numpy" in imported
    assert "numpy" in declared


def test_scale_targets_not_met_when_nothing_was_measured():
    from bench.scale import runner as scale
    failed = {"topics": {"ours": []},
              "active": {"ours": [{"topics": 1000, "error": "producers not created"}]},
              "batched": {"ours": {"reliable": {"error": "bench.reliable exited 1"},
                                   "one_in_flight": {"error": "worker exited"}}},
              "connections": {"ours": [{"requested": 10_000, "error": "worker exited"}]}}
    checks = scale.targets(failed)
    assert len(checks) == 6
    assert {verdict for _, verdict in checks} == {"NOT met"}


def test_scale_targets_a_quick_run_is_not_judged():
    from bench.scale import runner as scale
    row = {"topics": 1000, "created_total": 1000, "topics_per_s": 5000.0, "errors": 0,
           "first_error": None, "rss_mib": 50.0, "fds": 100, "disk_bytes": 1 << 20,
           "disk_apparent_bytes": 1 << 20, "sigterm_s": 0.5, "restart_serving_s": 0.5}
    quick = {"topics": {"ours": [row]},
             "active": {"ours": [{"topics": 100, "msgs_per_s": 50_000.0, "p99_ms": 1.0}]},
             "connections": {"ours": [{"count": 1000, "served": 1000, "errors": 0,
                                       "rss_per_conn_kb": 1.0}]}}
    assert {verdict for _, verdict in scale.targets(quick)} == {"not judged"}
    # The same figures at the targets' sizes are judged, and met.
    full = {"topics": {"ours": [{**row, "topics": 100_000, "created_total": 100_000}]},
            "active": {"ours": [{"topics": 1000, "msgs_per_s": 50_000.0, "p99_ms": 1.0}]},
            "connections": {"ours": [{"count": 10_000, "served": 10_000, "errors": 0,
                                      "rss_per_conn_kb": 1.0}]}}
    assert {verdict for _, verdict in scale.targets(full)} == {"met"}
