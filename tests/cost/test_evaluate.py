"""The one cost model on hand-derived cases, and the typed errors for invalid plans."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from strategies import chain_graph

from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate
from pipeopt.errors import InvalidPlanError, InvalidProblemError


def chain(specs, kind="gpu"):
    """specs: list of (fwd, bwd, out_bytes, act_bytes, param_bytes)."""
    return chain_graph(*(list(column) for column in zip(*specs)), kind=kind)


def two_layer(overlap=True, memory=math.inf, stash=False):
    g = chain([(1.0, 2.0, 10.0, 3.0, 1.0), (3.0, 1.0, 0.0, 5.0, 2.0)])
    cluster = Cluster.homogeneous(4, units=2.0, memory=memory, bandwidth=20.0)
    return Instance(g, cluster, Settings(overlap=overlap, weight_stashing=stash))


PLAN2 = Plan((Stage(("l0",), ("gpu0",)), Stage(("l1",), ("gpu1",))))


def test_sequential_two_stages_with_overlap():
    # stage 0: (1 + 2) / 2 units = 1.5 s; stage 1: (3 + 1) / 2 = 2 s; cut: 10 B / 20 B/s = 0.5 s
    # each way, at once (full duplex): 0.5 s per microbatch, a round trip of 1 s
    ev = evaluate(two_layer(), PLAN2)
    assert ev.stage_time == [1.5, 2.0]
    assert ev.comm_time == [0.5] and ev.round_trip == [1.0]
    assert ev.forward_time == [0.5, 1.5] and ev.backward_time == [1.0, 0.5]
    assert ev.forward_op == [0.5, 1.5] and ev.backward_op == [1.0, 0.5]
    # the window row: stage 0 keeps 2 microbatches in flight, and one microbatch's round trip
    # through both stages takes 1.5 + 2 + 1 = 4.5 s, so T >= 4.5 / 2 = 2.25 s > max(1.5, 2, 0.5)
    assert ev.in_flight == [2, 1]
    assert ev.bottleneck == 2.25 and ev.objective == 2.25 and ev.throughput == 1 / 2.25


def test_without_overlap_each_stage_pays_what_it_sends():
    # stage 0 sends 10 B of activations (0.5 s), stage 1 sends 10 B of gradients back (0.5 s);
    # no link op, so the window row is (2 + 2.5) / 2 = 2.25 s, below stage 1's 2.5 s
    ev = evaluate(two_layer(overlap=False), PLAN2)
    assert ev.stage_time == [2.0, 2.5]
    assert ev.forward_op == [1.0, 1.5] and ev.backward_op == [1.0, 1.0]
    assert ev.round_trip == [0.0]
    assert ev.bottleneck == 2.5


def test_memory_under_1f1b_and_weight_stashing():
    # stage 0 of 2 keeps 2 microbatches: 2 * 3 + 1 = 7 B; stage 1 keeps 1: 5 + 2 = 7 B
    ev = evaluate(two_layer(), PLAN2)
    assert ev.memory == [7.0, 7.0] and ev.feasible
    # with weight stashing stage 0 also keeps 2 weight versions: 2 * 3 + 2 * 1 = 8 B
    assert evaluate(two_layer(stash=True), PLAN2).memory == [8.0, 7.0]
    ev = evaluate(two_layer(memory=7.5, stash=True), PLAN2)
    assert not ev.feasible and "stage 0 needs" in ev.violations[0]


def test_iteration_time_is_the_1f1b_flush_by_hand():
    # M = 4 under 1F1B with a flush. Ops: stage 0 F 0.5, B 1; stage 1 F 1.5, B 0.5; transfers
    # X (activation), Y (gradient) 0.5 s, one per direction at a time. Orders: stage 0
    # F0 F1 B0 F2 B1 F3 B2 B3, stage 1 F0 B0 F1 B1 F2 B2 F3 B3.
    #   s0 F0 [0, .5] X0 [.5, 1]  F1 [.5, 1] X1 [1, 1.5]
    #   s1 F0 [1, 2.5] B0 [2.5, 3] Y0 [3, 3.5]  F1 [3, 4.5] B1 [4.5, 5] Y1 [5, 5.5]
    #   s0 B0 [3.5, 4.5] F2 [4.5, 5] X2 [5, 5.5]  B1 [5.5, 6.5] F3 [6.5, 7] X3 [7, 7.5]
    #   s1 F2 [5.5, 7] B2 [7, 7.5] Y2 [7.5, 8]  F3 [7.5, 9] B3 [9, 9.5] Y3 [9.5, 10]
    #   s0 B2 [8, 9] B3 [10, 11]: 11 s
    inst = two_layer().with_settings(microbatches=4)
    ev = evaluate(inst, PLAN2)
    assert ev.iteration_time == 11.0
    assert evaluate(inst.with_settings(objective="iteration"), PLAN2).objective == 11.0
    with pytest.raises(InvalidProblemError, match="'makespan' is now 'iteration'"):
        evaluate(inst.with_settings(objective="makespan"), PLAN2)


def test_gpipe_objective_is_the_fill_drain_time():
    # M = 8 (the default). Two flow shops of identical jobs: forward over stage 0 (0.5), the
    # link (0.5), stage 1 (1.5): 2.5 + 7 * 1.5; backward over stage 1 (0.5), the link (0.5),
    # stage 0 (1.0): 2 + 7 * 1.0. In all 4.5 + 7 * (1.5 + 1.0) = 22 s
    ev = evaluate(two_layer().with_settings(objective="gpipe"), PLAN2)
    assert ev.objective == ev.gpipe_time == 22.0


def test_replicated_stage_pays_the_all_reduce():
    g = chain([(1.0, 1.0, 0.0, 0.0, 40.0)])
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=10.0))
    plan = Plan((Stage(("l0",), ("gpu0", "gpu1"), replicas=2),))
    # per replica compute 2 s; ring all-reduce 2 * (2 - 1) / 2 * 40 B / 10 B/s = 4 s; (2 + 4) / 2 = 3 s
    assert evaluate(inst, plan).bottleneck == pytest.approx(3.0)


def multi_kind_instance():
    g = nx.DiGraph()
    g.add_node("x", fwd={"cpu": 4.0, "gpu": 1.0}, bwd={"cpu": 4.0, "gpu": 4.0}, out_bytes=0.0, act_bytes=0.0, param_bytes=0.0)
    return Instance(g, Cluster((Device("soc", {"cpu": 1.0, "gpu": 1.0}),)))


def test_split_execution_by_hand():
    inst = multi_kind_instance()
    # gpu for the forward (1 s), cpu for the backward (4 s): tau = max(1, 4) = 4 s
    plan = Plan((Stage(("x",), ("soc",), beta={"cpu": 0.0, "gpu": 1.0}),))
    assert evaluate(inst, plan).bottleneck == pytest.approx(4.0)
    # sequential: rate 1/8 + 1/5 = 0.325 per second
    seq = Plan((Stage(("x",), ("soc",)),))
    assert evaluate(inst, seq).bottleneck == pytest.approx(1 / 0.325)
    # gpu split 1/5 forward, 4/5 backward; cpu all backward: forward 1/(0.2/1) = 5 ... worse
    plan2 = Plan((Stage(("x",), ("soc",), beta={"cpu": 0.0, "gpu": 0.2}),))
    # forward rate 0.2; backward rate 1/4 + 0.8/4 = 0.45 -> tau = max(5, 2.222) = 5
    assert evaluate(inst, plan2).bottleneck == pytest.approx(5.0)


def test_bad_plans_raise_typed_errors():
    inst = two_layer()
    bad = {
        "dropped": Plan((Stage(("l0",), ("gpu0",)),)),
        "in stages": Plan((Stage(("l0", "l1"), ("gpu0",)), Stage(("l1",), ("gpu1",)))),
        "empty": Plan((Stage(("l0", "l1"), ("gpu0",)), Stage((), ("gpu1",)))),
        "goes from stage 1 back": Plan((Stage(("l1",), ("gpu0",)), Stage(("l0",), ("gpu1",)))),
        "unknown device": Plan((Stage(("l0",), ("gpuX",)), Stage(("l1",), ("gpu1",)))),
        "used by stages": Plan((Stage(("l0",), ("gpu0",)), Stage(("l1",), ("gpu0",)))),
        "unknown layer": Plan((Stage(("l0", "zz"), ("gpu0",)), Stage(("l1",), ("gpu1",)))),
        "outside \\[0, 1\\]": Plan((Stage(("l0",), ("gpu0",), beta={"gpu": 1.5}), Stage(("l1",), ("gpu1",)))),
        "no stages": Plan(()),
    }
    for needle, plan in bad.items():
        with pytest.raises(InvalidPlanError, match=needle):
            evaluate(inst, plan)


def test_pinned_input_must_be_in_first_stage():
    g = chain([(0.0, 0.0, 1.0, 0.0, 0.0), (1.0, 1.0, 0.0, 0.0, 0.0)])
    g.nodes["l0"]["pin_first"] = True
    g.remove_edge("l0", "l1")
    inst = Instance(g, Cluster.homogeneous(2))
    with pytest.raises(InvalidPlanError, match="input layer"):
        evaluate(inst, Plan((Stage(("l1",), ("gpu0",)), Stage(("l0",), ("gpu1",)))))
