"""The placement interface (danube/broker/placement.py) is the cluster's only way into the
broker core: every member of the core the cluster's placement (danube/cluster/) touches is a
member of PlacementHost, and the core has every one of them; the broker core branches on no
mode (it holds no ``cluster`` or ``clustered``)."""

import ast
import inspect
import pathlib

from danube.broker.core import BrokerCore
from danube.broker.placement import Placement, PlacementHost, Standalone
from danube.cluster.node import ClusterNode

DANUBE = pathlib.Path(__file__).resolve().parents[2] / "danube"


def host_members():
    return {name for name in vars(PlacementHost) if not name.startswith("_")} | \
        set(PlacementHost.__annotations__)


def used_on_host(path):
    """Every ``X`` of ``self.host.X`` in a module."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                node.value.attr == "host" and isinstance(node.value.value, ast.Name) and \
                node.value.value.id == "self":
            used.add(node.attr)
    return used


def test_the_cluster_reaches_the_core_only_through_placement_host():
    used = set().union(*(used_on_host(p) for p in (DANUBE / "cluster").glob("*.py")))
    assert used, "the cluster's placement drives the core through self.host"
    assert used <= host_members(), f"not in PlacementHost: {sorted(used - host_members())}"


def test_the_core_is_a_placement_host():
    missing = [name for name in host_members() if name != "broker_id" and
               not callable(getattr(BrokerCore, name, None))]
    assert not missing


def test_both_placements_answer_every_question():
    """What the base leaves unanswered (NotImplementedError), Standalone and ClusterNode
    each answer."""
    unanswered = [name for name, value in vars(Placement).items() if callable(value) and
                  "raise NotImplementedError" in inspect.getsource(value)]
    assert set(unanswered) == {"drain", "balance", "rebalance", "topics_of"}
    for impl in (Standalone, ClusterNode):
        for name in unanswered:
            assert name in vars(impl), f"{impl.__name__} lacks {name}"


def test_the_core_never_asks_which_mode_it_runs_in():
    """No attribute of cluster mode in the broker, and no mention of the cluster's package
    but in the placement interface's docs."""
    for path in (DANUBE / "broker").rglob("*.py"):
        text = path.read_text()
        words = ("self.cluster", "clustered") if path.name == "placement.py" else \
            ("self.cluster", "clustered", "danube.cluster")
        for word in words:
            assert word not in text, f"{path.relative_to(DANUBE)}: {word}"
