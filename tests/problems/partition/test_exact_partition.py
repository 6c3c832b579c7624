"""MILP (CBC, HiGHS) and CP-SAT for the straight partition problem, cross-checked against
the DP on every PipeDream profile and against brute-force enumeration on random instances."""

from __future__ import annotations

import math

import pytest
from conftest import PROFILES, profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import brute_force, instances

import pipeopt
from pipeopt import evaluate
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition.cpsat import solve_cpsat
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.milp import solve_milp
from pipeopt.problems.partition.model import StraightModel, balanced_split, heuristic_split
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status
from pipeopt.solve import solve

MILP_REL = 1e-6  # MILP: gap 1e-9 plus feasibility tolerances on scaled rows


def run_all(problem, time_limit, warm_start=True):
    """Every exact method of the one-order space on one problem, by name. ``warm_start=False``
    solves the bare formulations (no heuristic start, no reach rows / objective cap)."""
    return {
        "milp-cbc": solve_milp(problem, time_limit=time_limit, solver="cbc", warm_start=warm_start),
        "milp-highs": solve_milp(problem, time_limit=time_limit, solver="highs", warm_start=warm_start),
        "cpsat": solve_cpsat(problem, time_limit=time_limit, threads=2, warm_start=warm_start),
    }


def tolerance(name, res, opt):
    """Absolute tolerance (seconds) within which ``res`` must meet the optimum ``opt``."""
    if name == "cpsat":
        return res.info["tolerance_s"] + 1e-12
    return MILP_REL * max(opt, 1e-12)


def check_against(instance, opt, results, S):
    """The cross-checks of one problem whose straight optimum is ``opt`` (seconds)."""
    for name, res in results.items():
        tol = tolerance(name, res, opt)
        assert res.plan is not None, name
        assert res.plan.num_stages == S and all(st.replicas == 1 for st in res.plan.stages), name
        assert res.evaluation.feasible, (name, res.evaluation.violations)
        # the claimed objective is the evaluation of the plan ...
        assert res.objective == evaluate(instance, res.plan).objective
        # ... and the solver's own objective value agrees with it
        own = res.info.get("solver_objective")
        if own is not None and res.info.get("incumbent") is None:  # the plan is the solver's
            stol = res.info["tolerance_s"] + 1e-12 if name == "cpsat" else MILP_REL * max(own, 1e-12)
            assert abs(own - res.objective) <= stol, (name, own, res.objective)
        assert res.lower_bound is not None and res.lower_bound <= opt + tol, (name, res.lower_bound, opt)
        assert res.objective >= opt - tol, (name, res.objective, opt)
        assert res.status in (Status.OPTIMAL, Status.TIME_LIMIT), name
        if res.status == Status.OPTIMAL:
            assert abs(res.objective - opt) <= tol, (name, res.objective, opt)
            if res.objective > 0:
                assert res.gap is not None and res.gap <= 1e-5, (name, res.gap)
    # the proven ones agree with each other too
    proven = [r.objective for r in results.values() if r.status == Status.OPTIMAL]
    if proven:
        assert max(proven) - min(proven) <= 2 * max(tolerance(k, r, opt) for k, r in results.items())


# ---- every PipeDream profile, S in {2, 4, 8} -------------------------------------------------
def _limit(n: int) -> float:
    """Short limits keep this file fast; the slow variant below gives every solve 60 s."""
    return 20.0 if n <= 100 else 2.0


@pytest.mark.parametrize("S", [2, 4, 8])
@pytest.mark.parametrize("name", PROFILES)
def test_profiles_agree_with_dp(name, S, profile_dir):
    inst = profile(name)
    p = PartitionProblem(inst, S)
    dp = solve_dp(p)
    check_against(inst, dp.objective, run_all(p, _limit(p.n)), S)


SMALL = [
    name
    for name in PROFILES
    if name in ("alexnet", "vgg16", "gnmt", "gnmt_large", "resnet18", "squeezenet1_0")
]


@pytest.mark.parametrize("S", [2, 4, 8])
@pytest.mark.parametrize("name", SMALL)
def test_bare_formulations_agree_with_dp(name, S, profile_dir):
    """Without the heuristic start (and the rows derived from its value) the models alone
    still find and prove the DP optimum: they do not lean on the heuristic."""
    inst = profile(name)
    p = PartitionProblem(inst, S)
    dp = solve_dp(p)
    check_against(inst, dp.objective, run_all(p, 20.0, warm_start=False), S)


