"""The event-time MILP of a finite run (pipeopt/problems/partition/events.py): its op durations
are evaluate's, and its optimum is the brute-force least iteration time (every split scored by
:func:`pipeopt.evaluate`) under 1F1B-flush and GPipe, with and without overlap, S = 1, S = n,
tight bandwidth, binding memory, and with the steady period capped (the tie-break)."""

from __future__ import annotations

import itertools
import math
import random

import brute_force as bf
import networkx as nx
import numpy as np
import pytest

from pipeopt import Cluster, Device, Instance, Settings, evaluate
from pipeopt.errors import InvalidProblemError
from pipeopt.problems.partition.events import (
    CAP_REL,
    OBJECTIVE_OF,
    op_times,
    run_time,
    solve_events,
)
from pipeopt.problems.partition.problem import PartitionProblem

LIMIT = None  # no wall-clock limit: these checks assert proofs (status optimal / infeasible)
"""Seconds per solve: far more than these instances need (no test asserts a time)."""
REL = 1e-6
"""An optimal claim is within this relative tolerance of the brute-force optimum."""
SCHEDULES = ("1f1b", "gpipe")


def make_instance(seed: int, n: int, S: int, *, overlap: bool = True, M: int = 4,
                  bandwidth: str = "medium", dag: bool = False, pinned: bool = False, zeros: bool = False,
                  heavy: bool = False, units: float = 1.0) -> Instance:
    """A random single-kind chain (optional skip edges, pinned input, zero-time layers, one
    dominating layer) on ``S`` identical devices with no memory limit."""
    rng = random.Random(seed)
    g = nx.DiGraph()
    names = [f"l{i}" for i in range(n)]
    big = rng.randrange(n) if heavy else -1
    for i, v in enumerate(names):
        f = 0.0 if zeros and rng.random() < 0.3 else rng.uniform(1e-4, 5e-3)
        if i == big:
            f = 0.05
        g.add_node(v, fwd={"gpu": f}, bwd={"gpu": f * rng.uniform(0.5, 3.0)},
                   out_bytes=round(rng.uniform(0, 4e7), 2), act_bytes=round(rng.uniform(0, 4e7), 2),
                   param_bytes=round(rng.uniform(0, 4e7), 2))
    for u, v in itertools.pairwise(names):
        g.add_edge(u, v)
    if dag and n > 2:
        for _ in range(rng.randint(1, n)):
            i, j = sorted(rng.sample(range(n), 2))
            if i + 1 < j:
                g.add_edge(names[i], names[j], bytes=round(rng.uniform(0, 4e7), 2))
    if pinned:
        g.add_node("input", fwd={"gpu": rng.uniform(0, 1e-3)}, bwd={"gpu": 0.0},
                   out_bytes=rng.uniform(0, 4e7), act_bytes=rng.uniform(0, 4e7), param_bytes=0.0,
                   pin_first=True)
        g.add_edge("input", names[0])
    work = sum(d["fwd"]["gpu"] + d["bwd"]["gpu"] for _, d in g.nodes(data=True))
    biggest = max((g.nodes[u]["out_bytes"] for u in g.nodes), default=1.0)
    ratio = {"tight": rng.uniform(2, 20), "medium": rng.uniform(0.05, 1.0), "fast": 1e-4}[bandwidth]
    bw = 2 * biggest / (ratio * work) if work > 0 and biggest > 0 else 1e9
    devs = tuple(Device(f"gpu{i}", {"gpu": units}, math.inf) for i in range(S))
    return Instance(g, Cluster(devs, bw), Settings(overlap=overlap, microbatches=M), name=f"events-{seed}")


def with_memory(inst: Instance, cap: float) -> Instance:
    devs = tuple(Device(d.name, d.resources, cap) for d in inst.cluster.devices)
    return inst.replace(cluster=Cluster(devs, inst.cluster.bandwidth))


