"""The joint and group problems' secondary objective (pipeopt.problems.resource.tiebreak): every
exact method returns, among the plans of optimal period, one of least latency of a microbatch
- the same value for all of them, equal to a brute-force minimum over the tied plans -, a real
tie changes the plan, and a second phase that runs out of time keeps the proven plan."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import brute_force as bf
from pipeopt import evaluate
from pipeopt.backends.deadline import Deadline
from pipeopt.problems import secondary
from pipeopt.problems.resource import JointProblem, group, joint
from pipeopt.problems.resource.tiebreak import LatencyDP, latency
from pipeopt.result import Status
from test_resource_exact import build

REL = 1e-9
METHODS = {"joint": (joint.solve_dp, joint.solve_milp, joint.solve_cpsat),
           "group": (group.solve_milp, group.solve_cpsat)}


def _plans(problem):
    inst, S = problem.instance, problem.num_stages
    return bf.joint_plans(inst, S) if isinstance(problem, JointProblem) else bf.group_plans(inst, S)


def least_latency(problem, slack: float = 0.0) -> tuple[float, float]:
    """Brute force: the optimal period T* and the least latency (the 1F1B-flush iteration time of
    one microbatch, by evaluate) over every plan of period at most ``T* (1 + slack)``, each stage
    with its shares of least f + b within that cap (:func:`pipeopt.problems.resource.split.least_busy`,
    itself checked against share grids in test_windows.py)."""
    best, tied = bf.tied_plans(problem.instance, _plans(problem), max(slack, REL))
    cap = best * (1 + slack)
    values = []
    for plan in tied:
        starts, groups = problem.starts_of(plan), [st.devices for st in plan.stages]
        T = next((t for t in (cap, cap * (1 + REL)) if problem.check(starts, groups, t).ok), None)
        if T is not None:
            values.append(latency(problem, problem.plan(starts, groups, "split", limit=T)))
    return best, min(values)


def _agree(problem):
    """Run every exact method; check each against brute force and against the others."""
    best, least = least_latency(problem)
    found = []
    for solve in METHODS["joint" if isinstance(problem, JointProblem) else "group"]:
        r = solve(problem, time_limit=None)
        assert r.status == Status.OPTIMAL, (solve.__name__, r.status)
        rec = r.info["secondary"]
        # the phase never loses the primary optimum, and its value is the plan's latency
        assert r.objective <= rec["cap"] * (1 + REL)
        assert math.isclose(rec["value"], latency(problem, r.plan), rel_tol=1e-12)
        assert math.isclose(rec["iteration_time"], r.evaluation.iteration_time, rel_tol=1e-12)
        if math.isclose(rec["cap"], best, rel_tol=REL):  # the same tie set as the brute force
            assert rec["proven"], (solve.__name__, rec)
            assert math.isclose(rec["value"], least, rel_tol=1e-7), (solve.__name__, rec["value"], least)
            found.append(rec["value"])
    assert len(found) >= 1
    assert max(found) <= min(found) * (1 + 1e-7)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(3, 5), bandwidth=st.sampled_from(["fast", "tight"]),
       memory=st.sampled_from(["inf", "exact"]))
def test_joint_methods_agree_with_brute_force(seed, n, bandwidth, memory):
    _agree(build("joint", seed, n, "mid", memory, bandwidth))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(3, 5), bandwidth=st.sampled_from(["fast", "tight"]),
       memory=st.sampled_from(["inf", "exact"]))
def test_group_methods_agree_with_brute_force(seed, n, bandwidth, memory):
    _agree(build("group", seed, n, "mid", memory, bandwidth, devices=3))


def _stages(result) -> list:
    return [(st.layers, st.devices) for st in result.plan.stages]


@pytest.mark.parametrize(("problem", "solve"), [
    (lambda: build("joint", 6, 6, "mid", "inf", "fast"), joint.solve_dp),  # another split
    (lambda: build("group", 0, 5, "mid", "inf", "tight", devices=3), group.solve_cpsat),  # another grouping
])
def test_a_real_tie_changes_the_plan(problem, solve, monkeypatch):
    """Without the second phase the method returns another plan of the same period and a longer
    latency; with it, the plan of least latency."""
    p = problem()
    with monkeypatch.context() as m:
        m.setattr(secondary, "budget", lambda deadline: None)  # no time for the second phase
        first = solve(p, time_limit=None)
    tied = solve(p, time_limit=None)
    assert first.info["secondary"]["proven"] is False and tied.info["secondary"]["proven"] is True
    assert math.isclose(tied.objective, first.objective, rel_tol=REL)
    assert _stages(tied) != _stages(first)
    assert latency(p, tied.plan) < latency(p, first.plan) * (1 - 1e-3)
    assert math.isclose(latency(p, tied.plan), least_latency(p)[1], rel_tol=1e-7)


def test_a_phase_out_of_time_keeps_the_proven_plan(monkeypatch):
    """A second phase stopped by its clock returns the primary plan, proven=False, and leaves the
    record as it was (the primary plan's latency)."""
    p = build("group", 0, 5, "mid", "inf", "tight", devices=3)
    monkeypatch.setattr(secondary, "budget", lambda deadline: Deadline(1e-9))
    r = group.solve_milp(p, time_limit=None)
    rec = r.info["secondary"]
    assert r.status == Status.OPTIMAL and rec["proven"] is False and "stopped" in rec
    assert "improved_from" not in rec and math.isclose(rec["value"], latency(p, r.plan), rel_tol=1e-12)


def test_latency_dp_at_a_looser_cap():
    """At a cap 5 % above the optimum (more plans tie) the DP's least latency is the brute-force
    minimum, and its sums are evaluate's latency of its plan (joint: fixed workers; group:
    counted devices, memory binding); below the optimum it finds no plan."""
    for p in (build("joint", 6, 6, "mid", "inf", "tight"), build("group", 3, 6, "mid", "exact", "fast", devices=3)):
        best, least = least_latency(p, 0.05)
        T = best * 1.05
        starts, groups, value = LatencyDP(p, T).solve()
        plan = p.plan(starts, groups, "split", limit=T)
        assert evaluate(p.instance, plan).objective <= T * (1 + 1e-12)
        assert math.isclose(value, latency(p, plan), rel_tol=1e-12)
        assert math.isclose(value, least, rel_tol=1e-9)
        assert LatencyDP(p, best * (1 - 1e-6)).solve() is None
