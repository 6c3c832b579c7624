"""The CostTable is the cost model's rules tabulated: every entry equals what evaluate
computes for the same contiguous stage (random DAG instances, non-integral bytes)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import compositions, instances

from pipeopt import Cluster, Instance, Plan, Stage, evaluate
from pipeopt.cost import CostTable, rules


def _plan(inst, starts):
    layer_sets = inst.chain.stages_from_cuts(starts)
    names = [d.name for d in inst.cluster.devices]
    return Plan(tuple(Stage(layers, (names[i],)) for i, layers in enumerate(layer_sets)))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(inst=instances(max_layers=7), data=st.data())
def test_table_entries_equal_evaluate_on_every_stage(inst, data):
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 4)))
    starts = data.draw(st.sampled_from(list(compositions(n, S))))
    table = CostTable(inst, S)
    ev = evaluate(inst, _plan(inst, starts))
    bounds = [0, *starts, n]
    r = inst.cluster.devices[0].resources["gpu"]
    wp = table.work_prefix("gpu", r)
    for t in range(S):
        a, b = bounds[t], bounds[t + 1]
        assert math.isclose(table.stage_memory(a, b, t), ev.memory[t], rel_tol=1e-9, abs_tol=1e-6)
        assert math.isclose(table.memory(a, b, S - t), ev.memory[t], rel_tol=1e-9, abs_tol=1e-6)
        compute = wp[b] - wp[a]
        if inst.settings.overlap:
            assert math.isclose(compute, ev.stage_time[t], rel_tol=1e-9, abs_tol=1e-12)
        else:
            expect = compute + table.send_time[a] + table.send_time[b]
            assert math.isclose(expect, ev.stage_time[t], rel_tol=1e-9, abs_tol=1e-12)
    for c, start in enumerate(starts):
        assert math.isclose(table.boundary_bytes[start], ev.comm_bytes_forward[c], rel_tol=1e-12)
        assert math.isclose(table.cut_time[start], ev.comm_time[c], rel_tol=1e-12)


def test_fits_at_exactly_the_capacity_with_non_integral_bytes():
    # three layers whose activation sum is not representable exactly: 0.1 + 0.2 + 0.3
    g = nx.DiGraph()
    for i, (act, par) in enumerate([(0.1, 0.7), (0.2, 0.0), (0.3, 0.0)]):
        g.add_node(f"l{i}", fwd={"gpu": 1.0}, bwd={"gpu": 1.0}, out_bytes=1.0, act_bytes=act, param_bytes=par)
        if i:
            g.add_edge(f"l{i - 1}", f"l{i}")
    need = 0.1 + 0.2 + 0.3 + 0.7  # one stage, one microbatch in flight
    inst = Instance(g, Cluster.homogeneous(1, memory=1.3, bandwidth=1.0))
    table = CostTable(inst, 1)
    assert table.fits(table.stage_memory(0, 3, 0), 1.3)
    assert evaluate(inst, _plan(inst, [])).feasible
    assert math.isclose(need, 1.3)
    assert not rules.fits(1.3 * (1 + 1e-6), 1.3)


def test_rules_on_hand_derived_values():
    assert rules.transfer_time(10.0, 20.0) == 0.5
    assert rules.cut_time(10.0, 10.0, 20.0, links=2) == 0.25  # full duplex: the busier direction
    assert rules.cut_time(10.0, 30.0, 20.0) == 1.5
    assert rules.round_trip(10.0, 30.0, 20.0) == 2.0
    assert rules.allreduce_time(8.0, 1, 2.0) == 0.0
    assert rules.allreduce_time(8.0, 4, 2.0) == 2.0 * 3 / 4 * 4.0
    assert rules.replicated_time(3.0, 8.0, 4, 2.0) == (3.0 + 6.0) / 4
    assert rules.in_flight(1, 4) == 3
    assert rules.in_flight(0, 4, workers_after=5, replicas=2) == 3
    assert rules.in_flight(2, 4, gpipe=True, microbatches=8) == 8
    assert rules.weight_versions(3, True) == 3 and rules.weight_versions(3, False) == 1
    assert rules.stage_memory(2.0, 5.0, 3, 1) == 11.0
    assert rules.migration_bytes(6.0, 8.0, 4) == (6.0, 2.0)
    assert np.array_equal(rules.fits(np.array([1.0, 2.0]), 1.5), [True, False])
    assert rules.fits(1e30, math.inf)
