"""The package's import graph: no cycle, and imports go one way
(cli/bench -> solve/registry -> problems -> backends -> cost -> data model)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pipeopt"

# A module may import only modules of a lower rank, or of its own group (without a cycle).
RANKS = {
    "pipeopt.errors": 0,
    "pipeopt.units": 0.5,
    "pipeopt.graph": 1,
    "pipeopt.cluster": 1,
    "pipeopt.plan": 1,
    "pipeopt.instance": 2,
    "pipeopt.cost": 3,
    "pipeopt.io": 3,
    "pipeopt.zoo": 4,
    "pipeopt.result": 4,
    "pipeopt.simulate": 4.5,  # the executor of a schedule: reads pipeopt.schedules' orders and names
    "pipeopt.schedules": 4,
    "pipeopt.backends": 5,
    "pipeopt.problems": 6,
    "pipeopt.problems.method": 6,
    "pipeopt.problems.partition": 7,
    "pipeopt.problems.placement": 7,  # Tarnawski et al.'s max-load: reads the ideal lattice, not partition
    "pipeopt.problems.bipartition": 8,
    "pipeopt.problems.resource": 8,
    "pipeopt.problems.schedule": 8,  # the split of a schedule's chunks: reuses partition's pieces
    "pipeopt.registry": 9,
    "pipeopt.solve": 10,
    "pipeopt.sweep": 10,  # where the bench's solves run (reads instances, calls what bench hands it)
    "pipeopt.rowlog": 10,  # the bench's partial CSV
    "pipeopt.bench": 11,
    "pipeopt.plot": 11,
    "pipeopt.cli": 12,
    "pipeopt": 13,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> nx.DiGraph:
    """Module -> module arrows of every import in pipeopt/ (also imports inside functions)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for me, path in modules.items():
        package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # "from . import x" imports the submodule x when there is one
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
                targets = subs if subs else [mod]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != me:
                    g.add_edge(me, t)
    return g


def group(module: str) -> str:
    """The entry of :data:`RANKS` a module belongs to (its longest matching prefix)."""
    best = max((k for k in RANKS if module == k or module.startswith(k + ".")), key=len)
    return best


def test_every_module_has_a_rank():
    for m in import_graph():
        assert group(m) in RANKS


def test_import_graph_has_no_cycle():
    g = import_graph()
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles[:5]}"


@pytest.mark.parametrize("arrow", sorted(import_graph().edges), ids=lambda e: f"{e[0]}->{e[1]}")
def test_imports_go_one_way(arrow):
    a, b = arrow
    ga, gb = group(a), group(b)
    if ga == gb or gb == "pipeopt" and b != "pipeopt":
        return
    assert RANKS[ga] > RANKS[gb], f"{a} (layer {ga}) must not import {b} (layer {gb})"


def test_problems_do_not_import_each_others_internals_backwards():
    """problems/<name> import only their own folder, problems.method, lower layers, and the
    partition problem (bipartition and the resource problems build on it); never the reverse."""
    g = import_graph()
    for a, b in g.edges:
        if a.startswith("pipeopt.problems.partition"):
            assert not b.startswith(("pipeopt.problems.resource", "pipeopt.problems.bipartition")), (a, b)
