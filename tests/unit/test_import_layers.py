"""The layers of docs/architecture.md hold by themselves: every import between danube's
packages points the way the table there says, and no module imports itself back through
others (no cycle). Python modules are read by grimp; Cython modules (.pyx/.pxd) are read here
line by line, since their `cimport`s link them as tightly as imports do."""

import collections
import pathlib
import re

import grimp

ROOT = pathlib.Path(__file__).resolve().parents[2] / "danube"

#: The bottom of every layer: configuration and the generated protobuf messages.
BOTTOM = {"danube.config", "danube.config_keys", "danube.config_errors", "danube.proto",
          "danube.config_durable", "danube.config_cluster", "danube.fslock", "danube.tasks",
          "danube.failure_policy", "danube.metering", "danube.dirsync",
          "danube.config_writebuffer"}

#: What each part of danube may import besides itself and BOTTOM (docs/architecture.md).
ALLOWED = {
    "danube.codec": set(),
    "danube.rpc": {"danube.codec"},
    "danube.metadata": set(),
    "danube.storage": {"danube.codec"},
    "danube.broker": {"danube.codec", "danube.storage", "danube.metadata", "danube.schema"},
    "danube.services": {"danube.codec", "danube.rpc", "danube.broker", "danube.security"},
    # Cluster mode on etcd: membership, leader, load manager; the core's placement. It
    # reaches the broker only through the placement interface and the typed errors
    # (REACHES_BROKER_ONLY_THROUGH below).
    "danube.cluster": {"danube.broker", "danube.metadata"},
    # Authentication and authorization: tokens, roles and bindings in the metadata store,
    # the guard in front of a server's methods.
    "danube.security": {"danube.rpc", "danube.metadata"},
    "danube.client": {"danube.codec", "danube.rpc"},
    # The edge broker: MQTT in, local WALs (storage), checkpoints in the embedded store
    # (metadata), payloads checked by the schema validators, replication over our gRPC
    # client (rpc); it never imports the broker core or the services.
    "danube.edge": {"danube.codec", "danube.rpc", "danube.client", "danube.storage",
                    "danube.metadata", "danube.schema", "danube.mqtt"},
    # MQTT packets, sans I/O: the edge's server and source-mqtt's client read and write
    # them; C runs of PUBLISH packets from the codec.
    "danube.mqtt": {"danube.codec"},
    # Schema formats, compatibility and payload validation: pure functions, used by the
    # registry, the publish path and the CLI alike.
    "danube.schema": {"danube.codec"},
    # The broker process: builds the stores, the placement, the broker and the servers, and
    # serves them.
    "danube.process": {"danube.codec", "danube.rpc", "danube.services", "danube.broker",
                       "danube.storage", "danube.metadata", "danube.security",
                       "danube.cluster"},
    "danube.cli": {"danube.codec", "danube.rpc", "danube.client", "danube.services",
                   "danube.process", "danube.broker", "danube.storage", "danube.metadata",
                   "danube.schema", "danube.security", "danube.cluster", "danube"},
    "danube.__main__": {"danube.cli"},
    "danube": set(),
}
ALLOWED.update({name: set() for name in BOTTOM})
ALLOWED["danube.config"] = {"danube.config_keys", "danube.config_errors",
                            "danube.config_durable", "danube.config_cluster",
                            "danube.failure_policy", "danube.metering",
                            "danube.config_writebuffer"}
ALLOWED["danube.config_writebuffer"] = {"danube.config_errors"}
ALLOWED["danube.config_cluster"] = {"danube.config_errors"}
ALLOWED["danube.config_durable"] = {"danube.config_keys", "danube.config_errors"}
ALLOWED["danube.config_keys"] = {"danube.config_errors"}
ALLOWED["danube.failure_policy"] = {"danube.config_errors"}
# The web console of `danube admin serve`: reaches the broker through the client only.
ALLOWED["danube.console"] = {"danube.client", "danube.rpc", "danube.codec"}
# A cluster on one machine (`danube cluster up`) and proxy mode's ingress configuration:
# processes it starts, and the broker reached through the client only.
ALLOWED["danube.devcluster"] = {"danube.client", "danube.rpc", "danube.codec"}
# Prometheus's HTTP API and upstream danube-admin's PromQL queries: standard library only.
ALLOWED["danube.promql"] = set()
# Upstream's /ui/v1 JSON API for its admin UI, beside the console (sharing its cache).
ALLOWED["danube.adminui"] = {"danube.client", "danube.rpc", "danube.codec", "danube.console",
                             "danube.promql"}
# Upstream's MCP server: the admin client, Prometheus, and the security module's tokens.
ALLOWED["danube.mcp_server"] = {"danube.client", "danube.rpc", "danube.codec", "danube.promql",
                                "danube.security"}
ALLOWED["danube.cli"] = ALLOWED["danube.cli"] | {
    "danube.console", "danube.edge", "danube.devcluster", "danube.adminui", "danube.mcp_server",
    "danube.promql"}
# Danube Connect: the connector runtime over the client; the shipped connectors over it.
ALLOWED["danube.connect"] = {"danube.client", "danube.rpc", "danube.codec"}
ALLOWED["danube.connectors"] = {"danube.connect", "danube.client", "danube.rpc",
                                "danube.codec", "danube.mqtt"}
