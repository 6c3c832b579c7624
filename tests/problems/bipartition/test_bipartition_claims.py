"""Bi-Partition: every claim true (bounds valid, optimal only when proven, the time limit honest).

Small instances are checked against the brute force over every pair of (forward cuts,
backward cuts) of :func:`test_bipartition.brute_force`; the random cross-check of the whole
package (tests/test_crosscheck.py) covers many more.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bipartition import MB, TINY, all_cuts, brute_force, chain_instance

from pipeopt import Cluster, Device, evaluate
from pipeopt.backends.deadline import Deadline
from pipeopt.cost import rules
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.bipartition.greedy import same_cut
from pipeopt.problems.bipartition.milp import (
    _Relaxation,
    build_model,
    relaxation_optimum,
    solve_bisection,
    solve_milp,
)
from pipeopt.problems.bipartition.problem import BipartitionProblem
from pipeopt.result import Status

SOLVERS = ("cbc", "highs")


def with_capacity(inst, capacity: float):
    """The instance with every device's memory set to ``capacity`` bytes."""
    devs = tuple(Device(d.name, d.resources, capacity) for d in inst.cluster.devices)
    return inst.replace(cluster=Cluster(devs, inst.cluster.bandwidth))


def plans(p: BipartitionProblem):
    for a in all_cuts(p.n, p.stages):
        for b in all_cuts(p.n, p.stages):
            if p.max_shift is None or all(abs(x - y) <= p.max_shift for x, y in zip(a, b, strict=True)):
                yield a, b


# ---- the cost model is read, not copied -------------------------------------------------------


def test_score_reads_the_rules(monkeypatch):
    """A change of a rule in pipeopt.cost.rules changes the score and evaluate alike."""
    inst = chain_instance(**TINY, stages=3, overlap=False, bandwidth=1e9)
    p = BipartitionProblem(inst, 3)
    a, b = [2, 4], [3, 5]
    before = p.score(a, b)
    monkeypatch.setattr(rules, "migration_bytes", lambda act, par, m: (2 * act, 2 * par / m))
    after, ev = p.score(a, b), evaluate(inst, p.plan(a, b))
    assert after.bottleneck > before.bottleneck
    assert after.bottleneck == pytest.approx(ev.bottleneck, rel=1e-12)
    np.testing.assert_allclose(after.comm_time, ev.comm_time, rtol=1e-12)


def test_memory_exactly_at_capacity_fits():
    """A capacity equal (as a float) to a plan's peak stage memory: that plan fits, in the score,
    in evaluate and in the MILP (whose memory row has the same slack)."""
    free = chain_instance(**TINY, stages=3)
    p0 = BipartitionProblem(free, 3)
    a, b = [2, 4], [3, 5]
    cap = float(max(evaluate(free, p0.plan(a, b)).memory))
    p = BipartitionProblem(with_capacity(free, cap), 3)
    assert p.score(a, b).fits and evaluate(p.instance, p.plan(a, b)).feasible
    best = brute_force(p)
    for solver in SOLVERS:
        r = solve_milp(p, time_limit=None, solver=solver)
        assert r.status == Status.OPTIMAL and r.objective == pytest.approx(best, rel=1e-6)
        assert r.lower_bound <= best * (1 + 1e-9)


# ---- the relaxation ---------------------------------------------------------------------------