@pytest.mark.slow
@pytest.mark.parametrize("S", [2, 4, 8])
@pytest.mark.parametrize("name", PROFILES)
def test_profiles_agree_with_dp_exhaustive(name, S, profile_dir):
    inst = profile(name)
    p = PartitionProblem(inst, S)
    dp = solve_dp(p)
    # up to 400 units (the target) every method must prove the optimum: run without a
    # wall-clock limit (a proof asserted under one fails on a loaded machine); above, 60 s each
    # and only the honest bracket bound <= optimum <= incumbent is checked
    results = run_all(p, None if p.n <= 400 else 60.0)
    check_against(inst, dp.objective, results, S)
    if p.n <= 400:
        assert all(r.status == Status.OPTIMAL for r in results.values()), {
            k: r.status for k, r in results.items()
        }


def test_time_limit_reports_incumbent_and_true_bound(profile_dir):
    """On the largest profile a 1 s limit cannot prove S = 8: the result says so honestly."""
    inst = profile("nasnetalarge")
    p = PartitionProblem(inst, 8)
    opt = solve_dp(p).objective
    for res in (solve_milp(p, time_limit=1.0, solver="cbc"), solve_cpsat(p, time_limit=1.0)):
        assert res.status in (Status.OPTIMAL, Status.TIME_LIMIT)
        assert res.plan is not None and res.objective >= opt * (1 - 1e-9)
        assert res.lower_bound <= opt * (1 + 1e-9)
        if res.status == Status.TIME_LIMIT:
            assert res.gap is not None and res.gap >= 0


# ---- random instances: brute force = DP = MILP = CP-SAT ------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=10, dag=True, memory=True, alpha=True), S=st.integers(1, 4))
def test_random_instances_match_brute_force(inst, S):
    S = min(S, inst.chain.n)
    p = PartitionProblem(inst, S)
    best = brute_force(p)  # every split into S contiguous stages (p is straight)
    if math.isinf(best):
        for run in (
            solve_dp,
            lambda q: solve_milp(q, solver="cbc", time_limit=None),
            lambda q: solve_milp(q, solver="highs", time_limit=None),
            lambda q: solve_cpsat(q, time_limit=None),
        ):
            with pytest.raises(InfeasibleError, match="memory|GiB"):
                run(p)
        return
    dp = solve_dp(p)
    assert dp.objective == pytest.approx(best, rel=1e-9, abs=1e-15)
    for warm in (True, False):
        results = run_all(p, None, warm_start=warm)
        for res in results.values():  # tiny instances: everything is proven
            assert res.status == Status.OPTIMAL, res.info
        check_against(inst, best, results, S)


# ---- the pieces shared by both formulations ------------------------------------------------
def test_windows_and_warm_start_are_valid_splits(profile_dir):
    inst = profile("resnet50")
    for S in (1, 2, 5, 16):
        m = StraightModel.of(PartitionProblem(inst, S))
        for starts in (balanced_split(m), heuristic_split(m)):
            assert len(starts) == S - 1
            assert all(a < b for a, b in zip([0, *starts], [*starts, m.n]))
            assert all(starts[t - 1] in m.window(t) for t in range(1, S))
            # the model's value of a split is the evaluation of its plan
            ev = evaluate(inst, m.problem.plan(starts))
            assert m.bottleneck(starts) == pytest.approx(ev.objective, rel=1e-12)


@pytest.mark.parametrize("overlap", [True, False])
def test_model_arrays_are_the_stage_time(overlap, profile_dir):
    """``end[b] - begin[a]`` and the cut terms are PartitionProblem.stage_time, for every stage."""
    import random

    inst = profile("inception_v3").with_settings(overlap=overlap)
    p = PartitionProblem(inst, 6)
    m = StraightModel.of(p)
    rng = random.Random(2)
    for _ in range(200):
        a, b = sorted(rng.sample(range(m.n + 1), 2))
        linear = max(m.end[b] - m.begin[a], m.cut[a], m.cut[b])
        assert linear == pytest.approx(float(p.stage_time(a, b, in_flight=1, memory=False)), rel=1e-12)