def binding_memory(inst: Instance, S: int, schedule: str, seed: int) -> Instance:
    """``inst`` with memory = the largest stage of a random split under the schedule's memory
    (that split fits exactly; some others do not)."""
    rng = random.Random(seed)
    plans = list(bf.partition_plans(inst.with_settings(objective=OBJECTIVE_OF[schedule]), S))
    scored = inst.with_settings(objective=OBJECTIVE_OF[schedule])
    cap = max(evaluate(scored, rng.choice(plans)).memory)
    return with_memory(inst, cap if cap > 0 else 1e-3)


def brute(inst: Instance, S: int, schedule: str, cap: float | None = None) -> float:
    """Least iteration time (evaluate, the schedule's objective) over every split that fits and,
    if ``cap`` is given, has steady period (evaluate's bottleneck) at most ``cap``."""
    scored = inst.with_settings(objective=OBJECTIVE_OF[schedule])
    steady = inst.with_settings(objective="bottleneck")
    best = math.inf
    for plan in bf.partition_plans(inst, S):
        ev = evaluate(scored, plan)
        if not ev.feasible:
            continue
        if cap is not None and evaluate(steady, plan).objective > cap * (1 + CAP_REL):
            continue
        best = min(best, ev.objective)
    return best


def check(problem: PartitionProblem, schedule: str, out, opt: float) -> None:
    """What a solve claims, against the brute-force optimum ``opt``."""
    inst = problem.instance
    if math.isinf(opt):
        assert out.status == "infeasible" and out.starts is None, out
        return
    assert out.status == "optimal", (out.status, out.info)
    assert out.starts is not None
    ev = evaluate(inst.with_settings(objective=OBJECTIVE_OF[schedule]), problem.plan(out.starts))
    assert ev.feasible
    assert out.value == ev.objective
    tol = REL * max(opt, 1e-12)
    assert abs(out.value - opt) <= tol, (out.value, opt)
    assert out.bound <= opt + tol, (out.bound, opt)
    assert out.value - out.bound <= tol


# ---- the op durations are evaluate's -----------------------------------------------------------
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("dag", [False, True])
def test_op_times_are_evaluates(overlap, dag):
    for seed in range(4):
        n, S = 7, 3
        inst = make_instance(seed, n, S, overlap=overlap, dag=dag, pinned=seed % 2 == 1, units=2.5, M=5)
        problem = PartitionProblem(inst, S)
        units = inst.cluster.devices[0].resources[problem.kind]
        fwd = problem.table.pass_prefix("fwd", problem.kind, units)
        bwd = problem.table.pass_prefix("bwd", problem.kind, units)
        assert np.allclose(fwd + bwd, problem.work_prefix, rtol=1e-12, atol=0)
        for starts in itertools.combinations(range(1, problem.n), S - 1):
            starts = list(starts)
            f, b, x = op_times(problem, starts)
            ev = evaluate(inst, problem.plan(starts))
            assert np.allclose(f, ev.forward_op, rtol=1e-12, atol=1e-18)
            assert np.allclose(b, ev.backward_op, rtol=1e-12, atol=1e-18)
            if overlap:
                assert np.allclose(2 * x, ev.round_trip, rtol=1e-12, atol=1e-18)
            else:
                assert not np.any(x)
            for schedule in SCHEDULES:
                truth = evaluate(inst, problem.plan(starts)).run_time(schedule)
                ours = run_time(problem, starts, schedule)[0]
                assert math.isclose(ours, truth, rel_tol=1e-12, abs_tol=1e-15)


