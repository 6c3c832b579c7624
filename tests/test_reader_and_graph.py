"""The PipeDream reader against values read off the files, and layer-graph validation."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from conftest import PROFILE_DIR, PROFILES, profile

from pipeopt import Cluster, Instance
from pipeopt.errors import InvalidClusterError, InvalidGraphError, ReadError
from pipeopt.cost import CostTable
from pipeopt.graph import layer_order
from pipeopt.io.pipedream import read_pipedream, read_pipedream_graph

# (nodes, distinct edges, forward ms without Input nodes, backward ms, Input data-loading ms),
# computed from the files with awk, independently of the reader.
FILE_FACTS = {
    "alexnet": (23, 23, 44.801, 40.520, 635.902),
    "vgg16": (41, 41, 233.902, 438.633, 17.972),
    "resnet50": (177, 193, 182.488, 260.931, 18.962),
    "gnmt": (48, 58, 33.533, 55.883, 0.0),
    "nasnetalarge": (1251, 1468, 409.087, 249.210, 7.046),
}


def test_all_profiles_load_as_dags():
    assert len(PROFILES) == 14
    for name in PROFILES:
        inst = profile(name)
        assert nx.is_directed_acyclic_graph(inst.graph)
        assert inst.chain.n >= 1
        # every layer is in exactly one unit of the chain, in a topological order
        seen = [n for unit in inst.chain.units for n in unit]
        assert sorted(seen) == sorted(inst.graph.nodes)
        pos = {n: i for i, n in enumerate(seen)}
        assert all(pos[u] < pos[v] for u, v in inst.graph.edges)


@pytest.mark.parametrize("name", sorted(FILE_FACTS))
def test_reader_matches_file_values(name):
    nodes, edges, fwd_ms, bwd_ms, input_ms = FILE_FACTS[name]
    g = read_pipedream_graph(PROFILE_DIR / f"{name}.txt")
    assert g.number_of_nodes() == nodes
    assert g.number_of_edges() == edges
    assert sum(d["gpu"] for _, d in g.nodes(data="fwd")) == pytest.approx(fwd_ms / 1000, rel=1e-9)
    assert sum(d["gpu"] for _, d in g.nodes(data="bwd")) == pytest.approx(bwd_ms / 1000, rel=1e-9)
    assert sum(t for _, t in g.nodes(data="load_time", default=0.0)) == pytest.approx(input_ms / 1000, rel=1e-9)


def test_input_time_counted_only_on_request():
    g = read_pipedream_graph(PROFILE_DIR / "alexnet.txt", count_input_time=True)
    assert g.nodes["node1"]["fwd"]["gpu"] == pytest.approx(0.635902)
    g0 = read_pipedream_graph(PROFILE_DIR / "alexnet.txt")
    assert g0.nodes["node1"]["fwd"]["gpu"] == 0.0 and g0.nodes["node1"]["pin_first"]


def test_inputs_are_glued_to_the_first_stage_unit():
    inst = profile("gnmt")
    first = inst.chain.units[0]
    assert {"node1", "node2", "node3"} <= set(first)  # Input0, Input1, Input2
    assert all(not inst.graph.nodes[n].get("pin_first") for unit in inst.chain.units[1:] for n in unit)


def test_gnmt_list_activation_sizes_are_summed():
    g = read_pipedream_graph(PROFILE_DIR / "gnmt.txt")
    assert g.nodes["node7"]["out_bytes"] == 6291456.0 + 131072.0 + 131072.0


def test_a_tensor_crosses_a_cut_once():
    g = nx.DiGraph()
    for i, b in enumerate([10.0, 20.0, 30.0, 40.0]):
        g.add_node(f"n{i}", fwd={"gpu": 1.0}, bwd={"gpu": 1.0}, out_bytes=b, act_bytes=0.0, param_bytes=0.0)
    g.add_edges_from([("n0", "n1"), ("n1", "n2"), ("n2", "n3"), ("n0", "n3")])
    g.edges["n0", "n3"]["bytes"] = 5.0
    table = CostTable(Instance(g, Cluster.homogeneous(2)), 2)
    # cut after n0: n0's tensor once, the largest of its edges beyond the cut (10, not 10 + 5);
    # after n1: n1->n2 (20) + n0's tensor relayed to n3 (5); after n2: n2->n3 (30) + 5
    assert list(table.boundary_bytes) == [0.0, 10.0, 25.0, 35.0, 0.0]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("garbage line\n", "not a PipeDream node"),
        ("node1 -- X -- forward_compute_time=-1.0, backward_compute_time=1.0, activation_size=1.0, parameter_size=0.0\n", "negative"),
        ("node1 -- X -- forward_compute_time=abc, backward_compute_time=1.0, activation_size=1.0, parameter_size=0.0\n", "not a number"),
        ("node1 -- X -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=1.0, parameter_size=0.0\n\tnode1 -- node9\n", "undeclared"),
        ("", "no layers"),
    ],
)
def test_malformed_profiles_raise_read_error(tmp_path, text, needle):
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(ReadError, match=needle):
        read_pipedream(p)


def test_missing_file_raises_read_error(tmp_path):
    with pytest.raises(ReadError, match="cannot read"):
        read_pipedream(tmp_path / "nope.txt")


def _layer(**over):
    attrs = dict(fwd={"gpu": 1.0}, bwd={"gpu": 2.0}, out_bytes=1.0, act_bytes=1.0, param_bytes=1.0)
    attrs.update(over)
    return attrs


def _instance(g):
    return Instance(g, Cluster.homogeneous(2))


def test_cycle_is_named():
    g = nx.DiGraph()
    for n in "abc":
        g.add_node(n, **_layer())
    g.add_edges_from([("a", "b"), ("b", "c"), ("c", "a")])
    with pytest.raises(InvalidGraphError, match="cycle: .*a.*b.*c"):
        _instance(g)


@pytest.mark.parametrize(
    ("attrs", "needle"),
    [
        ({"fwd": {"gpu": -1.0}}, "negative"),
        ({"bwd": {"gpu": math.nan}}, "negative or invalid"),
        ({"param_bytes": -5.0}, "param_bytes"),
        ({"fwd": {}, "bwd": {}}, "cannot run on any"),
        ({"bwd": {"cpu": 1.0}}, "forward times on"),
    ],
)
def test_bad_layer_attributes(attrs, needle):
    g = nx.DiGraph()
    g.add_node("x", **_layer(**attrs))
    with pytest.raises(InvalidGraphError, match=needle):
        _instance(g)


def test_missing_attribute_is_named():
    g = nx.DiGraph()
    attrs = _layer()
    del attrs["act_bytes"]
    g.add_node("x", **attrs)
    with pytest.raises(InvalidGraphError, match="'x' has no 'act_bytes'"):
        _instance(g)


def test_empty_graph_and_wrong_kind():
    with pytest.raises(InvalidGraphError, match="no layers"):
        _instance(nx.DiGraph())
    g = nx.DiGraph()
    g.add_node("x", **_layer(fwd={"npu": 1.0}, bwd={"npu": 1.0}))
    with pytest.raises(InvalidClusterError, match="runs only on"):
        _instance(g)


def test_layer_order_is_deterministic_and_natural():
    g = nx.DiGraph()
    for n in ["node10", "node2", "node1"]:
        g.add_node(n, **_layer())
    g.add_edges_from([("node1", "node2"), ("node1", "node10")])
    assert layer_order(g) == ["node1", "node2", "node10"]