@st.composite
def small_problem(draw, memory: bool = True):
    n = draw(st.integers(2, 8))
    S = draw(st.integers(1, min(n, 4)))
    times = st.floats(0.0, 10.0)
    fwd = draw(st.lists(times, min_size=n, max_size=n))
    bwd = draw(st.lists(times, min_size=n, max_size=n))
    sizes = st.floats(0.0, 50.0)
    act, param, out = (draw(st.lists(sizes, min_size=n, max_size=n)) for _ in range(3))
    inst = chain_instance(fwd, bwd, act, param, out, stages=S, bandwidth=draw(st.sampled_from([2e8, 1e10, 1e12])),
                          overlap=draw(st.booleans()), stashing=draw(st.booleans()),
                          microbatches=draw(st.integers(1, 8)))
    shift = draw(st.one_of(st.none(), st.integers(0, 2)))
    p = BipartitionProblem(inst, S, max_shift=shift)
    if memory and draw(st.integers(0, 2)):  # a capacity equal to some plan's peak: binding, exact
        peaks = sorted(max(p.score(a, b).memory) for a, b in plans(p))
        cap = peaks[draw(st.integers(0, len(peaks) // 2))]  # the lower half: the relaxation rarely fits
        if cap > 0:
            p = BipartitionProblem(with_capacity(inst, cap), S, max_shift=shift)
    return p


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(small_problem(memory=False), st.floats(0.5, 1.5))
def test_relaxation_probe_and_windows_are_exact(p, factor):
    """At any T the probe accepts iff some plan has bottleneck <= T (memory ignored; a plan at
    exactly T is accepted), and the windows contain every such plan."""
    relax = _Relaxation(p)
    values = {(tuple(a), tuple(b)): p.score(a, b).bottleneck for a, b in plans(p)}
    best = min(values.values())
    for T in {best, best * factor, max(values.values())}:
        passing = [k for k, v in values.items() if v <= T]
        reach = relax.reach(T)
        if passing:
            assert reach is not None
        if reach is None:
            continue
        assert best <= relax.relaxed(T) * (1 + 1e-12)  # accepted only within its float slack
        a, b = relax.cuts(T, reach)
        assert p.score(a, b).bottleneck <= relax.relaxed(T) * (1 + 1e-12)
        win = relax.windows(T)
        for fa, fb in passing:
            for c, (alo, ahi, blo, bhi) in enumerate(win):
                assert alo <= fa[c] <= ahi and blo <= fb[c] <= bhi


def test_relaxation_stops_at_the_deadline_with_a_valid_bound():
    p = BipartitionProblem(chain_instance(**TINY, stages=3), 3)
    best = brute_force(p)
    rel = relaxation_optimum(p, deadline=Deadline(1e-9))  # passed before the first probe
    assert not rel.closed and rel.probes == 0
    assert rel.lower == pytest.approx(p.simple_lower_bound()) and rel.lower <= best
    assert rel.value == pytest.approx(same_cut(p).objective, rel=1e-12)


# ---- the methods against the brute force --------------------------------------------------------


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(small_problem())
def test_methods_claim_only_what_is_true(p):
    best = brute_force(p)
    runs = [lambda: solve_bisection(p, time_limit=None)]
    runs += [lambda s=s, d=d: solve_milp(p, time_limit=None, solver=s, dp_bound=d) for s in SOLVERS for d in (True, False)]
    for run in runs:
        if not math.isfinite(best):
            with pytest.raises(InfeasibleError):
                run()
            continue
        r = run()
        assert r.plan is not None and r.evaluation.feasible
        assert r.objective == pytest.approx(evaluate(p.instance, r.plan).objective, rel=1e-12)
        assert r.objective >= best * (1 - 1e-12)
        assert r.lower_bound is not None and r.lower_bound <= best * (1 + 1e-9)
        if r.status == Status.OPTIMAL:
            assert r.objective <= best * (1 + r.info["gap_tolerance"])
        else:  # only the bisection may stop without proof (memory binds): never a time limit here
            assert r.method == "bisection" and r.status == Status.FEASIBLE


def test_highs_cap_regression():
    """HiGHS once fixed T at its cap (1e-6 above the optimum, inside its tolerance) and quoted
    that as its bound: the bound must stay at or below the optimum."""
    inst = chain_instance([2.40149102261132, 0.1, 2.0], [4.80298204522264, 0.1, 4.0], [0.0, 0.0, 0.0],
                          [0.0, 0.0, 26.036818202394873], [22.69288611029314, 0.0, 36.44655227887622],
                          stages=2, bandwidth=1e10, overlap=False)
    p = BipartitionProblem(inst, 2)
    best = brute_force(p)
    for solver in SOLVERS:
        r = solve_milp(p, time_limit=None, solver=solver, dp_bound=False)
        assert r.status == Status.OPTIMAL and r.lower_bound <= best


@pytest.mark.parametrize("stages", [1, 7])
def test_single_plan_is_optimal(stages):
    """S = 1 and S = n: both splits are forced; every exact method proves the one plan."""
    p = BipartitionProblem(chain_instance(**TINY, stages=stages), stages)
    only = brute_force(p)
    for r in (solve_bisection(p), solve_milp(p, solver="cbc"), solve_milp(p, solver="highs", dp_bound=False)):
        assert r.status == Status.OPTIMAL and r.objective == pytest.approx(only, rel=1e-12)
        assert r.lower_bound == r.objective


def test_max_shift_with_binding_memory_uses_the_milp():
    """Memory binds and the shift limit binds: the relaxation cannot prove it, the windowed MILP does."""
    p = BipartitionProblem(chain_instance(**TINY, stages=3, memory=250 * MB, stashing=True), 3, max_shift=1)
    best = brute_force(p)  # 29.5 ms; the best same-cut plan: 31.5 ms; the relaxation: 15 ms
    for solver in SOLVERS:
        r = solve_milp(p, time_limit=None, solver=solver)
        assert r.status == Status.OPTIMAL and r.objective == pytest.approx(best, rel=1e-6)
        assert r.lower_bound <= best * (1 + 1e-9)
        assert "solver_bound" in r.info  # the MILP ran
    d = solve_bisection(p)
    assert d.lower_bound <= best and d.objective >= best * (1 - 1e-12)


def test_build_model_windows_keep_the_optimum():
    p = BipartitionProblem(chain_instance(**TINY, stages=3, memory=300 * MB), 3)
    best = brute_force(p)
    win = _Relaxation(p).windows(best * (1 + 1e-6))
    full, _, _, _ = build_model(p, best / 1e3)
    small, _, _, _ = build_model(p, best / 1e3, windows=win)
    assert len(small.variables()) < len(full.variables())


# ---- the time limit -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["milp", "bisection"])
def test_expired_deadline_gives_an_honest_time_limit(method):
    """A deadline that has passed: the same-cut DP cannot run, no plan, status time_limit and
    the simple bound (valid)."""
    p = BipartitionProblem(chain_instance(**TINY, stages=3), 3)
    f = solve_milp if method == "milp" else solve_bisection
    r = f(p, time_limit=Deadline(1e-9))
    assert r.status == Status.TIME_LIMIT and r.plan is None
    assert r.lower_bound == pytest.approx(p.simple_lower_bound()) and r.lower_bound <= brute_force(p)


@pytest.mark.parametrize("solver", SOLVERS)
def test_time_limit_on_a_real_profile_is_honest(solver, profile_dir):
    """NASNet-A Large (1250 units) in 16 stages with 1 s: the method stops (status time_limit or
    optimal) with a bound; a plan, if it found one in the second (a loaded machine may not), fits
    and is above the bound."""
    from pipeopt.io.pipedream import read_pipedream

    p = BipartitionProblem(read_pipedream(profile_dir / "nasnetalarge.txt", devices=16), 16)
    r = solve_milp(p, time_limit=1, solver=solver, dp_bound=False)
    assert r.status in (Status.TIME_LIMIT, Status.OPTIMAL)
    assert r.lower_bound is not None
    if r.status == Status.TIME_LIMIT:
        assert r.info["time_limit_reached"]
    if r.plan is None:
        assert r.status == Status.TIME_LIMIT
        return
    assert r.evaluation.feasible and r.lower_bound <= r.objective
    if r.status == Status.TIME_LIMIT:
        assert r.gap > 0


def test_bad_options_raise():
    p = BipartitionProblem(chain_instance(**TINY, stages=3), 3)
    for kw in (dict(gap=0), dict(gap=1.5), dict(threads=0), dict(seed=-1), dict(solver="gurobi")):
        with pytest.raises(InvalidProblemError):
            solve_milp(p, **kw)
    with pytest.raises(InvalidProblemError, match="gap"):
        solve_bisection(p, gap=-1)
    for limit in (0, -1, math.nan, "1s"):
        with pytest.raises(InvalidProblemError, match="time limit"):
            solve_milp(p, time_limit=limit)


def test_plan_fitting_only_within_the_memory_slack():
    """Cross-check finding F7: a capacity 1e-10 below the only plan's memory. evaluate's slack
    (rules.fits) accepts it, and so must every method (the score once used its own slack)."""
    import networkx as nx

    from pipeopt import Instance, Settings

    g = nx.DiGraph()
    g.add_node("l0", fwd={"gpu": 0.04460247962907241}, bwd={"gpu": 0.14450745278671812}, out_bytes=36797911.81,
               act_bytes=31546214.099999998, param_bytes=18201304.97)
    g.add_node("input", fwd={"gpu": 0.00019341488336921896}, bwd={"gpu": 0.0}, out_bytes=27922509.0,
               act_bytes=9697233.72, param_bytes=0.0, pin_first=True)
    g.add_edge("input", "l0")
    cluster = Cluster((Device("gpu0", {"gpu": 1.0}, 59444752.78405552),), bandwidth=348950287.77016747)
    inst = Instance(g, cluster, Settings(overlap=False, weight_stashing=False, microbatches=4))
    p = BipartitionProblem(inst, 1, max_shift=0)
    ev = evaluate(inst, p.plan([], []))
    assert ev.feasible and p.score([], []).fits
    for r in (solve_bisection(p), *(solve_milp(p, solver=s) for s in SOLVERS)):
        assert r.status == Status.OPTIMAL and r.objective == ev.objective


def test_windowed_milp_counts_the_weights_of_a_fixed_forward_unit():
    """Regression: with the relaxation's windows a unit's forward membership can be a constant 1
    while its backward membership is a variable; its weights must still count in the stage's
    memory (the MILP once returned a plan 20 MB over the capacity)."""
    inst = chain_instance(fwd=[1.248, 9.819, 8.068, 9.437, 2.502, 6.771],
                          bwd=[2.952, 35.003, 8.624, 33.389, 2.592, 23.44],
                          act=[49.205, 35.096, 3.075, 9.37, 20.675, 17.471],
                          param=[17.605, 29.692, 24.219, 25.86, 10.202, 47.3],
                          out=[34.116, 26.513, 20.481, 0.559, 43.297, 54.594],
                          stages=2, bandwidth=1e11, overlap=False, microbatches=4)
    free = BipartitionProblem(inst, 2)
    peaks = sorted(max(free.score(a, b).memory) for a, b in plans(free))
    p = BipartitionProblem(with_capacity(inst, peaks[8]), 2)
    best = brute_force(p)
    for solver in SOLVERS:
        r = solve_milp(p, time_limit=None, solver=solver)
        assert r.status == Status.OPTIMAL and r.objective == pytest.approx(best, rel=1e-6)
        assert "milp" not in r.info.get("rejected_candidates", {})