@pytest.mark.parametrize("overlap", [True, False])
def test_cpsat_rounding_relaxes(overlap, profile_dir):
    """The integer value of a split is never above its true value (so CP-SAT's bound is a valid
    lower bound) and at most the stated tolerance below it."""
    import random

    inst = profile("inception_v3").with_settings(overlap=overlap)
    m = StraightModel.of(PartitionProblem(inst, 6))
    assert m.windowed == overlap
    b, e, c, q = m.ticks(m.begin), m.ticks(m.end), m.ticks(m.cut), m.ticks(m.mid)
    rng = random.Random(1)
    for _ in range(300):
        starts = sorted(rng.sample(range(1, m.n), m.S - 1))
        p = [0, *starts, m.n]
        rows = [e[p[i + 1]] - b[p[i]] - 1 for i in range(m.S)] + [c[x] for x in starts]
        for i, l in m.windows():  # window rows: ceil((left side - k) / k)
            k = l - i + 1
            rows.append(-(-(e[p[l + 1]] - b[p[i]] + sum(q[p[x]] for x in range(i + 1, l + 1)) - k) // k))
        integer = max(rows) * m.tick
        true = m.bottleneck(starts)
        assert true - m.tolerance <= integer <= true
    assert m.tolerance < 1e-8 * m.top


# ---- bad input ---------------------------------------------------------------------------
def test_memory_too_small_raises_infeasible(profile_dir):
    from pipeopt.io.pipedream import read_pipedream

    inst = read_pipedream(profile_dir / "vgg16.txt", devices=8, memory=2**20)
    p = PartitionProblem(inst, 4)
    for run in (
        solve_dp,
        lambda q: solve_milp(q, solver="cbc", time_limit=None),
        lambda q: solve_milp(q, solver="highs", time_limit=None),
        lambda q: solve_cpsat(q, time_limit=None),
    ):
        with pytest.raises(InfeasibleError, match="memory|GiB"):
            run(p)


def test_memory_limit_binds_and_all_agree(profile_dir):
    """A capacity between the unconstrained optimum's memory and the minimum changes the optimum."""
    from pipeopt.io.pipedream import read_pipedream

    free = PartitionProblem(profile("vgg16", 8), 4)
    base = solve_dp(free)
    cap = 0.9 * max(base.evaluation.memory)
    inst = read_pipedream(profile_dir / "vgg16.txt", devices=8, memory=cap)
    p = PartitionProblem(inst, 4)
    dp = solve_dp(p)
    assert dp.objective > base.objective
    results = run_all(p, None)
    assert all(r.status == Status.OPTIMAL for r in results.values())
    check_against(inst, dp.objective, results, 4)


@pytest.mark.parametrize("solve", [solve_milp, solve_cpsat])
def test_replication_is_rejected(solve, profile_dir):
    p = PartitionProblem(profile("alexnet"), 4, replication=True)
    with pytest.raises(InvalidProblemError, match="replication.*DP"):
        solve(p, time_limit=5)


def test_unknown_milp_solver(profile_dir):
    with pytest.raises(InvalidProblemError, match="gurobi"):
        solve_milp(PartitionProblem(profile("alexnet"), 2), solver="gurobi")


def test_through_registry(profile_dir):
    inst = profile("gnmt")
    dp = solve(inst, method="dp", stages=4)
    for method, solver in (("milp", "cbc"), ("milp", "highs"), ("cpsat", "cbc")):
        res = solve(inst, method=method, solver=solver, time_limit=None, stages=4)
        assert res.method == method and res.space == "one-order" and res.status == Status.OPTIMAL
        assert res.objective == pytest.approx(dp.objective, rel=1e-6)


@pytest.mark.parametrize("S", [4, 8])
@pytest.mark.parametrize("variant", ["no_overlap", "slow_network", "stashing_memory"])
def test_settings_variants_agree_with_dp(variant, S, profile_dir):
    """Communication added to stages, communication-bound cuts, and a binding 1F1B memory
    limit with weight stashing: every model still meets the DP."""
    from pipeopt.io.pipedream import read_pipedream

    path = profile_dir / "gnmt_large.txt"
    if variant == "no_overlap":
        inst = read_pipedream(path, settings=pipeopt.Settings(overlap=False))
    elif variant == "slow_network":
        inst = read_pipedream(path, bandwidth=1e9)
    else:
        stash = pipeopt.Settings(weight_stashing=True)
        free = solve_dp(PartitionProblem(read_pipedream(path, settings=stash), S))
        inst = read_pipedream(path, settings=stash, memory=0.8 * max(free.evaluation.memory))
    p = PartitionProblem(inst, S)
    dp = solve_dp(p)
    if variant == "stashing_memory":
        assert StraightModel.of(p).memory_binding and dp.objective >= free.objective
    results = run_all(p, None)
    assert all(r.status == Status.OPTIMAL for r in results.values()), {k: r.info for k, r in results.items()}
    check_against(inst, dp.objective, results, S)