ALLOWED["danube.cli"] = ALLOWED["danube.cli"] | {"danube.connect"}


#: Parts that may import the broker only through these modules: the cluster drives the core
#: through its placement interface (danube.broker.placement: Placement, PlacementHost,
#: SYSTEM_TOPIC) and raises the broker's typed errors; nothing else of the core.
REACHES_BROKER_ONLY_THROUGH = {
    "danube.cluster": {"danube.broker", "danube.broker.placement", "danube.broker.errors"},
}

#: Imports no module of a part may make at all, whatever ALLOWED says of the parts: the
#: broker knows nothing of cluster mode (its placement is handed to it), and the services
#: are handed the broker, never build the process around it.
FORBIDDEN = {
    "danube.broker": {"danube.cluster", "danube.process"},
    "danube.services": {"danube.cluster", "danube.process"},
}


def part(module):
    """The entry of ALLOWED that owns `module`: the longest prefix listed."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in ALLOWED:
            return name
    raise AssertionError(f"{module} belongs to no layer of ALLOWED: add it there and to "
                         f"docs/architecture.md")


_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\b|c?import\s+([\w.]+))", re.M)


def cython_edges():
    """(importer, imported) for every danube import or cimport in a .pyx/.pxd file."""
    for path in ROOT.rglob("*.p[yx][xd]"):
        if path.suffix not in (".pyx", ".pxd"):
            continue
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        for m in _CYTHON_IMPORT.finditer(path.read_text()):
            target = m.group(1) or m.group(2)
            if target.startswith("danube"):
                yield module, target


def all_edges():
    graph = grimp.build_graph("danube", include_external_packages=False,
                              exclude_type_checking_imports=True)
    edges = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            edges.add((module, imported))
    edges.update(cython_edges())
    return edges


def against_the_layers(edges):
    """{(part, part it may not import): [edges]}"""
    wrong = collections.defaultdict(list)
    for importer, imported in edges:
        a, b = part(importer), part(imported)
        if a != b and b not in ALLOWED[a] and b not in BOTTOM:
            wrong[a, b].append(f"{importer} -> {imported}")
    return wrong


def test_imports_follow_the_layers():
    wrong = against_the_layers(all_edges())
    assert not wrong, "imports against the layers:\n" + "\n".join(
        f"  {a} may not import {b}: {', '.join(sorted(v)[:4])}"
        for (a, b), v in sorted(wrong.items()))


def back_references(edges):
    """[edge] against REACHES_BROKER_ONLY_THROUGH or FORBIDDEN."""
    wrong = []
    for importer, imported in edges:
        a = part(importer)
        allowed = REACHES_BROKER_ONLY_THROUGH.get(a)
        if allowed is not None and part(imported) == "danube.broker" and \
                imported not in allowed:
            wrong.append(f"{importer} -> {imported} (only through {sorted(allowed)})")
        for banned in FORBIDDEN.get(a, ()):
            if imported == banned or imported.startswith(banned + "."):
                wrong.append(f"{importer} -> {imported} ({a} may never import {banned})")
    return sorted(wrong)


def test_no_back_references():
    """The broker never imports cluster mode or the process; the cluster reaches the core
    only through its placement interface; the services never build the process."""
    wrong = back_references(all_edges())
    assert not wrong, "back-references:\n" + "\n".join("  " + w for w in wrong)


def test_the_back_reference_check_can_fail():
    assert back_references({("danube.cluster.node", "danube.broker.core.topics"),
                            ("danube.broker.core.broker", "danube.cluster.node"),
                            ("danube.services.admin.brokers", "danube.process.app"),
                            ("danube.cluster.node", "danube.broker.placement"),
                            ("danube.cluster.admin", "danube.broker.errors")}) == [
        "danube.broker.core.broker -> danube.cluster.node (danube.broker may never import "
        "danube.cluster)",
        "danube.cluster.node -> danube.broker.core.topics (only through ['danube.broker', "
        "'danube.broker.errors', 'danube.broker.placement'])",
        "danube.services.admin.brokers -> danube.process.app (danube.services may never "
        "import danube.process)",
    ]


def test_no_import_cycle():
    graph = collections.defaultdict(set)
    for importer, imported in all_edges():
        if importer != imported:
            graph[importer].add(imported)
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join("  " + " <-> ".join(sorted(c))
                                                       for c in cycles)


def strongly_connected(graph):
    """Tarjan's algorithm, iterative: the components of more than one module."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(component)
    return out


def test_the_checker_sees_a_wrong_import_and_a_cycle():
    """The two checks above can fail: a made-up edge against the layers and a made-up
    cycle are both caught."""
    assert against_the_layers({("danube.broker.topic", "danube.rpc.server"),
                               ("danube.storage.wal.log", "danube.metadata.keys"),
                               ("danube.codec.http2", "danube.config")}) == {
        ("danube.broker", "danube.rpc"): ["danube.broker.topic -> danube.rpc.server"],
        ("danube.storage", "danube.metadata"): ["danube.storage.wal.log -> danube.metadata.keys"],
    }
    assert not against_the_layers({("danube.services.ext", "danube.broker.topic"),
                                   ("danube.broker.topic", "danube.storage.topic_log")})
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) != []
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []
