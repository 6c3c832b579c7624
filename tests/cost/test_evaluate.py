"""The one cost model on hand-derived cases, and the typed errors for invalid plans."""

from __future__ import annotations

import math

import networkx as nx
import pytest

from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate
from pipeopt.errors import InvalidPlanError


def chain(specs, kind="gpu"):
    """specs: list of (fwd, bwd, out_bytes, act_bytes, param_bytes)."""
    g = nx.DiGraph()
    for i, (f, b, o, a, p) in enumerate(specs):
        g.add_node(f"l{i}", fwd={kind: f}, bwd={kind: b}, out_bytes=o, act_bytes=a, param_bytes=p)
        if i:
            g.add_edge(f"l{i - 1}", f"l{i}")
    return g


def two_layer(overlap=True, memory=math.inf, stash=False):
    g = chain([(1.0, 2.0, 10.0, 3.0, 1.0), (3.0, 1.0, 0.0, 5.0, 2.0)])
    cluster = Cluster.homogeneous(4, units=2.0, memory=memory, bandwidth=20.0)
    return Instance(g, cluster, Settings(overlap=overlap, weight_stashing=stash))


PLAN2 = Plan((Stage(("l0",), ("gpu0",)), Stage(("l1",), ("gpu1",))))


def test_sequential_two_stages_with_overlap():
    # stage 0: (1 + 2) / 2 units = 1.5 s; stage 1: (3 + 1) / 2 = 2 s; cut: 2 * 10 B / 20 B/s = 1 s
    ev = evaluate(two_layer(), PLAN2)
    assert ev.stage_time == [1.5, 2.0]
    assert ev.comm_time == [1.0]
    assert ev.bottleneck == 2.0 and ev.objective == 2.0 and ev.throughput == 0.5
    assert ev.forward_time == [0.5, 1.5] and ev.backward_time == [1.0, 0.5]


def test_without_overlap_each_stage_pays_what_it_sends():
    # stage 0 sends 10 B of activations (0.5 s), stage 1 sends 10 B of gradients back (0.5 s)
    ev = evaluate(two_layer(overlap=False), PLAN2)
    assert ev.stage_time == [2.0, 2.5]
    assert ev.bottleneck == 2.5


def test_memory_under_1f1b_and_weight_stashing():
    # stage 0 of 2 keeps 2 microbatches: 2 * 3 + 1 = 7 B; stage 1 keeps 1: 5 + 2 = 7 B
    ev = evaluate(two_layer(), PLAN2)
    assert ev.memory == [7.0, 7.0] and ev.feasible
    # with weight stashing stage 0 also keeps 2 weight versions: 2 * 3 + 2 * 1 = 8 B
    assert evaluate(two_layer(stash=True), PLAN2).memory == [8.0, 7.0]
    ev = evaluate(two_layer(memory=7.5, stash=True), PLAN2)
    assert not ev.feasible and "stage 0 needs" in ev.violations[0]


def test_iteration_time_is_the_flow_shop_estimate():
    inst = two_layer().with_settings(microbatches=4)
    ev = evaluate(inst, PLAN2)
    # sum of stage and link times 1.5 + 1 + 2 = 4.5, plus (M - 1) * bottleneck = 3 * 2
    assert ev.iteration_time == pytest.approx(10.5)
    assert evaluate(inst.with_settings(objective="makespan"), PLAN2).objective == pytest.approx(10.5)


def test_gpipe_objective_is_max_forward_plus_max_backward():
    ev = evaluate(two_layer().with_settings(objective="gpipe"), PLAN2)
    # forward phase: max(0.5, 1.5, link 10/20 = 0.5) = 1.5; backward: max(1.0, 0.5, 0.5) = 1.0
    assert ev.objective == pytest.approx(2.5)


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
