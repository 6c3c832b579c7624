"""The simulator against hand-worked schedules and against the analytic cost model.

Where the two legitimately differ (fill/drain, GPipe's max F + max B, communication latency
under 1F1B's bounded window, memory of split execution and weight stashing) the difference
is pinned here, as the module docstring of :mod:`pipeopt.simulate` describes it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import networkx as nx
import pytest
from conftest import profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import instances

from pipeopt import Cluster, Instance, PartitionProblem, Plan, Settings, Stage, evaluate
from pipeopt.errors import InvalidPlanError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.simulate import SCHEDULES, Event, simulate

REL = 1e-9


def chain(fwd, bwd, out_bytes=0.0, act=10.0, param=1.0, *, M=4, bandwidth=1.25e10, **settings):
    """A chain instance with one layer per stage-to-be (single kind "gpu")."""
    g = nx.DiGraph()
    for k, (f, b) in enumerate(zip(fwd, bwd, strict=True)):
        g.add_node(f"l{k}", fwd={"gpu": f}, bwd={"gpu": b}, out_bytes=out_bytes, act_bytes=act, param_bytes=param)
        if k:
            g.add_edge(f"l{k - 1}", f"l{k}")
    cluster = Cluster.homogeneous(len(fwd), bandwidth=bandwidth)
    return Instance(g, cluster, Settings(microbatches=M, **settings), name="chain")


def one_layer_per_stage(inst):
    n = inst.num_layers
    return Plan(tuple(Stage((f"l{k}",), (f"gpu{k}",)) for k in range(n)))


def without_comm(inst):
    """The same instance on an effectively infinite network (transfers of ~1e-20 s)."""
    c = inst.cluster
    return inst.replace(cluster=Cluster(c.devices, bandwidth=1e30))


def close(a, b, rel=REL):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


# ---- a hand-worked 3-stage, 4-microbatch schedule -------------------------------------------
#
# Three stages, F = 1 s and B = 2 s on every stage, no communication, M = 4.
#
# GPipe (fill-drain; backwards in microbatch order): stage i runs F_j in [i + j, i + j + 1].
# The last stage's forwards end at 6; its backwards follow back to back: B_j in [6 + 2j, 8 + 2j].
# Stage 1's B_j needs stage 2's B_j: [8 + 2j, 10 + 2j]; stage 0: [10 + 2j, 12 + 2j]. Iteration 18
# = (M + S - 1) (F + B).
GPIPE = [
    (0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "F", 2, 2, 3), (0, "F", 3, 3, 4),
    (1, "F", 0, 1, 2), (1, "F", 1, 2, 3), (1, "F", 2, 3, 4), (1, "F", 3, 4, 5),
    (2, "F", 0, 2, 3), (2, "F", 1, 3, 4), (2, "F", 2, 4, 5), (2, "F", 3, 5, 6),
    (2, "B", 0, 6, 8), (2, "B", 1, 8, 10), (2, "B", 2, 10, 12), (2, "B", 3, 12, 14),
    (1, "B", 0, 8, 10), (1, "B", 1, 10, 12), (1, "B", 2, 12, 14), (1, "B", 3, 14, 16),
    (0, "B", 0, 10, 12), (0, "B", 1, 12, 14), (0, "B", 2, 14, 16), (0, "B", 3, 16, 18),
]  # fmt: skip
# 1F1B (PipeDream-Flush), warm-up S - i forwards at stage i. Orders:
#   stage 0: F0 F1 F2 B0 F3 B1 B2 B3;  stage 1: F0 F1 B0 F2 B1 F3 B2 B3;  stage 2: F0 B0 F1 B1 F2 B2 F3 B3.
# stage 0: F0 [0,1], F1 [1,2], F2 [2,3]; stage 1: F0 [1,2], F1 [2,3]; stage 2: F0 [2,3], B0 [3,5].
# stage 2: F1 (activation at 3, worker free at 5) [5,6], B1 [6,8].
# stage 1: B0 (gradient at 5) [5,7], F2 (activation since 3) [7,8], B1 (gradient at 8) [8,10].
# stage 0: B0 (gradient at 7) [7,9], F3 [9,10], B1 (gradient at 10) [10,12].
# stage 2: F2 (activation at 8) [8,9], B2 [9,11].  stage 1: F3 (activation at 10) [10,11],
# B2 (gradient at 11) [11,13].  stage 2: F3 (activation at 11) [11,12], B3 [12,14].
# stage 0: B2 (gradient at 13) [13,15].  stage 1: B3 (gradient at 14) [14,16].
# stage 0: B3 (gradient at 16) [16,18]. Iteration 18, the same as GPipe; peak in flight 3, 2, 1.
ONE_F_ONE_B = [
    (0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "F", 2, 2, 3), (0, "B", 0, 7, 9),
    (0, "F", 3, 9, 10), (0, "B", 1, 10, 12), (0, "B", 2, 13, 15), (0, "B", 3, 16, 18),
    (1, "F", 0, 1, 2), (1, "F", 1, 2, 3), (1, "B", 0, 5, 7), (1, "F", 2, 7, 8),
    (1, "B", 1, 8, 10), (1, "F", 3, 10, 11), (1, "B", 2, 11, 13), (1, "B", 3, 14, 16),
    (2, "F", 0, 2, 3), (2, "B", 0, 3, 5), (2, "F", 1, 5, 6), (2, "B", 1, 6, 8),
    (2, "F", 2, 8, 9), (2, "B", 2, 9, 11), (2, "F", 3, 11, 12), (2, "B", 3, 12, 14),
]  # fmt: skip


@pytest.mark.parametrize("schedule, expected", [("gpipe", GPIPE), ("1f1b", ONE_F_ONE_B)])
def test_hand_worked_schedule(schedule, expected):
    inst = chain([1.0] * 3, [2.0] * 3)
    sim = simulate(inst, one_layer_per_stage(inst), schedule=schedule)
    got = sorted((e.stage, e.kind, e.microbatch, e.start, e.end) for e in sim.events)
    assert got == sorted(expected)  # every start and end, one by one
    assert all(isinstance(e, Event) for e in sim.events)
    assert sim.iteration_time == 18.0
    assert sim.time_per_microbatch == pytest.approx(3.0, rel=REL)
    assert sim.bubble_fraction == pytest.approx(1 - 4 * 3 / 18, rel=REL)  # (S-1)/(M+S-1) = 1/3
    assert sim.utilisation == pytest.approx([12 / 18] * 3, rel=REL)
    assert sim.peak_in_flight == ([4, 4, 4] if schedule == "gpipe" else [3, 2, 1])
    # 10 activation bytes per microbatch, 1 parameter byte
    assert sim.peak_memory == ([41.0] * 3 if schedule == "gpipe" else [31.0, 21.0, 11.0])


# ---- equal stages: (M + S - 1) T ------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S, M", [(1, 1), (2, 5), (4, 4), (4, 16), (6, 3)])
def test_equal_stages_take_M_plus_S_minus_1_times_T(schedule, S, M):
    inst = chain([0.3] * S, [0.7] * S, M=M)
    plan = one_layer_per_stage(inst)
    sim = simulate(inst, plan, schedule=schedule)
    T = evaluate(inst, plan).bottleneck
    assert close(T, 1.0)
    assert close(sim.iteration_time, (M + S - 1) * T)
    assert close(sim.iteration_time, evaluate(inst, plan).iteration_time)  # the flow-shop estimate agrees
    assert close(sim.time_per_microbatch, T)


def test_uneven_stages_fill_drain_differs_from_the_flow_shop_estimate():
    # slowest stage first (t = 4, 2): 1F1B overlaps the backward traversal with later forwards
    # and takes M * t_0 = 16 s; the flow-shop estimate sum t + (M - 1) max t says 18 s.
    inst = chain([2.0, 1.0], [2.0, 1.0], M=4)
    plan = one_layer_per_stage(inst)
    ev = evaluate(inst, plan)
    assert ev.iteration_time == 18.0
    assert simulate(inst, plan, schedule="1f1b").iteration_time == 16.0
    assert simulate(inst, plan, schedule="gpipe").iteration_time == 18.0
    # slowest stage last (t = 2, 4): both schedules take the estimate, 18 s
    inst = chain([1.0, 2.0], [1.0, 2.0], M=4)
    plan = one_layer_per_stage(inst)
    assert evaluate(inst, plan).iteration_time == 18.0
    assert simulate(inst, plan, schedule="1f1b").iteration_time == 18.0


def test_gpipe_rate_is_max_forward_plus_max_backward():
    # forward-heavy first stage, backward-heavy second: max_i (F_i + B_i) = 5 but GPipe's
    # phases cost max F + max B = 4 + 4 = 8 per microbatch
    inst = chain([4.0, 1.0], [1.0, 4.0], M=6)
    plan = one_layer_per_stage(inst)
    sim = simulate(inst, plan, schedule="gpipe")
    gpipe = evaluate(inst.with_settings(objective="gpipe"), plan).objective
    assert gpipe == 8.0
    assert close(sim.time_per_microbatch, 8.0)
    assert close(sim.iteration_time, 5.0 + 5.0 + (6 - 1) * 8.0)
    assert close(simulate(inst, plan, schedule="1f1b").time_per_microbatch, evaluate(inst, plan).bottleneck)


# ---- steady state = the analytic bottleneck ---------------------------------------------------

REAL = [("vgg16", 2), ("vgg16", 4), ("vgg16", 8), ("resnet50", 4), ("resnet50", 8), ("gnmt", 4), ("inception_v3", 4)]


@pytest.mark.parametrize("name, S", REAL)
def test_steady_state_equals_bottleneck_on_real_dp_plans(name, S):
    inst = without_comm(profile(name))
    plan = solve_dp(PartitionProblem(inst, S)).plan
    T = evaluate(inst, plan).bottleneck
    for schedule in ("1f1b", "async"):
        sim = simulate(inst, plan, schedule=schedule, microbatches=4 * S)
        assert close(sim.time_per_microbatch, T), schedule
        assert close(sim.bottleneck, T)
    # and 1F1B's peak memory is the cost model's: S - i microbatches of activations at stage i
    sim = simulate(inst, plan, schedule="1f1b", microbatches=2 * S)
    assert sim.peak_in_flight == [S - i for i in range(S)]
    assert sim.peak_memory == pytest.approx(evaluate(inst, plan).memory, rel=REL)


@pytest.mark.parametrize("name, S", [("vgg16", 4), ("vgg16", 8), ("resnet50", 4), ("resnet50", 8)])
def test_replicated_dp_plans_round_robin(name, S):
    inst = without_comm(profile(name))
    res = solve_dp(PartitionProblem(inst, S, replication=True))
    assert any(st.replicas > 1 for st in res.plan.stages)
    ev = evaluate(inst, res.plan)
    sim = simulate(inst, res.plan, schedule="1f1b", microbatches=32)
    assert close(sim.time_per_microbatch, ev.bottleneck)
    assert sim.peak_memory == pytest.approx(ev.memory, rel=REL)  # ceil(W_i / m_i) microbatches per replica


def test_replicated_middle_stage_is_slower_than_the_cost_model():
    # stages of 1, 4, 1 s per microbatch (forward = backward) on 1, 2, 1 workers: the cost
    # model says max(1, 4 / 2, 1) = 2 s; strict 1F1B with ceil(W_i / m_i) = 4, 2, 1
    # microbatches in flight makes the replicas wait: 2.5 s (module docstring)
    inst = chain([0.5, 2.0, 0.5], [0.5, 2.0, 0.5], param=0.0, M=12)
    inst = inst.replace(cluster=Cluster.homogeneous(4))
    plan = Plan((Stage(("l0",), ("gpu0",)), Stage(("l1",), ("gpu1", "gpu2"), 2), Stage(("l2",), ("gpu3",))))
    assert evaluate(inst, plan).bottleneck == 2.0
    sim = simulate(inst, plan, schedule="1f1b")
    assert close(sim.time_per_microbatch, 2.5)
    assert sim.peak_in_flight == [4, 2, 1]
    # the same stage replicated at the end of the pipeline runs at the analytic rate
    tail = chain([1.0, 4.0], [1.0, 4.0], param=0.0, M=12).replace(cluster=Cluster.homogeneous(3))
    plan = Plan((Stage(("l0",), ("gpu0",)), Stage(("l1",), ("gpu1", "gpu2"), 2)))
    assert close(simulate(tail, plan, schedule="1f1b").time_per_microbatch, evaluate(tail, plan).bottleneck)


def test_communication_latency_under_the_1f1b_window():
    # The cost model hides transfers completely; with S - i microbatches in flight 1F1B cannot
    # when the stages have no slack. At the default 1.25e10 B/s: resnet50 on 8 stages runs
    # ~1.74x slower than the analytic bottleneck, vgg16 on 8 stages exactly at it.
    for name, S, lo, hi in [("resnet50", 8, 1.5, 2.0), ("vgg16", 8, 1.0, 1.0)]:
        inst = profile(name)
        plan = solve_dp(PartitionProblem(inst, S)).plan
        sim = simulate(inst, plan, schedule="async")
        ratio = sim.time_per_microbatch / evaluate(inst, plan).bottleneck
        assert lo * (1 - REL) <= ratio <= hi * (1 + REL), (name, ratio)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=7, memory=False), data=st.data())
def test_steady_state_on_random_chains(inst, data):
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 4)))
    starts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    problem = PartitionProblem(inst, S)
    plan = problem.plan(starts)
    M = data.draw(st.integers(S, 3 * S))
    ev = evaluate(inst, plan)
    if ev.bottleneck == 0:
        return
    for schedule in ("1f1b", "async"):
        sim = simulate(inst, plan, schedule=schedule, microbatches=M)
        if inst.settings.overlap:  # transfers overlap compute: latency may show, never speed up
            assert sim.time_per_microbatch >= ev.bottleneck * (1 - REL)
        else:  # a blocking send is part of the stage time: no latency left to hide
            assert close(sim.time_per_microbatch, ev.bottleneck)
        free = without_comm(inst)
        assert close(simulate(free, plan, schedule=schedule, microbatches=M).time_per_microbatch,
                     evaluate(free, plan).bottleneck)
    sim = simulate(inst, plan, schedule="1f1b", microbatches=M)
    acts = [sum(inst.graph.nodes[n]["act_bytes"] for n in st.layers) for st in plan.stages]
    params = [sum(inst.graph.nodes[n]["param_bytes"] for n in st.layers) for st in plan.stages]
    assert sim.peak_in_flight == [S - i for i in range(S)]
    assert sim.peak_memory == pytest.approx([(S - i) * a + p for i, (a, p) in enumerate(zip(acts, params))])
    if inst.settings.weight_stashing:  # async keeps one weight version per microbatch in flight
        assert simulate(inst, plan, schedule="async", microbatches=M).peak_memory == pytest.approx(ev.memory)
    else:
        assert sim.peak_memory == pytest.approx(ev.memory)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=7, memory=False), data=st.data())
def test_gpipe_iteration_formula_on_random_chains(inst, data):
    """GPipe without replication: sum f + sum b + transfers + (M - 1) (max F + max B)."""
    inst = inst.with_settings(overlap=True, weight_stashing=False)  # GPipe flushes: one weight version
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 4)))
    starts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=S - 1, max_size=S - 1))) if S > 1 else []
    plan = PartitionProblem(inst, S).plan(starts)
    M = data.draw(st.integers(1, 8))
    sim = simulate(inst, plan, schedule="gpipe", microbatches=M)
    ev = evaluate(inst.with_settings(objective="gpipe", microbatches=M), plan)
    fill = sum(ev.forward_time) + sum(ev.backward_time) + sum(ev.comm_time)
    assert close(sim.iteration_time, fill + (M - 1) * ev.objective, rel=1e-7)
    assert close(sim.time_per_microbatch, ev.objective, rel=1e-7)
    assert sim.time_per_microbatch >= evaluate(inst, plan).bottleneck * (1 - REL) or S == 1
    assert sim.peak_memory == pytest.approx(ev.memory)  # GPipe holds all M activations


# ---- split execution (Duan & Wu) --------------------------------------------------------------


def with_beta(plan, beta):
    return Plan(tuple(dataclasses.replace(st, beta={"gpu": b}) for st, b in zip(plan.stages, beta, strict=True)))


def test_split_execution_steady_state_and_memory():
    inst = chain([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], M=12)
    plan = one_layer_per_stage(inst)
    # theorem: beta = c / (c + 1) with c = F/B = 1/2 gives f = b = 3 on every stage
    split = with_beta(plan, [1 / 3] * 3)
    ev = evaluate(inst, split)
    assert ev.forward_time == pytest.approx([3.0] * 3) and ev.backward_time == pytest.approx([3.0] * 3)
    sim = simulate(inst, split, schedule="split")
    assert close(sim.time_per_microbatch, ev.bottleneck)
    assert all(u <= 1 + REL for u in sim.utilisation)
    # forward and backward lanes really overlap on a worker
    f = [(e.start, e.end) for e in sim.events if e.stage == 1 and e.kind == "F"]
    b = [(e.start, e.end) for e in sim.events if e.stage == 1 and e.kind == "B"]
    assert any(fs < be and bs < fe for fs, fe in f for bs, be in b)
    # split execution keeps up to 2 (S - i) microbatches; the cost model counts S - i
    assert sim.peak_in_flight == [6, 4, 2]
    assert [m / 10 for m in sim.peak_memory] == pytest.approx([6.1, 4.1, 2.1])
    # a lopsided share: the slower lane sets the pace (beta = 1/2: f = 2, b = 4)
    lopsided = with_beta(plan, [0.5] * 3)
    assert evaluate(inst, lopsided).bottleneck == 4.0
    assert close(simulate(inst, lopsided, schedule="split").time_per_microbatch, 4.0)


def test_sequential_schedules_ignore_beta_with_a_note():
    inst = chain([1.0, 1.0], [2.0, 2.0])
    plan = one_layer_per_stage(inst)
    sim = simulate(inst, with_beta(plan, [0.5, 0.5]), schedule="1f1b")
    assert sim.iteration_time == simulate(inst, plan, schedule="1f1b").iteration_time
    assert any("beta" in n for n in sim.notes)


# ---- no overlap, errors, output ---------------------------------------------------------------


def test_no_overlap_blocks_the_sender():
    # 1 MB activations at 1 MB/s: every send takes 1 s on the sending worker
    inst = chain([1.0, 1.0], [1.0, 1.0], out_bytes=1e6, bandwidth=1e6, M=8, overlap=False)
    plan = one_layer_per_stage(inst)
    ev = evaluate(inst, plan)
    assert ev.stage_time == [3.0, 3.0]
    sim = simulate(inst, plan, schedule="1f1b")
    assert close(sim.time_per_microbatch, 3.0)
    sends = [e for e, d in zip(sim.events, sim.event_details, strict=True) if e.kind == "comm"]
    assert len(sends) == 2 * 8 and all(close(e.end - e.start, 1.0) for e in sends)
    assert {d[1] for e, d in zip(sim.events, sim.event_details, strict=True) if e.kind == "comm"} == {"worker"}


def test_overlapped_transfers_occupy_the_link():
    inst = chain([1.0, 1.0], [1.0, 1.0], out_bytes=1e6, bandwidth=1e6, M=8)
    plan = one_layer_per_stage(inst)
    ev = evaluate(inst, plan)
    assert ev.comm_time == [2.0] and ev.bottleneck == 2.0
    sim = simulate(inst, plan, schedule="gpipe")
    comm = sorted((e.start, e.end) for e in sim.events if e.kind == "comm")
    assert len(comm) == 16
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(comm))  # one transfer at a time


def test_errors_are_typed():
    inst = chain([1.0, 1.0], [2.0, 2.0])
    plan = one_layer_per_stage(inst)
    with pytest.raises(InvalidProblemError, match="unknown schedule 'pipedream'"):
        simulate(inst, plan, schedule="pipedream")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(InvalidProblemError, match="microbatches"):
            simulate(inst, plan, microbatches=bad)
    with pytest.raises(InvalidPlanError, match=r"split schedule needs a forward share beta.*\[0, 1\]"):
        simulate(inst, plan, schedule="split")
    with pytest.raises(InvalidPlanError, match="dropped"):
        simulate(inst, Plan((Stage(("l0",), ("gpu0",)),)))


def test_bipartition_plan_steady_state_matches_evaluate():
    # stage 0: forward of l0, l1 (2 s) + backward of l0 (2 s) = 4 s; stage 1: forward of l2 (1 s)
    # + backward of l1, l2 (4 s) = 5 s; the migrated activation of l1 (10 B) costs ~1e-9 s
    inst3 = chain([1.0] * 3, [2.0] * 3, M=64)
    bi = Plan((Stage(("l0", "l1"), ("gpu0",), bwd_layers=("l0",)), Stage(("l2",), ("gpu1",), bwd_layers=("l1", "l2"))))
    ev = evaluate(inst3, bi)
    assert ev.bottleneck == pytest.approx(5.0, rel=1e-6)
    assert ev.comm_bytes_forward[0] == pytest.approx(10.0) and ev.comm_bytes_backward[0] == pytest.approx(1.0 / 64)
    sim = simulate(inst3, bi, schedule="1f1b")
    assert sim.time_per_microbatch == pytest.approx(ev.bottleneck, rel=1e-6)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_outputs_are_json_and_pandas_ready(schedule):
    inst = chain([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], out_bytes=1e4, bandwidth=1e6, M=5)
    plan = one_layer_per_stage(inst)
    if schedule == "split":
        plan = with_beta(plan, [1 / 3] * 3)
    sim = simulate(inst, plan, schedule=schedule)
    d = json.loads(json.dumps(sim.to_dict(events=True)))
    for key in ("iteration_time", "time_per_microbatch", "bubble_fraction", "utilisation", "peak_memory"):
        assert key in d
    assert len(d["utilisation"]) == len(d["peak_memory"]) == 3
    assert len(d["events"]) == len(sim.events)
    assert "events" not in sim.to_dict()
    frame = sim.to_frame()
    assert list(frame.columns) == ["stage", "replica", "lane", "kind", "direction", "microbatch", "start", "end", "duration"]
    assert len(frame) == len(sim.events) and (frame["duration"] >= 0).all()
    assert set(frame["kind"]) == {"F", "B", "comm"}
    assert 0.0 <= sim.bubble_fraction < 1.0
    assert close(sim.throughput, 1 / sim.time_per_microbatch)
    if schedule == "async":
        assert close(sim.iteration_time, 5 * sim.time_per_microbatch)
    else:
        assert sim.iteration_time == max(e.end for e in sim.events)


def test_summary_and_analytic_estimate_use_the_simulated_M():
    inst = chain([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], M=4)  # settings say 4, the simulation runs 10
    plan = one_layer_per_stage(inst)
    sim = simulate(inst, plan, schedule="1f1b", microbatches=10)
    assert sim.microbatches == 10
    assert sim.analytic_iteration_time == evaluate(inst.with_settings(microbatches=10), plan).iteration_time
    assert close(sim.iteration_time, (10 + 3 - 1) * 3.0)  # equal stages: (M + S - 1) T
    text = sim.summary()
    assert "1f1b: 10 microbatches" in text and "1.0000 x the analytic bottleneck" in text
    assert text.count("stage ") == 3 and str(sim) == text


def test_two_resource_kinds_use_the_cost_models_stage_time():
    # workers with a GPU and a CPU: sequential stage time 1 / sum_k R_k / (F_k + B_k) is not
    # f + b (each pass alone on both kinds); the simulator plays the cost model's tau
    from pipeopt import Device

    g = nx.DiGraph()
    g.add_node("a", fwd={"gpu": 1.0, "cpu": 4.0}, bwd={"gpu": 2.0, "cpu": 2.0}, out_bytes=0.0, act_bytes=1.0,
               param_bytes=0.0)
    g.add_node("b", fwd={"gpu": 2.0, "cpu": 3.0}, bwd={"gpu": 3.0, "cpu": 1.0}, out_bytes=0.0, act_bytes=1.0,
               param_bytes=0.0)
    g.add_edge("a", "b")
    devices = (Device("w0", {"gpu": 1.0, "cpu": 1.0}), Device("w1", {"gpu": 1.0, "cpu": 1.0}))
    inst = Instance(g, Cluster(devices), Settings(microbatches=6))
    plan = Plan((Stage(("a",), ("w0",)), Stage(("b",), ("w1",))))
    ev = evaluate(inst, plan)
    assert not close(ev.stage_time[0], ev.forward_time[0] + ev.backward_time[0])
    for schedule in ("1f1b", "async"):
        assert close(simulate(inst, plan, schedule=schedule).time_per_microbatch, ev.bottleneck)
    # split execution: beta per kind, each lane runs at the cost model's forward / backward time
    split = Plan(tuple(dataclasses.replace(st, beta={"gpu": 0.3, "cpu": 0.8}) for st in plan.stages))
    ev = evaluate(inst, split)
    sim = simulate(inst, split, schedule="split")
    assert close(sim.time_per_microbatch, ev.bottleneck)
    lanes = {(e.stage, e.kind): e.end - e.start for e in sim.events}
    assert close(lanes[(0, "F")], ev.forward_time[0]) and close(lanes[(1, "B")], ev.backward_time[1])
