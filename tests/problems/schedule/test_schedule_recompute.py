"""Activation recomputation in the schedule problem (pipeopt.problems.schedule.recompute):

* ``exhaustive`` with ``recompute="auto"`` (every split with each chunk's exact recompute set)
  equals the brute force over every split x every per-layer choice, each plan run by the
  executor (tests/brute_force.py), for GPipe, 1F1B, a zero-bubble schedule with one chunk per rank
  (InterleavedZeroBubble, v = 1: I and W split) and ZBVZeroBubble (v = 2: a rank's two chunks
  share its memory); ``"full"`` equals the brute force over the splits with every layer recomputed;
* the claimed objective is the executor's time of the returned plan, which carries the chosen sets;
* the MILP (one chunk per rank: each chunk's least rerun seconds over the split's binaries; two
  chunks per rank, ZBV: a binary per layer and the rank's memory rows per count vector) equals the
  same brute force, its bound valid;
* a chain that fits only with recomputation; the MILP refuses free W places with a typed error
  naming ``exhaustive``; ``solve`` and the CLI route ``--recompute auto`` to the MILP (free W
  places: ``exhaustive``).
"""

from __future__ import annotations

import json
import math

import pytest
from brute_force import schedule_recompute_optimum, schedule_recompute_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from checks import assert_milp_equals_exhaustive
from strategies import chain_graph

from pipeopt import Cluster, Instance, Settings, solve
from pipeopt.errors import InvalidProblemError
from pipeopt.problems.schedule import ScheduleProblem, exhaustive, solve_milp
from pipeopt.schedules import run_schedule

REL = 1e-9
FEW = settings(max_examples=6, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SCHEDULES = {"GPipe": 1, "1F1B": 1, "InterleavedZeroBubble": 1, "ZBVZeroBubble": 2}
"""Schedules tested -> v (p = 2 ranks)."""


def _instance(fwd, act, out, param, memory, skips=(), overlap=True):
    g = chain_graph(fwd, [2 * f for f in fwd], out=out, act=act, param=param, skips=skips)
    return Instance(g, Cluster.homogeneous(2, kind="gpu", memory=memory, bandwidth=1e9), Settings(overlap=overlap),
                    name="rc")


def _least_memory(inst, schedule, plans) -> float:
    """The least, over ``plans``, of the fullest rank's peak memory (by the executor)."""
    return min(max(run_schedule(inst, schedule, p).memory) for p in plans)


@st.composite
def cases(draw, schedule: str, v: int | None = None):
    """A ScheduleProblem (``recompute`` unset) on a random chain of p v + 0..2 layers on 2
    ranks, m in 2..4, whose memory sits from a little below the least memory of the plans that
    recompute every layer to a little above the least of those that recompute none."""
    v = SCHEDULES[schedule] if v is None else v
    n = draw(st.integers(2 * v + (1 if v == 1 else 0), 2 * v + 2))
    fwd = draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=n, max_size=n))
    act = draw(st.lists(st.integers(0, 10).map(lambda k: k * 1e8), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(0, 5).map(lambda k: k * 5e7), min_size=n, max_size=n))
    param = draw(st.lists(st.integers(0, 3).map(lambda k: k * 5e7), min_size=n, max_size=n))
    skips = [(0, n - 1)] if n >= 3 and draw(st.booleans()) else []
    overlap = draw(st.booleans())
    m = draw(st.sampled_from([4] if schedule == "DualPipeV" else [2, 4]))  # DualPipeV needs m >= 2p
    free = ScheduleProblem(_instance(fwd, act, out, param, math.inf, skips, overlap), schedule, 2, m, v)
    sched = free.schedule
    everything = _least_memory(free.instance, sched, schedule_recompute_plans(free.instance, sched, forced=True))
    nothing = _least_memory(free.instance, sched, (p for p in schedule_recompute_plans(free.instance, sched)
                                                   if not any(s.recompute for s in p.stages)))
    lo, hi = min(everything, nothing), max(everything, nothing)
    memory = max(lo + draw(st.floats(-0.05, 1.1)) * (hi - lo), 1e6)
    return ScheduleProblem(_instance(fwd, act, out, param, memory, skips, overlap), schedule, 2, m, v)


