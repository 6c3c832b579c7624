"""Activation recomputation in the one cost model (issue 25): ``Stage.recompute`` changes a
stage's memory and backward through :func:`pipeopt.cost.rules.recompute_terms` only, and
:func:`pipeopt.evaluate`, the simulator and the schedule executor agree on it.

Hand-computed cases first (full and selective, S = 1 and S = 2, memory exactly at the
capacity), then the I/W split of the split-backward schedules, then random chains with random
recompute sets (evaluate = simulate = execute to 1e-9), the JSON round trip and every typed
error.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_instance, layer_graphs

from pipeopt import Cluster, Instance, InvalidPlanError, Plan, Settings, Stage, evaluate
from pipeopt.cost import check_plan
from pipeopt.cost import rules
from pipeopt.cost.passes import pass_times
from pipeopt.schedules import make_schedule, run_schedule
from pipeopt.simulate import simulate

REL = 1e-9
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def close(a, b, rel=REL):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def three(devices=1, memory=math.inf, **kw):
    """l0 -> l1 -> l2: forward 1, 2, 3 s, backward 2, 4, 6 s, out 10, 20, 30 B, act 100, 200,
    300 B, 1 B of parameters each."""
    return chain_instance([1.0, 2.0, 3.0], [2.0, 4.0, 6.0], out=[10.0, 20.0, 30.0], act=[100.0, 200.0, 300.0],
                          param=1.0, devices=devices, memory=memory, bandwidth=1e15, **kw)


def one(rc=None):
    return Plan((Stage(("l0", "l1", "l2"), ("gpu0",), recompute=rc),))


def two(rc=None):
    return Plan((Stage(("l0", "l1"), ("gpu0",), recompute=rc), Stage(("l2",), ("gpu1",))))


# ---- hand-computed -------------------------------------------------------------------------


def test_one_stage_full_recompute_of_one_layer():
    inst = three()
    base = evaluate(inst, one())
    assert base.memory == [600.0 + 3.0] and base.bottleneck == 18.0
    ev = evaluate(inst, one({"l1": "full"}))
    # l1 keeps its input (l0's 10 B); its rerun forward (2 s) joins the backward: 12 + 2
    assert ev.activations == [100.0 + 10.0 + 300.0]
    assert ev.backward_op == [14.0] and ev.forward_op == [6.0] and ev.bottleneck == 20.0
    # while l2's backward runs the microbatch holds 110 + 300 = 410, its kept bytes: no excess
    assert ev.recompute_excess == [0.0] and ev.memory == [410.0 + 3.0]
    assert ev.recomputed == [1] and ev.notes and "recomputed: 1 layer (1 full)" in ev.notes[0]
    assert evaluate(inst.with_settings(objective="iteration", microbatches=4), one({"l1": "full"})).objective == 80.0


def test_one_stage_full_recompute_of_every_layer():
    ev = evaluate(three(), one({"l0": "full", "l1": "full", "l2": "full"}))
    # kept: l0 nothing (no predecessor), l1 10 B, l2 20 B; backward 12 + 6 s of rerun forward
    assert ev.activations == [30.0] and ev.backward_op == [18.0] and ev.bottleneck == 24.0
    # peak while l2's backward runs: 0 + 10 kept before it + its 300 re-created = 310
    assert rules.backward_peak([0.0, 10.0, 20.0], [100.0, 200.0, 300.0]) == 310.0
    assert ev.recompute_excess == [280.0] and ev.memory == [30.0 + 280.0 + 3.0]


def test_one_stage_selective_recompute():
    inst = three()
    inst.graph.nodes["l1"]["selective"] = {"act_bytes": 50.0, "fwd": {"gpu": 0.5}}
    ev = evaluate(inst, one({"l1": "selective"}))
    assert ev.activations == [100.0 + 50.0 + 300.0] and ev.backward_op == [12.5] and ev.bottleneck == 18.5
    assert ev.memory == [453.0] and ev.recompute_excess == [0.0]
    assert "1 selective" in ev.notes[0]
    assert rules.recompute_terms(inst.graph, "l1", "selective") == (50.0, {"gpu": 0.5})


def test_two_stages_full_recompute_memory_and_time():
    inst = three(devices=2)
    base = evaluate(inst, two())
    assert base.memory == [2 * 300.0 + 2.0, 300.0 + 1.0] and base.in_flight == [2, 1]
    ev = evaluate(inst, two({"l1": "full"}))
    # stage 0: 2 microbatches of 110 B kept; while l1's backward runs one holds 100 + 200 = 300:
    # excess 190 over its 110 (the other microbatch keeps 110): 2 * 110 + 190 + 2 parameters
    assert ev.activations == [110.0, 300.0] and ev.recompute_excess == [190.0, 0.0]
    assert ev.memory == [412.0, 301.0]
    assert ev.backward_op == [8.0, 6.0] and ev.bottleneck == 11.0  # stage 0: 3 + 6 + 2 of rerun forward
    both = evaluate(inst, two({"l0": "full", "l1": "full"}))
    assert both.activations == [10.0, 300.0] and both.memory == [2 * 10.0 + 190.0 + 2.0, 301.0]
    assert both.bottleneck == 12.0


def test_memory_binding_at_exactly_the_capacity():
    inst = three(devices=2, memory=412.0)
    assert not evaluate(inst, two()).feasible  # 602 B on stage 0
    ev = evaluate(inst, two({"l1": "full"}))
    assert ev.memory[0] == 412.0 and ev.feasible
    tight = three(devices=2, memory=411.0)
    assert not evaluate(tight, two({"l1": "full"})).feasible
    assert "stage 0 needs" in evaluate(tight, two({"l1": "full"})).violations[0]


def test_no_recompute_is_todays_model():
    inst = three(devices=2)
    ev = evaluate(inst, two())
    assert ev.recompute_excess == [] and ev.recomputed == [0, 0] and ev.notes == []
    assert evaluate(inst, two({})).memory == ev.memory  # {} is None


def test_measured_transients_with_recompute():
    """With measured transients the backward's excess is the transient one, with the
    re-created activations of a recomputed layer; a recomputed end drops saved_twice."""
    inst = three()
    g = inst.graph
    g.graph["transient_memory"] = True
    for n, t in zip(("l0", "l1", "l2"), (5.0, 7.0, 11.0), strict=True):
        g.nodes[n]["bwd_temp_bytes"] = t
    g.edges["l0", "l1"]["saved_twice_bytes"] = 4.0
    base = evaluate(inst, one())
    # kept 600 - 4 saved twice, outputs kept: M = 8 of 30 B (last stage), excess max(0, 600 + 11 - 600)
    assert base.memory == [600.0 + 3.0 + 8 * 30.0 + 11.0 - 4.0]
    ev = evaluate(inst, one({"l1": "full"}))
    # kept 410; peak max(100 + 5, 100 + 200 + 7, 110 + 300 + 11) = 421: excess 11; no saved_twice
    assert ev.memory == [410.0 + 3.0 + 8 * 30.0 + 11.0]
    assert ev.transient == [8 * 30.0 + 11.0] and ev.recompute_excess == [0.0]


# ---- split backward: recomputation adds to I, not W ----------------------------------------


def test_recompute_adds_to_input_gradient_not_weight_gradient():
    inst = three(devices=2)
    inst.graph.nodes["l1"]["bwd_w"] = {"gpu": 1.0}
    plain, rc = pass_times(inst, two()), pass_times(inst, two({"l1": "full"}))
    assert rc.weight_grad == plain.weight_grad
    assert rc.backward[0] == plain.backward[0] + 2.0
    assert rc.input_grad[0] == pytest.approx(plain.input_grad[0] + 2.0, rel=1e-12)
    assert rc.act_bytes == (110.0, 300.0) and rc.act_excess == (190.0, 0.0)
    assert any("recomputed" in a for a in rc.assumptions)


def test_executor_memory_uses_the_kept_bytes():
    inst = three(devices=2, microbatches=4)
    ex = run_schedule(inst, make_schedule("1F1B", 2, 4), two({"l1": "full"}))
    assert ex.memory == (412.0, 301.0)
    assert ex.memory == tuple(evaluate(inst, two({"l1": "full"})).memory)


# ---- random chains: evaluate = simulate = execute ------------------------------------------


@st.composite
def recompute_cases(draw):
    """(instance, plan with a random recompute set on each stage, M): a random chain with skip
    edges on 5 GPUs whose transfers take up to 0.08 s; some layers measure selective
    recomputation (a share of their act_bytes and forward)."""
    g = draw(layer_graphs(min_layers=2, max_layers=7))
    for v in g.nodes:
        g.nodes[v]["out_bytes"] = draw(st.floats(0.0, 0.08)) * 1e9
        if draw(st.booleans()):
            share = draw(st.floats(0.0, 1.0))
            g.nodes[v]["selective"] = {"act_bytes": share * g.nodes[v]["act_bytes"],
                                       "fwd": {"gpu": (1 - share) * g.nodes[v]["fwd"]["gpu"]}}
    M = draw(st.integers(1, 8))
    overlap = draw(st.sampled_from([True, True, False]))
    inst = Instance(g, Cluster.homogeneous(5, bandwidth=1e9), Settings(overlap=overlap, microbatches=M))
    n = inst.chain.n
    S = draw(st.integers(1, min(n, 4)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    stages = []
    for s, layers in enumerate(inst.chain.stages_from_cuts(cuts)):
        rc = {}
        for x in layers:
            modes = ["none", "full"] + (["selective"] if "selective" in g.nodes[x] else [])
            mode = draw(st.sampled_from(modes))
            if mode != "none":
                rc[x] = mode
        stages.append(Stage(layers, (f"gpu{s}",), recompute=rc or None))
    return inst, Plan(tuple(stages)), M


@PROPERTY
@given(case=recompute_cases())
def test_evaluate_simulate_and_execute_agree(case):
    inst, plan, M = case
    ev = evaluate(inst, plan)
    S = plan.num_stages
    sim = simulate(inst, plan, schedule="1f1b", microbatches=M)
    assert close(sim.time_per_microbatch, ev.bottleneck)
    assert close(sim.iteration_time, ev.iteration_time)
    gp = simulate(inst, plan, schedule="gpipe", microbatches=M)
    assert close(gp.iteration_time, ev.gpipe_time)
    for name, analytic in (("GPipe", ev.gpipe_time), ("1F1B", ev.iteration_time)):
        ex = run_schedule(inst, make_schedule(name, S, M), plan)
        assert close(ex.time, analytic), name
    if M >= S:  # every window fills: the simulator's and the executor's peaks are the cost model's
        assert sim.peak_memory == pytest.approx(ev.memory, rel=REL)
        ex = run_schedule(inst, make_schedule("1F1B", S, M), plan)
        assert list(ex.memory) == pytest.approx(ev.memory, rel=REL)
    # the recomputed forward is in the backward, the kept bytes in memory
    plain = evaluate(inst, Plan(tuple(Stage(st.layers, st.devices) for st in plan.stages)))
    for i, st in enumerate(plan.stages):
        extra = sum(rules.recompute_terms(inst.graph, x, m)[1]["gpu"] for x, m in (st.recompute or {}).items())
        saved = sum(inst.graph.nodes[x]["act_bytes"] - rules.recompute_terms(inst.graph, x, m)[0]
                    for x, m in (st.recompute or {}).items())
        assert close(ev.backward_time[i], plain.backward_time[i] + extra)
        # a difference of sums: its rounding is relative to the terms, not to the result
        scale = plain.activations[i] + abs(saved)
        assert math.isclose(ev.activations[i], plain.activations[i] - saved, rel_tol=REL, abs_tol=REL * scale)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=recompute_cases())
def test_split_backward_schedules_put_recompute_on_i(case):
    inst, plan, M = case
    plain = Plan(tuple(Stage(st.layers, st.devices) for st in plan.stages))
    a, b = pass_times(inst, plan), pass_times(inst, plain)
    assert a.weight_grad == b.weight_grad
    assert all(close(x, y) for x, y in zip(a.forward, b.forward, strict=True))  # tau * f / (f + b): rounding
    for i in range(plan.num_stages):
        assert close(a.input_grad[i] - b.input_grad[i], a.backward[i] - b.backward[i])
    S = plan.num_stages
    if S % 2 == 0:  # a two-chunk zero-bubble schedule on S / 2 ranks: longer I, never a shorter run
        sched = make_schedule("ZBVZeroBubble", S // 2, max(M, S))
        rank_of = [(f"gpu{r}",) for r in range(S // 2)]
        on = Plan(tuple(Stage(st.layers, rank_of[r], recompute=st.recompute)
                        for st, r in zip(plan.stages, sched.placement, strict=True)))
        off = Plan(tuple(Stage(st.layers, st.devices) for st in on.stages))
        assert run_schedule(inst, sched, on).time >= run_schedule(inst, sched, off).time * (1 - REL)


# ---- JSON and errors -------------------------------------------------------------------------


def test_json_round_trip(tmp_path):
    from pipeopt import io

    inst = three(devices=2)
    inst.graph.nodes["l1"]["selective"] = {"act_bytes": 50.0, "fwd": {"gpu": 0.5}}
    plan = two({"l0": "full", "l1": "selective"})
    path = io.write(inst, tmp_path / "inst.json")
    back = io.read(path)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and again.stages[0].recompute == {"l0": "full", "l1": "selective"}
    assert evaluate(back, again).memory == evaluate(inst, plan).memory
    assert evaluate(back, again).bottleneck == evaluate(inst, plan).bottleneck
    # JSON object keys are strings: integer layer names come back as the stage's own names
    ints = Plan((Stage((0, 1), ("gpu0",), recompute={1: "full"}), Stage((2,), ("gpu1",))))
    assert Plan.from_dict(json.loads(json.dumps(ints.to_dict()))) == ints


def test_typed_errors():
    inst = three(devices=2)
    with pytest.raises(InvalidPlanError, match="stage 0 recomputes 'l2', which is not one of its layers"):
        check_plan(inst, two({"l2": "full"}))
    with pytest.raises(InvalidPlanError, match="stage 0: layer 'l1': selective recomputation needs"):
        evaluate(inst, two({"l1": "selective"}))
    bip = Plan((Stage(("l0", "l1"), ("gpu0",), bwd_layers=("l0",), recompute={"l1": "full"}),
                Stage(("l2",), ("gpu1",), bwd_layers=("l1", "l2"))))
    with pytest.raises(InvalidPlanError, match="Bi-Partition"):
        evaluate(inst, bip)
    with pytest.raises(InvalidPlanError, match="not among"):
        Stage(("l0",), ("gpu0",), recompute={"l0": "half"})
    with pytest.raises(InvalidPlanError, match="dict layer -> mode"):
        Stage(("l0",), ("gpu0",), recompute=["l0"])
    with pytest.raises(InvalidPlanError, match="not one of its layers"):
        pass_times(inst, two({"l2": "full"}))
    with pytest.raises(InvalidPlanError, match="not one of its layers"):
        simulate(inst, two({"l2": "full"}))


def test_the_cost_table_refuses_a_plan_it_would_score_without_its_recompute():
    from pipeopt.cost.table import refuse_recompute

    refuse_recompute(two(), "a warm start")  # nothing recomputed: fine
    with pytest.raises(InvalidPlanError, match="a warm start scores .* stage 0 recomputes 1 layer"):
        refuse_recompute(two({"l1": "full"}), "a warm start")


def test_a_result_says_its_plan_recomputes():
    from pipeopt.result import Result

    inst = three(devices=2)
    res = Result.scored(inst, "hand", two({"l1": "full"}), "feasible")
    assert any(a.startswith("recomputed: 1 layer (1 full)") for a in res.info["assumptions"])
    assert "recomputing 1" in res.summary()
    assert not any("recomputed" in a for a in Result.scored(inst, "hand", two(), "feasible").info["assumptions"])


@pytest.mark.parametrize("kind", ["replicated", "split"])
def test_replicated_and_split_stages_recompute(kind):
    """A replicated stage and split execution (forward share beta) recompute like any other:
    the simulator plays evaluate's ops and holds its kept bytes."""
    inst = three(devices=3, microbatches=6)
    if kind == "replicated":
        plan = Plan((Stage(("l0", "l1"), ("gpu0", "gpu1"), replicas=2, recompute={"l1": "full"}),
                     Stage(("l2",), ("gpu2",), recompute={"l2": "full"})))
        schedule = "1f1b"
    else:
        plan = Plan((Stage(("l0", "l1"), ("gpu0",), beta={"gpu": 0.4}, recompute={"l1": "full"}),
                     Stage(("l2",), ("gpu1",), beta={"gpu": 0.3}, recompute={"l2": "full"})))
        schedule = "split"
    ev = evaluate(inst, plan)
    plain = evaluate(inst, Plan(tuple(Stage(st.layers, st.devices, st.replicas, st.beta) for st in plan.stages)))
    assert ev.backward_time[0] > plain.backward_time[0] and ev.activations == [110.0, 20.0]
    sim = simulate(inst, plan, schedule=schedule, microbatches=6)
    assert close(sim.time_per_microbatch, ev.bottleneck)
    assert close(sim.iteration_time, ev.iteration_time)
    assert sim.peak_memory == pytest.approx(ev.memory, rel=REL)
