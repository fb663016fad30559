"""Upstream's assignment strategies (``load_manager.assignment_strategy``), as pure functions
that rank brokers from least to most loaded.

Upstream ranks from the load reports alone, which are up to ``load_report_interval_seconds``
old: a burst of new topics would all go to the broker that was least loaded at the last
report. Here the topic counts come from the assignments the leader itself keeps (exact at
every moment), and the reports add what only the owner knows: rates, connections, backlog,
CPU and memory. Ties go to the lowest broker id, so a ranking is reproducible.

- ``fair``: topic count only.
- ``balanced``: 0.3 x weighted topic load + 0.35 x CPU + 0.35 x memory (upstream's composite
  ranking), topic count alone while no broker reports CPU or memory.
- ``weighted_load``: each dimension normalised by the cluster's maximum; a broker with one
  dimension above 70 % is scored mostly by that dimension (upstream's adaptive weights).
"""

from __future__ import annotations

import statistics

STRATEGIES = ("fair", "balanced", "weighted_load")


def topic_load(count: int, report: dict | None) -> float:
    """Upstream's weighted topic load: 0.2 per topic, plus throughput, connections and
    backlog from the broker's last report."""
    topics = (report or {}).get("topics") or []
    throughput = sum(float(t.get("byte_rate_mbps", 0)) for t in topics)
    connections = sum(int(t.get("producer_count", 0)) + int(t.get("consumer_count", 0))
                      for t in topics)
    backlog = sum(int(t.get("backlog_messages", 0)) for t in topics)
    return count * 0.2 + throughput * 0.3 + connections * 0.3 + backlog / 10_000 * 0.2


def resource(report: dict | None, name: str) -> float:
    for entry in (report or {}).get("resources_usage") or []:
        if entry.get("resource") == name:
            return float(entry.get("usage", 0.0))
    return 0.0


def _fair(counts, reports):
    return {b: float(n) for b, n in counts.items()}


def _balanced(counts, reports):
    has_resources = any(resource(reports.get(b), r) > 0 for b in counts
                        for r in ("CPU", "Memory"))
    if not has_resources:
        return _fair(counts, reports)
    return {b: topic_load(n, reports.get(b)) * 0.3 + resource(reports.get(b), "CPU") * 0.35
            + resource(reports.get(b), "Memory") * 0.35 for b, n in counts.items()}


def _weighted(counts, reports):
    dims = {b: {"cpu": resource(reports.get(b), "CPU"),
                "mem": resource(reports.get(b), "Memory"),
                "net": resource(reports.get(b), "NetworkIO"),
                "thr": float((reports.get(b) or {}).get("total_throughput_mbps", 0.0)),
                "topic": topic_load(n, reports.get(b))} for b, n in counts.items()}
    top = {d: max((v[d] for v in dims.values()), default=0.0) for d in
           ("cpu", "mem", "net", "thr", "topic")}
    scores = {}
    for broker, v in dims.items():
        u = {d: v[d] / top[d] if top[d] > 0 else 0.0 for d in v}
        peak = max(u.values())
        if peak > 0.7:
            if peak == u["cpu"]:
                score = u["cpu"] * .5 + u["mem"] * .2 + u["thr"] * .15 + u["topic"] * .15
            elif peak == u["mem"]:
                score = u["mem"] * .5 + u["cpu"] * .2 + u["thr"] * .15 + u["topic"] * .15
            elif peak == u["thr"]:
                score = u["thr"] * .5 + u["net"] * .2 + u["cpu"] * .15 + u["mem"] * .15
            elif peak == u["net"]:
                score = u["net"] * .5 + u["thr"] * .2 + u["cpu"] * .15 + u["mem"] * .15
            else:
                score = u["topic"] * .5 + u["cpu"] * .2 + u["mem"] * .2 + u["thr"] * .1
        else:
            score = (u["topic"] * .25 + u["cpu"] * .25 + u["mem"] * .25 + u["thr"] * .15
                     + u["net"] * .1)
        # Normalised scores tie whenever loads are all below the maximum in the same
        # proportion; the raw count breaks the tie towards the emptier broker.
        scores[broker] = score + counts[broker] * 1e-9
    return scores


_SCORERS = {"fair": _fair, "balanced": _balanced, "weighted_load": _weighted}


def loads(strategy: str, counts: dict[str, int], reports: dict[str, dict]) -> dict[str, float]:
    """Each candidate broker's load under ``strategy`` (``counts``: its assigned topics)."""
    return _SCORERS[strategy](counts, reports)


def pick(strategy: str, counts: dict[str, int], reports: dict[str, dict]) -> str | None:
    """The least loaded of the brokers in ``counts`` (None if there is none)."""
    if not counts:
        return None
    scored = loads(strategy, counts, reports)
    return min(scored, key=lambda b: (scored[b], counts[b], b))


def coefficient_of_variation(values) -> float:
    values = list(values)
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0