def _check(problem, rc: str):
    """exhaustive(recompute=rc) = the brute force; its claim is the executor's time of its plan."""
    prob = ScheduleProblem(problem.instance, problem.schedule, recompute=rc)
    res = exhaustive(prob)
    best, _ = schedule_recompute_optimum(prob.instance, prob.schedule, forced=rc == "full")
    if not math.isfinite(best):
        assert res.status == "infeasible" and res.plan is None
        return
    assert res.status == "optimal", res.info
    assert math.isclose(res.objective, best, rel_tol=REL, abs_tol=1e-12), (res.objective, best)
    ex = run_schedule(prob.instance, prob.schedule, res.plan)
    assert ex.feasible and res.objective == ex.time and res.lower_bound <= res.objective * (1 + 1e-12)
    assert res.info["recompute"] == rc
    if rc == "full":
        assert all(st.recompute == dict.fromkeys(st.layers, "full") for st in res.plan.stages)
    # the MILP: one chunk per rank by the frontier rows, two by a binary per layer; the same optimum, a valid bound
    mi = solve_milp(prob, time_limit=None)
    if True:
        assert mi.status == "optimal", mi.info
        assert math.isclose(mi.objective, best, rel_tol=1e-6, abs_tol=1e-12), (mi.objective, best)
        assert mi.lower_bound <= mi.objective * (1 + 1e-9)
        assert mi.objective == run_schedule(prob.instance, prob.schedule, mi.plan).time


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_exhaustive_equals_brute_force(schedule):
    @FEW
    @given(problem=cases(schedule))
    def run(problem):
        _check(problem, "auto")

    run()


@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_full_equals_brute_force(schedule):
    @settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(problem=cases(schedule))
    def run(problem):
        _check(problem, "full")

    run()


TWO_CHUNKS = ["Interleaved1F1B", "InterleavedZeroBubble", "DualPipeV"]
"""Further schedules with two chunks per rank (p = 2) whose MILP is checked against exhaustive."""


@pytest.mark.parametrize("schedule", TWO_CHUNKS)
def test_milp_two_chunks_equals_exhaustive(schedule):
    """With two chunks per rank the MILP (a binary per layer, the rank's memory rows per count
    vector) equals exhaustive (= the brute force, checked on ZBV above) under auto and full."""
    @settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(problem=cases(schedule, 2))
    def run(problem):
        assert problem.stages_per_rank == 2
        for rc in ("auto", "full"):
            assert_milp_equals_exhaustive(ScheduleProblem(problem.instance, problem.schedule, recompute=rc))

    run()


def _tight():
    """A 4-layer chain on 2 ranks under 1F1B (m = 4) whose memory fits only with recomputation."""
    fwd, act = [1.0, 2.0, 1.0, 2.0], [8e8, 8e8, 8e8, 8e8]
    out, param = [1e8] * 4, [5e7] * 4
    free = ScheduleProblem(_instance(fwd, act, out, param, math.inf), "1F1B", 2, 4)
    nothing = _least_memory(free.instance, free.schedule, (p for p in schedule_recompute_plans(
        free.instance, free.schedule) if not any(s.recompute for s in p.stages)))
    return _instance(fwd, act, out, param, 0.8 * nothing)


def test_fits_only_with_recompute():
    inst = _tight()
    assert exhaustive(ScheduleProblem(inst, "1F1B", 2, 4)).status == "infeasible"
    res = exhaustive(ScheduleProblem(inst, "1F1B", 2, 4, recompute="auto"))
    assert res.status == "optimal" and any(st.recompute for st in res.plan.stages)
    best, _ = schedule_recompute_optimum(inst, res.evaluation.schedule)
    assert math.isclose(res.objective, best, rel_tol=REL)
    # the default exact method: the MILP with one chunk per rank and with two (a binary per layer), the
    # same optimum as exhaustive; the baselines refuse recomputation
    auto = solve(inst, problem="schedule", schedule="1F1B", stages=2, microbatches=4, recompute="auto")
    assert auto.method == "milp" and auto.info["chosen"]["method"] == "milp"
    assert math.isclose(auto.objective, res.objective, rel_tol=1e-6)
    zbv = dict(problem="schedule", schedule="ZBV", stages=2, microbatches=4, recompute="auto")
    by_milp = solve(inst, **zbv)
    assert by_milp.info["chosen"]["method"] == "milp" and by_milp.status == "optimal"
    assert math.isclose(by_milp.objective, solve(inst, method="exhaustive", **zbv).objective, rel_tol=1e-6)
    with pytest.raises(InvalidProblemError, match="exhaustive"):
        solve_milp(ScheduleProblem(inst, "InterleavedZeroBubble", 2, 4, 1, recompute="full", w_placement="free"))
    with pytest.raises(InvalidProblemError, match="does not model activation recomputation"):
        solve(inst, problem="schedule", method="uniform", schedule="1F1B", stages=2, microbatches=4, recompute="auto")
    with pytest.raises(InvalidProblemError, match="recompute"):
        ScheduleProblem(inst, "1F1B", 2, 4, recompute="some")
    with pytest.raises(InvalidProblemError, match="free order"):
        ScheduleProblem(inst, "free", 2, 4, recompute="auto")


