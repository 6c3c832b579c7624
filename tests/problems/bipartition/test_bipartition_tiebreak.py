"""Bi-Partition's secondary objective (pipeopt.problems.bipartition.tiebreak): both exact methods
(the MILP, with and without the relaxation, on CBC and HiGHS, and the bisection) return, among
the plans of optimal period, one of least 1F1B-flush iteration time - the brute-force minimum
over the tied plans -, a real tie changes the plan, and a second phase that runs out of time or
whose solver crashes keeps the proven plan."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import brute_force as bf
from pipeopt import evaluate
from pipeopt.backends.deadline import Deadline
from pipeopt.problems import secondary
from pipeopt.problems.bipartition import tiebreak
from pipeopt.problems.bipartition.milp import solve_bisection, solve_milp
from pipeopt.problems.bipartition.problem import BipartitionProblem
from pipeopt.result import Status
from test_bipartition import MB, chain_instance

REL = 1e-9
METHODS = {
    "milp": lambda p: solve_milp(p, time_limit=None),
    "milp-plain-highs": lambda p: solve_milp(p, time_limit=None, solver="highs", dp_bound=False),
    "bisection": lambda p: solve_bisection(p, time_limit=None),
}
# a chain whose heavy second layer sets the period: 3 plans tie, their iteration times differ
TIE = dict(fwd=[0.5, 10.0, 1.5, 1.5], bwd=[1.0, 20.0, 3.0, 3.0], act=[19.3, 9.2, 19.5, 5.3],
           param=[8.5, 1.7, 19.2, 9.5], out=[5.6, 4.8, 8.5, 9.8], stages=3, bandwidth=2e10)


def least_iteration(problem: BipartitionProblem) -> tuple[float, float]:
    """Brute force: the optimal period and the least iteration time (evaluate) over the tied plans."""
    inst = problem.instance
    best, tied = bf.tied_plans(inst, bf.bipartition_plans(inst, problem.stages, problem.max_shift), REL)
    return best, min(evaluate(inst, plan).iteration_time for plan in tied)


@st.composite
def instances(draw):
    """Small chains, often with one layer that dominates (many plans tie on the period)."""
    n = draw(st.integers(3, 6))
    S = draw(st.integers(2, min(3, n)))
    fwd = [draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])) for _ in range(n)]
    bwd = [f * draw(st.sampled_from([1.0, 2.0, 3.0])) for f in fwd]
    if draw(st.booleans()):
        h = draw(st.integers(0, n - 1))
        fwd[h], bwd[h] = 10.0, 20.0
    sizes = st.floats(1.0, 20.0)
    kw = dict(act=[draw(sizes) for _ in range(n)], param=[draw(sizes) for _ in range(n)],
              out=[draw(sizes) for _ in range(n)], stages=S, bandwidth=draw(st.sampled_from([2e9, 2e10])),
              overlap=draw(st.booleans()), microbatches=draw(st.integers(1, 6)))
    memory = draw(st.sampled_from([math.inf, 200.0]))
    inst = chain_instance(fwd, bwd, memory=memory * MB, **kw)
    return BipartitionProblem(inst, S, max_shift=draw(st.sampled_from([None, 1])))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=instances())
def test_exact_methods_agree_with_brute_force(problem):
    best, least = least_iteration(problem)
    if not math.isfinite(best):
        return  # nothing fits: the methods raise (tested elsewhere)
    for name, solve in METHODS.items():
        r = solve(problem)
        if name == "bisection" and r.info.get("relaxed_plan_fits") is False:
            # the memory relaxation's plan breaks memory: by design the bisection then returns the
            # best same-cut plan without proof (FEASIBLE), with the relaxation's bound
            assert r.status == Status.FEASIBLE, (name, r.status)
            assert r.lower_bound <= best * (1 + REL) and r.objective >= best * (1 - REL)
            continue
        assert r.status == Status.OPTIMAL, (name, r.status)
        rec = r.info["secondary"]
        assert math.isclose(rec["cap"], best, rel_tol=1e-9), name
        assert r.objective <= rec["cap"] * (1 + REL)
        assert math.isclose(rec["value"], r.evaluation.iteration_time, rel_tol=1e-12)
        assert rec["proven"], (name, rec)
        assert math.isclose(rec["value"], least, rel_tol=1e-9), (name, rec["value"], least)


def test_a_real_tie_changes_the_plan(monkeypatch):
    """Without the second phase the MILP returns a tied plan of longer iteration; with it, the
    plan of least iteration time (both methods)."""
    p = BipartitionProblem(chain_instance(**TIE), 3)
    with monkeypatch.context() as m:
        m.setattr(secondary, "budget", lambda deadline: None)  # no time for the second phase
        first = solve_milp(p, time_limit=None)
    best, least = least_iteration(p)
    assert first.info["secondary"]["proven"] is False
    assert first.evaluation.iteration_time > least * (1 + 1e-3)
    for solve in (solve_milp, solve_bisection):
        r = solve(p, time_limit=None)
        rec = r.info["secondary"]
        assert rec["proven"] and "improved_from" in rec
        assert math.isclose(r.objective, best, rel_tol=REL)
        assert (r.info["fwd_cuts"], r.info["bwd_cuts"]) != (first.info["fwd_cuts"], first.info["bwd_cuts"])
        assert math.isclose(r.evaluation.iteration_time, least, rel_tol=1e-12)


def test_a_stopped_or_crashed_phase_keeps_the_proven_plan(monkeypatch):
    """A second phase out of time, or whose solver process crashed, returns the proven plan with
    proven=False and the primary plan's iteration time in the record."""
    p = BipartitionProblem(chain_instance(**TIE), 3)

    def crash(*args, **kwargs):
        raise RuntimeError("CBC failed (exit code -11)")

    for patch, key in ((lambda m: m.setattr(secondary, "budget", lambda d: Deadline(1e-9)), "stopped"),
                       (lambda m: m.setattr(tiebreak, "solve_pulp", crash), "error")):
        with monkeypatch.context() as m:
            patch(m)
            r = solve_milp(p, time_limit=None)
        rec = r.info["secondary"]
        assert r.status == Status.OPTIMAL and rec["proven"] is False and key in rec
        assert "improved_from" not in rec and rec["value"] == r.evaluation.iteration_time


def test_the_phase_does_not_depend_on_the_clock(monkeypatch):
    """The same call gives the same plan with or without a time limit, and a MILP above the size
    rule is not run (said in the record) rather than cut short by the clock (issue 22)."""
    p = BipartitionProblem(chain_instance(**TIE), 3)
    runs = [solve_milp(p, time_limit=limit) for limit in (None, None, 600.0)]
    assert len({(tuple(r.info["fwd_cuts"]), tuple(r.info["bwd_cuts"])) for r in runs}) == 1
    assert len({r.info["secondary"]["value"] for r in runs}) == 1
    monkeypatch.setattr(tiebreak, "EVENTS_SIZE", 0)
    r = solve_milp(p, time_limit=None)
    rec = r.info["secondary"]
    assert rec["proven"] is False and rec["status"] == "not run" and "EVENTS_SIZE" in rec["note"]
    assert "improved_from" not in rec