# ---- the optimum is the brute-force optimum ----------------------------------------------------
CASES = [
    # (seed, n, S, overlap, M, bandwidth, options)
    (0, 6, 3, True, 4, "medium", {}),
    (1, 7, 3, False, 5, "medium", {}),
    (2, 8, 4, True, 6, "medium", {"dag": True}),
    (3, 8, 3, False, 3, "medium", {"dag": True, "pinned": True}),
    (4, 6, 2, True, 1, "medium", {}),
    (5, 7, 4, True, 6, "tight", {}),
    (6, 7, 3, False, 4, "tight", {"dag": True}),
    (7, 6, 3, True, 5, "fast", {"zeros": True}),
    (8, 5, 4, True, 2, "medium", {"units": 0.37}),
    (9, 8, 5, True, 4, "tight", {"heavy": True}),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_optimum_equals_brute_force(case, schedule):
    seed, n, S, overlap, M, bandwidth, opts = case
    inst = make_instance(seed, n, S, overlap=overlap, M=M, bandwidth=bandwidth, **opts)
    problem = PartitionProblem(inst, S)
    out = solve_events(problem, schedule, deadline=LIMIT)
    check(problem, schedule, out, brute(inst, S, schedule))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("overlap", [True, False])
def test_single_split(schedule, overlap):
    for S in (1, 5):
        inst = make_instance(11, 5, S, overlap=overlap, M=3)
        problem = PartitionProblem(inst, S)
        out = solve_events(problem, schedule, deadline=LIMIT)
        check(problem, schedule, out, brute(inst, S, schedule))
        assert out.starts == list(range(1, S))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("overlap", [True, False])
def test_memory_binding(schedule, overlap):
    """Capacity = the largest stage of a random split under the schedule's in-flight count
    (GPipe keeps M microbatches): the split fits exactly, some others do not."""
    binding = 0
    for seed in range(4):
        n, S = 7, 3
        bandwidth = "tight" if seed % 2 else "medium"
        inst = make_instance(100 + seed, n, S, overlap=overlap, M=4, bandwidth=bandwidth)
        inst = binding_memory(inst, S, schedule, seed)
        scored = inst.with_settings(objective=OBJECTIVE_OF[schedule])
        plans = list(bf.partition_plans(inst, S))
        fit = sum(evaluate(scored, p).feasible for p in plans)
        binding += fit < len(plans)
        problem = PartitionProblem(inst, S)
        out = solve_events(problem, schedule, deadline=LIMIT)
        check(problem, schedule, out, brute(inst, S, schedule))
    assert binding > 0  # the memory did rule some splits out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_nothing_fits_is_infeasible(schedule):
    inst = make_instance(21, 6, 3, M=4)
    scored = inst.with_settings(objective=OBJECTIVE_OF[schedule])
    least = min(max(evaluate(scored, p).memory) for p in bf.partition_plans(inst, 3))
    inst = with_memory(inst, least * (1 - 1e-6))
    out = solve_events(PartitionProblem(inst, 3), schedule, deadline=LIMIT)
    assert out.status == "infeasible" and out.starts is None and out.value == math.inf


def test_gpipe_memory_differs_from_1f1b():
    """A capacity where the 1F1B optimum fits but GPipe's M in-flight microbatches rule splits
    out: each schedule is checked against its own memory."""
    inst = make_instance(31, 6, 3, M=6)
    one = inst.with_settings(objective="iteration")
    cap = min(max(evaluate(one, p).memory) for p in bf.partition_plans(inst, 3)) * 1.5
    inst = with_memory(inst, cap)
    problem = PartitionProblem(inst, 3)
    for schedule in SCHEDULES:
        out = solve_events(problem, schedule, deadline=LIMIT)
        check(problem, schedule, out, brute(inst, 3, schedule))


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_solvers_and_hint(solver):
    inst = make_instance(41, 8, 4, overlap=True, M=5, dag=True)
    problem = PartitionProblem(inst, 4)
    opt = brute(inst, 4, "1f1b")
    check(problem, "1f1b", solve_events(problem, "1f1b", deadline=LIMIT, solver=solver), opt)
    run = inst.with_settings(objective="iteration")
    worst = max(itertools.combinations(range(1, 8), 3),
                key=lambda c: evaluate(run, problem.plan(list(c))).objective)
    out = solve_events(problem, "1f1b", deadline=LIMIT, solver=solver, hint=list(worst))
    check(problem, "1f1b", out, opt)
    assert out.info["warm_start"] == list(worst)


# ---- the period cap: the least iteration time among the bottleneck-optimal splits ------------
def bottleneck_optimum(inst: Instance, S: int, schedule: str) -> float:
    """Least steady period over the splits that fit under the schedule's memory."""
    scored = inst.with_settings(objective=OBJECTIVE_OF[schedule])
    steady = inst.with_settings(objective="bottleneck")
    plans = [p for p in bf.partition_plans(inst, S) if evaluate(scored, p).feasible]
    return min((evaluate(steady, p).objective for p in plans), default=math.inf)


CAP_CASES = [
    (50, 7, 3, True, 6, "medium", {"heavy": True}),
    (51, 8, 4, True, 4, "medium", {"heavy": True}),
    (52, 8, 4, False, 5, "medium", {"heavy": True}),
    (53, 7, 3, True, 6, "tight", {}),
    (54, 8, 3, True, 3, "medium", {"dag": True}),
    (55, 6, 4, False, 6, "medium", {"heavy": True, "dag": True}),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("case", CAP_CASES, ids=[f"seed{c[0]}" for c in CAP_CASES])
def test_period_cap_breaks_ties(case, schedule):
    seed, n, S, overlap, M, bandwidth, opts = case
    inst = make_instance(seed, n, S, overlap=overlap, M=M, bandwidth=bandwidth, **opts)
    if seed % 2:
        inst = binding_memory(inst, S, schedule, seed)
    problem = PartitionProblem(inst, S)
    cap = bottleneck_optimum(inst, S, schedule)
    out = solve_events(problem, schedule, period_cap=cap, deadline=LIMIT)
    check(problem, schedule, out, brute(inst, S, schedule, cap))
    assert problem.period(out.starts) <= cap * (1 + CAP_REL)


def test_period_cap_changes_the_answer():
    """On a chain with one dominating layer many splits tie on the period; the cap keeps the
    result among them, and the least iteration time among them differs from the tied plans'
    worst (the tie-break matters) and can exceed the uncapped optimum."""
    inst = make_instance(51, 8, 4, overlap=True, M=4, bandwidth="medium", heavy=True)
    problem = PartitionProblem(inst, 4)
    cap = bottleneck_optimum(inst, 4, "1f1b")
    steady = inst.with_settings(objective="bottleneck")
    run = inst.with_settings(objective="iteration")
    tied = [evaluate(run, p).objective for p in bf.partition_plans(inst, 4)
            if evaluate(steady, p).objective <= cap * (1 + CAP_REL)]
    assert len(tied) > 1 and max(tied) > min(tied) * (1 + 1e-6)
    out = solve_events(problem, "1f1b", period_cap=cap, deadline=LIMIT)
    assert out.status == "optimal"
    assert math.isclose(out.value, min(tied), rel_tol=REL)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_cap_below_the_best_period_is_infeasible(schedule):
    inst = make_instance(60, 7, 3, M=4)
    problem = PartitionProblem(inst, 3)
    cap = bottleneck_optimum(inst, 3, schedule)
    out = solve_events(problem, schedule, period_cap=cap * 0.99, deadline=LIMIT)
    assert out.status == "infeasible" and out.starts is None


def test_cap_on_single_split():
    inst = make_instance(61, 4, 4, M=3)
    problem = PartitionProblem(inst, 4)
    period = problem.period([1, 2, 3])
    assert solve_events(problem, period_cap=period, deadline=LIMIT).status == "optimal"
    assert solve_events(problem, period_cap=period * 0.99, deadline=LIMIT).status == "infeasible"


# ---- bad input -------------------------------------------------------------------------------------
def test_bad_input():
    inst = make_instance(70, 6, 3)
    problem = PartitionProblem(inst, 3)
    with pytest.raises(InvalidProblemError):
        solve_events(problem, "pipedream", deadline=LIMIT)
    with pytest.raises(InvalidProblemError):
        solve_events(problem, deadline=LIMIT, solver="gurobi")
    with pytest.raises(InvalidProblemError):
        solve_events(problem, deadline=LIMIT, threads=0)
    for cap in (-1.0, float("nan"), "1", True):
        with pytest.raises(InvalidProblemError):
            solve_events(problem, period_cap=cap, deadline=LIMIT)
    for hint in ([1], [2, 2], [0, 3], [3, 6]):
        with pytest.raises(InvalidProblemError):
            solve_events(problem, deadline=LIMIT, hint=hint)
    with pytest.raises(InvalidProblemError):
        solve_events(PartitionProblem(inst, 3, replication=True), deadline=LIMIT)
    with pytest.raises(InvalidProblemError):
        solve_events(problem, deadline=-1.0)