def test_cli_recompute(tmp_path, capsys):
    from pipeopt.cli import main
    from pipeopt.io import write

    inst = _tight()
    path = write(inst, tmp_path / "inst.json")
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                 "--recompute", "auto", "--save-plan", str(plan)]) == 0
    assert "recomputed: " in capsys.readouterr().out  # the execution's assumptions name the recomputed layers
    assert '"recompute"' in plan.read_text()
    assert main(["solve", str(path), "--schedule", "1f1b", "--stages", "2", "--microbatches", "4",
                 "--recompute", "full", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["schedules"][0]
    assert row["recompute"] == [{"l0": "full", "l1": "full"}, {"l2": "full", "l3": "full"}] and row["method"] == "milp"
    assert main(["solve", str(path), "--schedule", "auto", "--stages", "2", "--recompute", "auto"]) == 2
    assert "named --schedule" in capsys.readouterr().err


def test_free_w_placement_equals_brute_force():
    """With every W placed freely (a deferred W keeps its microbatch's activations longer, so
    the counts in flight differ per placement), exhaustive = the brute force over every W
    placement x every split x every recompute set."""
    from pipeopt.problems.schedule.exhaustive import w_assignments
    from pipeopt.schedules.w_gaps import place_w, rank_gaps

    fwd, act = [1.0, 2.0, 1.0, 1.5], [6e8, 8e8, 3e8, 7e8]
    out, param = [1e8, 2e8, 1e8, 1e8], [5e7] * 4
    free = ScheduleProblem(_instance(fwd, act, out, param, math.inf), "InterleavedZeroBubble", 2, 2, 1)
    nothing = _least_memory(free.instance, free.schedule, (p for p in schedule_recompute_plans(
        free.instance, free.schedule) if not any(s.recompute for s in p.stages)))
    inst = _instance(fwd, act, out, param, 0.7 * nothing)
    prob = ScheduleProblem(inst, "InterleavedZeroBubble", 2, 2, 1, w_placement="free", recompute="auto")
    res = exhaustive(prob)
    gaps = rank_gaps(prob.schedule)
    best = min(schedule_recompute_optimum(inst, place_w(prob.schedule, a, gaps))[0] for a in w_assignments(gaps))
    assert math.isfinite(best) and res.status == "optimal" and any(st.recompute for st in res.plan.stages)
    assert math.isclose(res.objective, best, rel_tol=REL)
    assert res.objective == run_schedule(inst, res.evaluation.schedule, res.plan).time


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "Interleaved1F1B"])
def test_milp_warm_start_is_no_slower_than_the_uniform_split_with_exact_sets(schedule):
    """Two chunks per rank: the MILP's warm start takes each candidate split's exact recompute
    sets where they beat the budget heuristic's, so it is never slower than the uniform split
    with its exact sets (the baseline), nor is the MILP's answer."""
    from pipeopt.problems.schedule.baselines import uniform

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(problem=cases(schedule, v=2))
    def run(problem):
        prob = ScheduleProblem(problem.instance, problem.schedule, recompute="auto")
        base = uniform(prob)
        if str(base.status) == "infeasible":
            return
        mi = solve_milp(prob, time_limit=None)
        warm = mi.info.get("warm_start_value", mi.objective)  # none when there is one split only
        assert warm is not None and warm <= base.objective * (1 + 1e-12), (warm, base.objective)
        assert mi.objective <= base.objective * (1 + 1e-9)

    run()
