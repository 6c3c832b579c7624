"""The layer graph a PipeDream profile is read into (:class:`pipeopt.graph.LazyDiGraph`) reads
exactly as the ``networkx.DiGraph`` built by the same calls, and becomes one in place when
anything needs networkx; the lazy method table of the partition problem gives the real functions."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from pipeopt.cost.arrays import LayerArrays
from pipeopt.graph import Chain, LazyDiGraph, as_networkx, is_networkx_graph, layer_order, validate_graph
from pipeopt.io.pipedream import _read_graph, read_pipedream, read_pipedream_graph

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
NAMES = sorted(p.stem for p in PROFILES.glob("*.txt") if p.name != "LICENSE.txt")


def _both():
    """A small DAG built the same way as a LazyDiGraph and as a networkx.DiGraph."""
    out = []
    for g in (LazyDiGraph(name="g"), nx.DiGraph(name="g")):
        g.add_node("b", fwd={"gpu": 1.0}, bwd={"gpu": 2.0}, out_bytes=3.0, act_bytes=3.0, param_bytes=1.0)
        g.add_node("a", fwd={"gpu": 1.0}, bwd={"gpu": 2.0}, out_bytes=5.0, act_bytes=5.0, param_bytes=0.0,
                   pin_first=True)
        g.add_edge("a", "b")
        g.add_edge("b", "c", bytes=7.0)
        g.add_edge("a", "c")
        g.nodes["c"].update(fwd={"gpu": 0.5}, bwd={"gpu": 0.5}, out_bytes=1.0, act_bytes=1.0, param_bytes=2.0)
        g.add_node("b", extra=1)
        out.append(g)
    return out


def test_reads_as_the_networkx_graph_built_the_same_way():
    lazy, ref = _both()
    assert isinstance(lazy, LazyDiGraph) and not isinstance(lazy, nx.DiGraph)
    assert list(lazy) == list(ref) and len(lazy) == len(ref) and lazy.number_of_nodes() == ref.number_of_nodes()
    assert lazy.number_of_edges() == ref.number_of_edges()
    assert list(lazy.nodes) == list(ref.nodes) and "a" in lazy.nodes and "z" not in lazy and [] not in lazy
    assert list(lazy.nodes(data=True)) == list(ref.nodes(data=True))
    assert list(lazy.nodes(data="pin_first", default=False)) == list(ref.nodes(data="pin_first", default=False))
    assert list(lazy.edges) == list(ref.edges) and len(lazy.edges) == len(ref.edges)
    assert list(lazy.edges(data=True)) == list(ref.edges(data=True))
    assert list(lazy.edges(data="bytes")) == list(ref.edges(data="bytes"))
    assert lazy.edges["b", "c"] == ref.edges["b", "c"] and ("a", "c") in lazy.edges
    assert [(u, dict(s)) for u, s in lazy.adjacency()] == [(u, dict(s)) for u, s in ref.adjacency()]
    for u in ref:
        assert list(lazy.successors(u)) == list(ref.successors(u))
        assert list(lazy.predecessors(u)) == list(ref.predecessors(u))
        assert lazy.in_degree(u) == ref.in_degree(u) and lazy.out_degree(u) == ref.out_degree(u)
    assert lazy.graph == ref.graph and lazy.is_directed() and not lazy.is_multigraph()
    assert lazy.has_edge("a", "b") and not lazy.has_edge("c", "a") and lazy.has_node("c")
    assert isinstance(lazy, LazyDiGraph)  # none of the above needed networkx
    assert layer_order(lazy) == layer_order(ref)
    validate_graph(lazy)
    validate_graph(ref)


def test_becomes_a_networkx_graph_in_place_on_other_use():
    lazy, ref = _both()
    sub = lazy.subgraph(["a", "b"])  # not answered by the lazy graph: it switches
    assert type(lazy) is nx.DiGraph and list(sub) == ["b", "a"]
    assert nx.utils.graphs_equal(lazy, ref)
    assert list(lazy.edges(data=True)) == list(ref.edges(data=True))
    lazy2, _ = _both()
    assert as_networkx(lazy2) is lazy2 and type(lazy2) is nx.DiGraph
    assert is_networkx_graph(lazy2) and is_networkx_graph(LazyDiGraph()) and not is_networkx_graph({})


def test_copies_and_pickles():
    lazy, ref = _both()
    for other in (pickle.loads(pickle.dumps(lazy)), copy.deepcopy(lazy), copy.copy(lazy)):
        assert type(other) is LazyDiGraph
        assert list(other.nodes(data=True)) == list(ref.nodes(data=True))
        assert list(other.edges(data=True)) == list(ref.edges(data=True))


def test_a_cycle_is_named():
    g = LazyDiGraph()
    for u, v in (("x", "y"), ("y", "z"), ("z", "x")):
        g.add_edge(u, v)
    for n in g:
        g.nodes[n].update(fwd={"gpu": 1.0}, bwd={"gpu": 1.0}, out_bytes=1.0, act_bytes=1.0, param_bytes=0.0)
    from pipeopt.errors import InvalidGraphError

    with pytest.raises(InvalidGraphError, match="cycle"):
        validate_graph(g)


@pytest.mark.parametrize("name", NAMES)
def test_profile_reads_as_before(name):
    """The lazy read of every shipped profile gives the networkx reader's graph, layer order, chain
    and arrays."""
    path = PROFILES / f"{name}.txt"
    lazy, ref = _read_graph(path, count_input_time=False, kind="gpu"), read_pipedream_graph(path)
    assert type(ref) is nx.DiGraph
    assert list(lazy.nodes(data=True)) == list(ref.nodes(data=True))
    assert list(lazy.edges(data=True)) == list(ref.edges(data=True))
    assert layer_order(lazy) == layer_order(ref)
    a, b = Chain.from_graph(lazy), Chain.from_graph(ref)
    assert a.units == b.units and np.array_equal(a.act, b.act) and np.array_equal(a.fwd["gpu"], b.fwd["gpu"])
    la, lb = LayerArrays(lazy), LayerArrays(ref)
    assert np.array_equal(la.edge_bytes, lb.edge_bytes) and np.array_equal(la.tail, lb.tail)
    assert isinstance(lazy, LazyDiGraph)
    inst = read_pipedream(path)
    assert isinstance(inst.graph, LazyDiGraph)


def test_lazy_method_table_gives_the_real_functions():
    from pipeopt import registry
    from pipeopt.problems.partition import milp, solve_milp

    assert solve_milp is milp.solve_milp
    spec = registry.method("partition", "milp")
    assert spec.function.load() is milp.solve_milp and spec.function.__name__ == "solve_milp"
    assert pickle.loads(pickle.dumps(spec.function)).load() is milp.solve_milp
