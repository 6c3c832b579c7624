"""The vectorised cost model (issue 11: the whole solve at n = 10^5, S = 1,024 within 1 s):
:func:`rules.crossing_bytes`, :attr:`CostTable.boundary_bytes` and :func:`pipeopt.evaluate` read
the graph once as arrays (:mod:`pipeopt.cost.arrays`). Here they are checked against
straightforward references written from the rules' definitions, layer by layer and cut by cut,
on small random graphs: non-integral byte counts, edge ``bytes`` that differ from the tail's
``out_bytes``, tensors read by several layers of one later stage (counted once per receiving
stage), several resource kinds (a layer missing a kind), pinned input layers, replicas."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate
from pipeopt.cost import CostTable, check_plan, rules
from pipeopt.cost.arrays import layer_arrays
from pipeopt.errors import InvalidPlanError

byte_counts = st.one_of(st.integers(0, 10**7).map(float), st.floats(0.0, 1e7, allow_nan=False))


def reference_crossing(graph, position: dict, count: int) -> list[float]:
    """Bytes at each boundary c, from the definition: every tensor (producer u) with a
    consumer beyond c crosses c once, carrying the largest bytes of its edges that reach
    beyond c."""
    out = []
    for c in range(count - 1):
        total = 0.0
        for u in graph.nodes:
            if position[u] > c:
                continue
            beyond = [graph.edges[u, v].get("bytes", graph.nodes[u]["out_bytes"])
                      for v in graph.successors(u) if position[v] > c]
            total += max(beyond, default=0.0)
        out.append(total)
    return out


def _atol(graph) -> float:
    """Bytes at a cut are differences of prefix sums (over the boundaries): exact up to the
    rounding of the largest partial sum, 1e-12 of all the bytes on the edges."""
    return 1e-12 * sum(graph.edges[u, v].get("bytes", graph.nodes[u]["out_bytes"]) for u, v in graph.edges)


@st.composite
def graphs(draw, max_layers: int = 9):
    """A chain plus skip edges, some edges with their own (non-integral) bytes, fwd/bwd on
    "gpu" and, for some layers, "cpu"; maybe a pinned input layer."""
    n = draw(st.integers(2, max_layers))
    g = nx.DiGraph()
    pin = draw(st.booleans())
    for i in range(n):
        t = draw(st.floats(1e-5, 1e-2))
        fwd, bwd = {"gpu": t}, {"gpu": 2.5 * t}
        if draw(st.booleans()):
            fwd["cpu"], bwd["cpu"] = 7 * t, 11 * t
        g.add_node(f"l{i}", fwd=fwd, bwd=bwd, out_bytes=draw(byte_counts), act_bytes=draw(byte_counts),
                   param_bytes=draw(byte_counts), **({"pin_first": True} if pin and i == 0 else {}))
    for i in range(n - 1):
        g.add_edge(f"l{i}", f"l{i + 1}")
    for a, b in draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n)):
        if a + 1 < b:
            g.add_edge(f"l{a}", f"l{b}")
    for u, v in list(g.edges):
        if draw(st.integers(0, 3)) == 0:
            g.edges[u, v]["bytes"] = draw(byte_counts)
    return g


@settings(max_examples=60, deadline=None, derandomize=True)
@given(g=graphs(), data=st.data())
def test_crossing_bytes_equals_the_definition(g, data):
    count = data.draw(st.integers(1, 5))
    order = list(g.nodes)
    # any monotone assignment of positions along the layer order (empty positions allowed)
    raw = sorted(data.draw(st.lists(st.integers(0, count - 1), min_size=len(order), max_size=len(order))))
    position = dict(zip(order, raw, strict=True))
    got = rules.crossing_bytes(g, position, count)
    want = reference_crossing(g, position, count)
    assert got.shape == (max(count - 1, 0),)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=_atol(g))
    # the same on the arrays, with positions as an array
    arr = layer_arrays(g)
    np.testing.assert_array_equal(rules.crossing_bytes(arr, np.array([position[u] for u in arr.nodes]), count), got)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(g=graphs(), data=st.data())
def test_evaluate_and_table_equal_a_layer_by_layer_reference(g, data):
    devices = tuple(Device(f"d{i}", {"gpu": 1.0, "cpu": data.draw(st.sampled_from([0.0, 4.0]))}, 3e9 * (1 + i % 2))
                    for i in range(8))
    settings_ = Settings(overlap=data.draw(st.booleans()), weight_stashing=data.draw(st.booleans()))
    inst = Instance(g, Cluster(devices, data.draw(st.sampled_from([1e9, 3.3e9]))), settings_)
    chain = inst.chain
    S = data.draw(st.integers(1, min(chain.n, 4)))
    starts = sorted(data.draw(st.sets(st.integers(1, chain.n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    layer_sets = chain.stages_from_cuts(starts)
    reps = [data.draw(st.integers(1, 2)) for _ in range(S)]
    stages, used = [], 0
    for layers, m in zip(layer_sets, reps, strict=True):
        beta = {"gpu": data.draw(st.floats(0.1, 0.9))} if data.draw(st.integers(0, 3)) == 0 else None
        stages.append(Stage(layers, tuple(f"d{j}" for j in range(used, used + m)), replicas=m, beta=beta))
        used += m
    plan = Plan(tuple(stages))
    ev = evaluate(inst, plan)

    # reference: every sum layer by layer, every cut by its definition
    where = {x: i for i, layers in enumerate(layer_sets) for x in layers}
    cut_bytes = reference_crossing(g, where, S)
    np.testing.assert_allclose(ev.comm_bytes_forward, cut_bytes, rtol=1e-12, atol=_atol(g))
    np.testing.assert_allclose(ev.comm_bytes_backward, cut_bytes, rtol=1e-12, atol=_atol(g))
    bw = inst.cluster.bandwidth
    for c in range(S - 1):
        links = min(reps[c], reps[c + 1])
        assert math.isclose(ev.comm_time[c], cut_bytes[c] / (bw * links), rel_tol=1e-12, abs_tol=_atol(g) / bw)
    workers_after = np.cumsum(reps[::-1])[::-1]
    for i, st_ in enumerate(stages):
        nodes = [g.nodes[x] for x in st_.layers]
        kinds = {k for d in nodes for k in d["fwd"]}
        F = {k: sum(d["fwd"].get(k, math.inf) for d in nodes) for k in kinds}
        B = {k: sum(d["bwd"].get(k, math.inf) for d in nodes) for k in kinds}
        res, _ = rules.pool([inst.cluster.device(d) for d in st_.devices], st_.replicas)
        f, b, _ = rules.stage_compute(res, F, B, st_.beta)
        assert math.isclose(ev.forward_time[i], f / st_.replicas, rel_tol=1e-12)
        assert math.isclose(ev.backward_time[i], b / st_.replicas, rel_tol=1e-12)
        kept = -(-int(workers_after[i]) // st_.replicas) * (2 if st_.beta is not None else 1)
        params = sum(d["param_bytes"] for d in nodes)
        acts = sum(d["act_bytes"] for d in nodes)
        mem = kept * acts + (kept if settings_.weight_stashing else 1) * params
        assert math.isclose(ev.memory[i], mem, rel_tol=1e-12, abs_tol=1e-9)

    # the table's boundary bytes: the same definition over the chain's units
    table = CostTable(inst, S)
    unit_of = chain.unit_of
    want = reference_crossing(g, unit_of, chain.n)
    np.testing.assert_allclose(table.boundary_bytes, [0.0, *want, 0.0], rtol=1e-12, atol=_atol(g))


def test_a_tensor_read_by_two_layers_of_the_next_stage_crosses_once():
    """l0 feeds l1 and l2 (both in stage 1) with 2.5 bytes and l3 (stage 2) with 1.25: the cut
    0|1 carries 2.5 once, the cut 1|2 carries l0's 1.25 (relayed) plus l1's and l2's outputs
    that stage 2 reads."""
    g = nx.DiGraph()
    for i, out in enumerate([2.5, 0.75, 0.5, 0.0]):
        g.add_node(f"l{i}", fwd={"gpu": 1e-3}, bwd={"gpu": 2e-3}, out_bytes=out, act_bytes=0.5, param_bytes=1.5)
    g.add_edges_from([("l0", "l1"), ("l0", "l2"), ("l1", "l2"), ("l2", "l3"), ("l1", "l3")])
    g.add_edge("l0", "l3", bytes=1.25)
    pos = {"l0": 0, "l1": 1, "l2": 1, "l3": 2}
    assert list(rules.crossing_bytes(g, pos, 3)) == [2.5, 1.25 + 0.75 + 0.5]
    inst = Instance(g, Cluster.homogeneous(3, memory=math.inf, bandwidth=1e9))
    plan = Plan((Stage(("l0",), ("gpu0",)), Stage(("l1", "l2"), ("gpu1",)), Stage(("l3",), ("gpu2",))))
    ev = evaluate(inst, plan)
    assert ev.comm_bytes_forward == [2.5, 2.5]
    assert ev.comm_bytes == [5.0, 5.0]


def test_empty_tensors_cross_as_zero_bytes_and_bipartition_adds_to_them():
    """Edges that cross cuts but carry no bytes: zeros, as floats (a migrated layer's input and
    weights are then added to them)."""
    g = nx.DiGraph()
    for i in range(3):
        g.add_node(f"l{i}", fwd={"gpu": 1e-3}, bwd={"gpu": 2e-3}, out_bytes=0.0, act_bytes=0.5, param_bytes=1.5)
    g.add_edges_from([("l0", "l1"), ("l1", "l2")])
    got = rules.crossing_bytes(g, {"l0": 0, "l1": 1, "l2": 2}, 3)
    assert got.dtype == float and list(got) == [0.0, 0.0]
    inst = Instance(g, Cluster.homogeneous(2, memory=math.inf, bandwidth=1e9), Settings(microbatches=3))
    # l1's forward on stage 0, its backward on stage 1: its input (0 bytes) goes 0 -> 1, its
    # weights (1.5 bytes) come back once per 3 microbatches
    plan = Plan((Stage(("l0", "l1"), ("gpu0",), bwd_layers=("l0",)), Stage(("l2",), ("gpu1",), bwd_layers=("l1", "l2"))))
    ev = evaluate(inst, plan)
    assert ev.comm_bytes_forward == [0.0] and ev.comm_bytes_backward == [0.5]


@pytest.mark.parametrize("fault, message", [
    (lambda s: (Stage(s[0].layers + s[1].layers[:1], s[0].devices), *s[1:]), "is in stages 0 and 1"),
    (lambda s: (Stage(s[0].layers[:-1], s[0].devices), *s[1:]), "dropped from the forward pass"),
    (lambda s: (Stage(s[0].layers + ("nope",), s[0].devices), *s[1:]), "unknown layer 'nope'"),
    (lambda s: (s[1], s[0], *s[2:]), "goes from stage"),
    (lambda s: (Stage((), s[0].devices), *s[1:]), "stage 0 is empty"),
])
def test_invalid_plans_are_named_as_before(fault, message):
    """The array check finds the fault; the layer-by-layer check names it (same messages)."""
    g = nx.DiGraph()
    for i in range(6):
        g.add_node(f"l{i}", fwd={"gpu": 1e-3}, bwd={"gpu": 2e-3}, out_bytes=1.0, act_bytes=1.0, param_bytes=1.0)
    g.add_edges_from((f"l{i}", f"l{i + 1}") for i in range(5))
    inst = Instance(g, Cluster.homogeneous(3, memory=math.inf, bandwidth=1e9))
    stages = (Stage(("l0", "l1"), ("gpu0",)), Stage(("l2", "l3"), ("gpu1",)), Stage(("l4", "l5"), ("gpu2",)))
    check_plan(inst, Plan(stages))
    with pytest.raises(InvalidPlanError, match=message):
        check_plan(inst, Plan(tuple(fault(stages))))
