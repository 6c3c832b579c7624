"""Costs per pass: the optional ``bwd_w`` (weight gradient W of the backward, I = B - W),
its default W = B / 2, and :func:`pipeopt.cost.passes.pass_times`, whose F, B and transfers
are :func:`pipeopt.evaluate`'s."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph, instances

from pipeopt import Cluster, Device, Instance, InvalidGraphError, InvalidPlanError, Plan, Stage, evaluate
from pipeopt.cost import rules
from pipeopt.cost.passes import (
    DEFAULT_W_SHARE,
    backward_split,
    layers_without_split,
    pass_times,
    weight_split_assumption,
)
from pipeopt.io.native import from_dict, to_dict


def chain(n: int = 4, w=None) -> nx.DiGraph:
    """Layer i: (i + 1) x 10 / 20 ms, (i + 1) MB out, 10 MB of activations, (i + 1) x 100 kB of
    weights; ``w[i]`` (if given and not None) its weight-gradient seconds ``bwd_w``."""
    k = range(1, n + 1)
    g = chain_graph([0.01 * i for i in k], [0.02 * i for i in k], [1e6 * i for i in k], 1e7,
                    [1e5 * i for i in k])
    for i, x in enumerate(w or []):
        if x is not None:
            g.nodes[f"l{i}"]["bwd_w"] = {"gpu": x}
    return g


@pytest.mark.parametrize("bad, message", [
    ([0.5], "must be a dict"),
    ({"gpu": 0.03}, r"in \[0, bwd = 0.02\]"),
    ({"gpu": -1e-3}, "must be a number"),
    ({"gpu": float("nan")}, "must be a number"),
    ({"gpu": True}, "must be a number"),
    ({"cpu": 0.001}, "no finite backward time"),
])
def test_bwd_w_is_validated(bad, message):
    g = chain(2)
    g.nodes["l0"]["bwd_w"] = bad
    with pytest.raises(InvalidGraphError, match=message):
        Instance(g, Cluster.homogeneous(2))


def test_bwd_w_round_trips_through_the_native_format():
    g = chain(3, w=[0.004, None, 0.06])
    inst = Instance(g, Cluster.homogeneous(2))
    back = from_dict(to_dict(inst))
    assert back.graph.nodes["l0"]["bwd_w"] == {"gpu": 0.004}
    assert "bwd_w" not in back.graph.nodes["l1"]
    assert to_dict(back) == to_dict(inst)


def test_default_w_is_half_the_backward_and_given_w_is_used():
    g = chain(3, w=[0.004, None, 0.0])
    assert DEFAULT_W_SHARE == 0.5
    i_load, w_load = backward_split(g, ["l0", "l1", "l2"])
    assert w_load["gpu"] == pytest.approx(0.004 + 0.02 + 0.0)  # l1: half of its 0.04
    assert i_load["gpu"] + w_load["gpu"] == pytest.approx(0.02 + 0.04 + 0.06)
    assert layers_without_split(g) == ["l1"]
    note = weight_split_assumption(g)
    assert "W = B/2" in note and "1 of 3 layers" in note and "'l1'" in note
    assert weight_split_assumption(chain(2, w=[0.01, 0.0])) is None
    assert "every layer" in weight_split_assumption(chain(2))


def test_pass_times_split_the_backward_op():
    inst = Instance(chain(4, w=[0.004, None, 0.0, 0.08]), Cluster.homogeneous(2, bandwidth=1e9),
                    assumptions=("bandwidth assumed",))
    plan = Plan((Stage(("l0", "l1"), ("gpu0",)), Stage(("l2", "l3"), ("gpu1",))))
    t = pass_times(inst, plan)
    ev = evaluate(inst, plan)
    assert t.forward == tuple(ev.forward_op) and t.backward == tuple(ev.backward_op)
    assert t.weight_grad[0] == pytest.approx(0.004 + 0.02) and t.weight_grad[1] == pytest.approx(0.08)
    for i, w, b in zip(t.input_grad, t.weight_grad, t.backward, strict=True):
        assert i + w == pytest.approx(b, rel=1e-15)
    assert t.act_bytes == (2e7, 2e7) and t.param_bytes == (3e5, 7e5)
    assert t.assumptions[0] == "bandwidth assumed" and "W = B/2" in t.assumptions[1]


def test_two_kinds_share_b_in_the_ratio_of_load_times():
    g = chain(2)
    for n in g.nodes:
        g.nodes[n]["fwd"]["cpu"] = 0.1
        g.nodes[n]["bwd"]["cpu"] = 0.3
        g.nodes[n]["bwd_w"] = {"gpu": 0.005, "cpu": 0.25}
    dev = (Device("w0", {"gpu": 1.0, "cpu": 2.0}), Device("w1", {"gpu": 1.0, "cpu": 2.0}))
    inst = Instance(g, Cluster(dev, bandwidth=1e9))
    plan = Plan((Stage(("l0",), ("w0",)), Stage(("l1",), ("w1",))))
    t = pass_times(inst, plan)
    res = {"gpu": 1.0, "cpu": 2.0}
    i_load, w_load = backward_split(g, ["l1"])
    ti, tw = rules.load_time(res, i_load), rules.load_time(res, w_load)
    assert t.weight_grad[1] / t.backward[1] == pytest.approx(tw / (ti + tw), rel=1e-12)
    assert t.input_grad[1] + t.weight_grad[1] == pytest.approx(t.backward[1], rel=1e-15)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=7, memory=False, alpha=True), data=st.data())
def test_one_stage_per_rank_passes_are_evaluates_ops(inst, data):
    """F, B and the transfers are evaluate's ops of the same plan (transfers beside compute)."""
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 4)))
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    plan = Plan(tuple(Stage(layers, (f"gpu{s}",)) for s, layers in enumerate(inst.chain.stages_from_cuts(cuts))))
    t = pass_times(inst, plan)
    ev = evaluate(inst.with_settings(overlap=True), plan)
    assert t.forward == tuple(ev.forward_op) and t.backward == tuple(ev.backward_op)
    assert t.send_forward == tuple(ev.pipeline["x"]) and t.send_backward == tuple(ev.pipeline["y"])
    assert t.overlap == inst.settings.overlap
    assert all(math.isclose(i + w, b, rel_tol=1e-12, abs_tol=1e-18)
               for i, w, b in zip(t.input_grad, t.weight_grad, t.backward, strict=True))
    assert all(w == pytest.approx(b / 2, rel=1e-12, abs=1e-18) for w, b in zip(t.weight_grad, t.backward, strict=True))


