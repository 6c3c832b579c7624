"""Data parallelism and ZeRO in the schedule problem (issue 25): ``exhaustive`` (the method that
declares them) equals the brute force over every split (x every recompute set) run by the executor
under ZeRO stages 0..3, dp 1..4 and the training-state ratios (GPipe, 1F1B, ZBV with two chunks
per rank); its recompute choice counts each chunk's sharded state (a chain that fits without
recomputation under ZeRO-3 only); the MILP (the schedule's W places) equals exhaustive under them;
``auto`` and the MILP with free W places refuse them, naming exhaustive."""

from __future__ import annotations

import math

import pytest
from brute_force import schedule_recompute_optimum, schedule_recompute_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from checks import assert_milp_equals_exhaustive
from strategies import binding_memory, chain_graph, zero_chains

from pipeopt import Cluster, Instance, Settings, solve
from pipeopt.errors import InvalidProblemError
from pipeopt.problems.schedule import ScheduleProblem, exhaustive
from pipeopt.schedules import run_schedule

REL = 1e-9
SCHEDULES = {"GPipe": 1, "1F1B": 1, "ZBVZeroBubble": 2}


def _instance(fwd, act, param, memory, state: dict, latency=0.0, collective=None):
    g = chain_graph(fwd, [2 * f for f in fwd], out=[5e7] * len(fwd), act=act, param=param)
    cluster = Cluster.homogeneous(2, kind="gpu", memory=memory, bandwidth=1e9, latency=latency)
    return Instance(g, cluster.with_overrides(collective_bandwidth=collective), Settings(**state), name="zero")


@st.composite
def cases(draw, schedule: str):
    """A ScheduleProblem on a random chain on 2 ranks with random ZeRO settings, whose memory sits
    between the least fullest-rank memory of the plans recomputing every layer and of those
    recomputing none (the ZeRO stage's state included)."""
    v = SCHEDULES[schedule]
    n = draw(st.integers(2 * v + (1 if v == 1 else 0), 2 * v + 2))
    fwd, act, param, state, latency = draw(zero_chains(n))
    collective = draw(st.sampled_from([None, 4e8]))  # ZeRO's collectives at the link's rate or slower
    m = draw(st.sampled_from([2, 4]))
    free = ScheduleProblem(_instance(fwd, act, param, math.inf, state, latency, collective), schedule, 2, m, v)
    sched, inst = free.schedule, free.instance

    def least(plans):
        return min(max(run_schedule(inst, sched, p).memory) for p in plans)

    every = least(schedule_recompute_plans(inst, sched, forced=True))
    none = least(p for p in schedule_recompute_plans(inst, sched) if not any(s.recompute for s in p.stages))
    memory = binding_memory(draw, every, none)
    return ScheduleProblem(_instance(fwd, act, param, memory, state, latency, collective), schedule, 2, m, v)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_exhaustive_with_zero_equals_brute_force(schedule):
    @settings(max_examples=6 if SCHEDULES[schedule] > 1 else 15, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(problem=cases(schedule))
    def run(problem):
        assert problem.instance.settings.data_parallel
        for rc in ("none", "auto"):
            prob = ScheduleProblem(problem.instance, problem.schedule, recompute=rc)
            res = exhaustive(prob)
            plans = schedule_recompute_plans(prob.instance, prob.schedule)
            if rc == "none":
                plans = (p for p in plans if not any(s.recompute for s in p.stages))
            best = min((ex.time for ex in (run_schedule(prob.instance, prob.schedule, p) for p in plans)
                        if ex.feasible), default=math.inf)
            if not math.isfinite(best):
                assert res.status == "infeasible"
                continue
            assert res.status == "optimal", res.info
            assert math.isclose(res.objective, best, rel_tol=REL, abs_tol=1e-12), (rc, res.objective, best)
            ex = run_schedule(prob.instance, prob.schedule, res.plan)
            assert ex.feasible and ex.time == res.objective

    run()


def test_zero_stage_decides_the_recompute_set_and_others_refuse():
    """A chain where ZeRO-0 needs more recomputation than ZeRO-3 (the sharded state frees memory):
    exhaustive follows the executor in both; solve's milp and auto refuse the settings naming
    exhaustive, which solve runs."""
    fwd, act, param = [1.0, 2.0, 1.0, 2.0], [6e8, 6e8, 6e8, 6e8], [5e7] * 4
    adam = {"dp": 4, "gradient_ratio": 1.0, "optimizer_ratio": 6.0}
    free = ScheduleProblem(_instance(fwd, act, param, math.inf, {"zero": 3, **adam}), "1F1B", 2, 4)
    inst3 = free.instance
    none3 = min(max(run_schedule(inst3, free.schedule, p).memory) for p in schedule_recompute_plans(
        inst3, free.schedule) if not any(s.recompute for s in p.stages))
    for z in (0, 3):  # fits without recomputation under ZeRO-3 only; with the exact sets under both
        inst = _instance(fwd, act, param, none3 * 1.001, {"zero": z, **adam})
        plain = exhaustive(ScheduleProblem(inst, "1F1B", 2, 4))
        assert plain.status == ("optimal" if z == 3 else "infeasible")
        res = exhaustive(ScheduleProblem(inst, "1F1B", 2, 4, recompute="auto"))
        best, _ = schedule_recompute_optimum(inst, res.evaluation.schedule)
        assert res.status == "optimal" and math.isclose(res.objective, best, rel_tol=REL)
        assert z == 3 or any(s.recompute for s in res.plan.stages)
    kw = dict(problem="schedule", schedule="1F1B", stages=2, microbatches=4, recompute="auto")
    with pytest.raises(InvalidProblemError, match="exhaustive"):  # auto's free-order route does not model them
        solve(inst, method="auto", **kw)
    by_milp, by_ex = solve(inst, method="milp", **kw), solve(inst, method="exhaustive", **kw)
    assert by_milp.status == by_ex.status == "optimal"
    assert math.isclose(by_milp.objective, by_ex.objective, rel_tol=1e-6)
    with pytest.raises(InvalidProblemError, match="exhaustive"):
        solve(inst, method="milp", w_placement="free", **{**kw, "schedule": "InterleavedZeroBubble"})


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_milp_with_zero_equals_exhaustive(schedule):
    """The schedule MILP with ZeRO (each chunk's collectives in its F / B / I / W durations, its
    training state in the memory rows, the synchronisation after the flush in the objective) equals
    exhaustive (= the brute force above) under recompute none and auto."""
    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(problem=cases(schedule))
    def run(problem):
        for rc in ("none", "auto"):
            assert_milp_equals_exhaustive(ScheduleProblem(problem.instance, problem.schedule, recompute=rc))

    run()