def test_chunks_that_a_schedule_cannot_run_are_refused():
    inst = Instance(chain(4), Cluster.homogeneous(4))
    ok = (Stage(("l0",), ("gpu0",)), Stage(("l1",), ("gpu1",)), Stage(("l2",), ("gpu0",)), Stage(("l3",), ("gpu1",)))
    assert pass_times(inst, Plan(ok)).chunks == 4  # chunks 0, 2 on one rank, 1, 3 on the other
    with pytest.raises(InvalidPlanError, match="no replicas"):
        pass_times(inst, Plan((Stage(("l0", "l1"), ("gpu0", "gpu1"), replicas=2), Stage(("l2", "l3"), ("gpu2",)))))
    with pytest.raises(InvalidPlanError, match="no forward share"):
        pass_times(inst, Plan((Stage(("l0", "l1"), ("gpu0",), beta={"gpu": 0.5}), Stage(("l2", "l3"), ("gpu2",)))))
    with pytest.raises(InvalidPlanError, match="same devices"):
        pass_times(inst, Plan((Stage(("l0", "l1"), ("gpu0", "gpu1")), Stage(("l2", "l3"), ("gpu1",)))))
    with pytest.raises(InvalidPlanError, match="unknown device"):
        pass_times(inst, Plan((Stage(("l0", "l1"), ("gpu9",)), Stage(("l2", "l3"), ("gpu1",)))))
    with pytest.raises(InvalidPlanError, match="dropped"):
        pass_times(inst, Plan((Stage(("l0",), ("gpu0",)), Stage(("l2", "l3"), ("gpu1",)))))
    g = chain(2)
    g.nodes["l1"]["fwd"] = {"cpu": 0.1}
    g.nodes["l1"]["bwd"] = {"cpu": 0.1}
    mixed = Instance(g, Cluster((Device("g", {"gpu": 1.0}), Device("c", {"cpu": 1.0}))))
    with pytest.raises(InvalidPlanError, match="chunk 0 holds a layer"):
        pass_times(mixed, Plan((Stage(("l0", "l1"), ("g",)),)))
