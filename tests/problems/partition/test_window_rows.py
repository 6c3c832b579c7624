"""The 1F1B window rows of the straight MILP and CP-SAT models (issue 8).

The models minimise exactly :func:`pipeopt.evaluate`'s bottleneck, the steady-state period
with the window rows ``sum_{s=i..l} w_s + sum_{c=i+1..l} trip[p_c] <= (l - i + 1) T``
(:meth:`PartitionProblem.period`):

* the max of the model's rows over a split is its period (read off the model arrays), and a
  solver with the split fixed finds T = its period (MILP) or at most it and within the
  stated tolerance (CP-SAT's integer ticks);
* CBC, HiGHS and CP-SAT prove the brute-force optimum (every split scored by ``evaluate``)
  on random instances and on the edge cases: S = 1, S = n, tight bandwidth with the window
  rows binding, memory binding at exactly the capacity, fractional bytes;
* on a real profile (VGG16) the three agree on the objective, with and without binding
  window rows.

Nothing here reads the DP (it is the reference of other tests).
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pulp
import pytest
from conftest import PROFILE_DIR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from strategies import chain_instance, instances, straight_splits

import pipeopt.io
from pipeopt import Instance, evaluate
from pipeopt.errors import InfeasibleError
from pipeopt.problems.partition import cpsat as cpsat_module
from pipeopt.problems.partition.binary_search import plan_time
from pipeopt.problems.partition.cpsat import build_cpsat, solve_cpsat
from pipeopt.problems.partition.milp import build_milp, solve_milp
from pipeopt.problems.partition.model import StraightModel
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status

def cpsat_chain(problem, **kw):
    """CP-SAT with the window rows stated through prefix sums and a running minimum (the form
    it takes for S above 49)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpsat_module, "WINDOW_TERMS", 0)
        return solve_cpsat(problem, threads=2, **kw)


METHODS = {
    "milp-cbc": lambda p, **kw: solve_milp(p, solver="cbc", **kw),
    "milp-highs": lambda p, **kw: solve_milp(p, solver="highs", **kw),
    "cpsat": lambda p, **kw: solve_cpsat(p, threads=2, **kw),
    "cpsat-chain": cpsat_chain,
}
REL = 1e-6  # the MILP's stated tolerance; CP-SAT states an absolute one (three ticks)


# ---- helpers -------------------------------------------------------------------------------
def chain(work, out, act=None, param=None, *, memory=math.inf, bandwidth=1e6, overlap=True, stashing=False):
    """A chain l0 -> l1 -> ... with forward times ``work`` (backward the same), output bytes
    ``out`` (what crosses a cut after the layer) and the given memory bytes."""
    return chain_instance(work, work, out, act or 0.0, param or 0.0, memory=memory, bandwidth=bandwidth,
                          cast=float, overlap=overlap, weight_stashing=stashing, name="windows")


splits = straight_splits


def brute_force(problem) -> tuple[float, float]:
    """(best evaluate() objective over the splits that fit, best max stage time over them):
    the second is the optimum without the window rows (inf if no split fits)."""
    best, stage_only = math.inf, math.inf
    for starts in splits(problem):
        ev = evaluate(problem.instance, problem.plan(starts))
        if ev.feasible:
            best = min(best, ev.objective)
            p = [0, *starts, problem.n]
            times = [float(problem.stage_time(p[t], p[t + 1], in_flight=1, memory=False))
                     for t in range(problem.stages)]
            stage_only = min(stage_only, max(times))
    return best, stage_only


def rows_max(m: StraightModel, starts) -> float:
    """The max over the model's rows of a split, in seconds: stage rows, cut rows, window rows."""
    p = [0, *starts, m.n]
    vals = [m.end[p[t + 1]] - m.begin[p[t]] for t in range(m.S)] + [m.cut[c] for c in starts]
    for i, l in m.windows():
        inner = sum(m.mid[p[c]] for c in range(i + 1, l + 1))
        vals.append((m.end[p[l + 1]] - m.begin[p[i]] + inner) / (l - i + 1))
    return float(max(vals))


def integer_value(m: StraightModel, starts) -> int:
    """The least T (ticks) of CP-SAT's rows for a split (:func:`build_cpsat`)."""
    e, b, c, q = m.ticks(m.end), m.ticks(m.begin), m.ticks(m.cut), m.ticks(m.mid)
    p = [0, *starts, m.n]
    rows = [(i, i) for i in range(m.S)] + m.windows()
    vals = []
    for i, l in rows:
        k = l - i + 1
        lhs = e[p[l + 1]] - b[p[i]] + sum(q[p[x]] for x in range(i + 1, l + 1)) - k
        vals.append(-(-lhs // k))
    if max(c) > 0:
        vals += [c[x] for x in starts]
    return max(vals)


def stage_optimum(problem) -> float:
    """The optimum without the window rows (max of stage and cut rows; memory ignored)."""
    m = StraightModel.of(problem)
    best = math.inf
    for starts in splits(problem):
        p = [0, *starts, m.n]
        best = min(best, max(max(m.end[b] - m.begin[a] for a, b in itertools.pairwise(p)),
                             max((m.cut[c] for c in starts), default=0.0)))
    return best


def check(problem, res, opt: float) -> None:
    """One result's claims against the true optimum ``opt`` (seconds, finite)."""
    assert res.plan is not None, res.info
    ev = evaluate(problem.instance, res.plan)
    assert res.objective == ev.objective and ev.feasible
    assert res.plan.num_stages == problem.stages
    assert res.lower_bound is not None and res.lower_bound <= opt * (1 + 1e-9) + 1e-15, (res.lower_bound, opt)
    assert res.objective >= opt * (1 - 1e-9) - 1e-15
    if res.status == Status.OPTIMAL:
        tol = max(REL * opt, res.info.get("tolerance_s", 0.0)) + 1e-15
        assert res.objective - opt <= tol, (res.method, res.objective, opt, res.info)


def all_prove(problem, opt: float, **kw) -> dict:
    """Every model proves ``opt`` (warm start on and off)."""
    out = {}
    for warm in (True, False):
        for name, run in METHODS.items():
            res = run(problem, time_limit=None, warm_start=warm, **kw)
            check(problem, res, opt)
            assert res.status == Status.OPTIMAL, (name, warm, res.status, res.info)
            out[name, warm] = res
    return out


def vgg16(bandwidth=None, overlap=True, memory=None) -> Instance:
    path = PROFILE_DIR / "vgg16.txt"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    inst = pipeopt.io.load(path, devices=16, bandwidth=bandwidth, memory=memory)
    return inst if overlap else inst.with_settings(overlap=False)


# ---- the rows are the period -------------------------------------------------------------------
@pytest.mark.parametrize("bandwidth", [None, 1e9, 2e8])
@pytest.mark.parametrize("overlap", [True, False])
def test_rows_are_the_period(overlap, bandwidth):
    """For every split: max of the model's rows == PartitionProblem.period == evaluate's
    bottleneck == StraightModel.bottleneck == plan_time; and the window rows do bind somewhere."""
    inst = vgg16(bandwidth, overlap)
    rng = random.Random(3)
    binding = 0
    for S in (2, 3, 5, 8):
        p = PartitionProblem(inst, S)
        m = StraightModel.of(p)
        assert m.windowed == overlap  # without overlap the rows are sums of stage rows
        for _ in range(60):
            starts = sorted(rng.sample(range(1, m.n), S - 1))
            period = p.period(starts)
            assert rows_max(m, starts) == pytest.approx(period, rel=1e-12)
            assert evaluate(inst, p.plan(starts)).bottleneck == pytest.approx(period, rel=1e-12)
            assert m.bottleneck(starts) == period == plan_time(p, starts, memory=False)
            stages = max(m.end[b] - m.begin[a] for a, b in itertools.pairwise([0, *starts, m.n]))
            binding += period > max(stages, *(m.cut[c] for c in starts)) * (1 + 1e-9)
    assert (binding > 0) == overlap


def test_plan_time_with_memory():
    """plan_time is the period if every stage fits, inf if one does not."""
    inst = chain([1.0, 1.0, 1.0, 1.0], [10.0, 10.0, 10.0, 0.0], act=[4.0] * 4, memory=20.0, bandwidth=10.0)
    p = PartitionProblem(inst, 2)
    assert plan_time(p, [2]) == p.period([2]) == evaluate(inst, p.plan([2])).objective
    assert plan_time(p, [3]) == math.inf  # stage 0: 3 units x 4 B x 2 in flight = 24 B > 20 B
    assert plan_time(p, [3], memory=False) == p.period([3])


@pytest.mark.parametrize("overlap", [True, False])
def test_cpsat_integer_value_relaxes_with_windows(overlap):
    """CP-SAT's integer value of a split (its rows, window rows included) is at most its true
    period and at most the stated tolerance below it, and within T's domain."""
    inst = vgg16(2e8, overlap)
    rng = random.Random(5)
    for S in (2, 4, 8):
        m = StraightModel.of(PartitionProblem(inst, S))
        _cp, T, _p = build_cpsat(m)
        top = list(T.proto.domain)[-1]
        for _ in range(200):
            starts = sorted(rng.sample(range(1, m.n), S - 1))
            value = integer_value(m, starts)
            true = m.bottleneck(starts)
            assert value <= top
            assert true - m.tolerance <= value * m.tick <= true
        assert m.tolerance < 1e-8 * m.top


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("overlap", [True, False])
def test_fixed_split_solves_to_its_period(overlap, chain, monkeypatch):
    """With the split fixed, the MILP's T is the split's period and CP-SAT's T is at most it
    and within the tolerance (window rows written out, or as prefix sums and a running
    minimum): each model's rows are the objective, nothing more or less."""
    if chain:
        monkeypatch.setattr(cpsat_module, "WINDOW_TERMS", 0)
    inst = vgg16(5e8, overlap)
    rng = random.Random(7)
    for S in (3, 6):
        m = StraightModel.of(PartitionProblem(inst, S))
        unit = m.time_unit
        for _ in range(4):
            starts = sorted(rng.sample(range(1, m.n), S - 1))
            true = m.bottleneck(starts)
            lp, T, y = build_milp(m, unit)
            for t in y:
                for c, v in y[t].items():
                    lp += v == float(c >= starts[t - 1])
            lp.solve(pulp.PULP_CBC_CMD(msg=0))
            assert pulp.LpStatus[lp.status] == "Optimal"
            assert T.value() * unit == pytest.approx(max(true, m.lower_bound), rel=1e-7)
            cp, Tc, p = build_cpsat(m)
            for t in range(1, S):
                cp.add(p[t] == starts[t - 1])
            cp.minimize(Tc)
            solver = cp_model.CpSolver()
            assert solver.solve(cp) == cp_model.OPTIMAL
            got = solver.value(Tc) * m.tick
            assert true - m.tolerance <= got <= true
            assert solver.value(Tc) == max(integer_value(m, starts), list(Tc.proto.domain)[0])


# ---- exact methods = brute force --------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=7, dag=True, memory=True, alpha=True), S=st.integers(1, 7))
def test_random_instances_match_brute_force(inst, S):
    """MILP (CBC, HiGHS) and CP-SAT prove the brute-force optimum of evaluate's bottleneck, or
    raise InfeasibleError exactly when no split fits (S from 1 to n)."""
    S = min(S, inst.chain.n)
    p = PartitionProblem(inst, S)
    opt, _ = brute_force(p)
    if math.isinf(opt):
        for run in METHODS.values():
            with pytest.raises(InfeasibleError, match="memory|GiB"):
                run(p, time_limit=None)
        return
    all_prove(p, opt)


def test_single_stage_and_one_stage_per_layer():
    """S = 1 and S = n (one split each; for S = n the window rows bind)."""
    work, out = [1.0, 3.0, 2.0, 1.0], [4.0, 1.0, 6.0, 0.0]
    inst = chain(work, out, bandwidth=2.0)
    one = PartitionProblem(inst, 1)
    assert brute_force(one)[0] == 14.0
    all_prove(one, 14.0)
    each = PartitionProblem(inst, 4)
    opt, stage_only = brute_force(each)
    assert opt > stage_only * (1 + 1e-6)  # the window rows bind
    all_prove(each, opt)


@pytest.mark.parametrize("overlap", [True, False])
def test_tight_bandwidth_windows_bind(overlap):
    """Cuts of the order of compute: the optimum of evaluate's bottleneck differs from the
    optimum of the stage times alone, and every model proves the former."""
    work = [1.0, 2.0, 1.5, 1.0, 2.5, 1.0, 0.5]
    out = [3.0, 1.0, 2.0, 2.5, 0.5, 1.5, 0.0]
    inst = chain(work, out, bandwidth=1.0, overlap=overlap)
    for S in (2, 3, 4):
        p = PartitionProblem(inst, S)
        opt, stage_only = brute_force(p)
        if overlap and S >= 3:
            assert opt > stage_only * (1 + 1e-6)
        if not overlap:  # the window rows are sums of stage rows
            assert opt == pytest.approx(stage_only, rel=1e-12)
        res = all_prove(p, opt)
        for r in res.values():
            assert r.objective == pytest.approx(opt, rel=1e-9)


@pytest.mark.parametrize("stashing", [False, True])
def test_memory_exactly_at_capacity_with_windows(stashing):
    """The capacity is exactly (a float, not a whole byte) what stage 0 of the best split needs;
    the window rows bind: that split is the optimum and every model proves it."""
    work, out = [1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 2.0, 0.25, 2.0, 0.0]
    act, param = [100.3, 200.7, 10.1, 10.2, 5.5], [33.33, 0.6, 0.7, 0.8, 0.9]
    free = PartitionProblem(chain(work, out, act, param, bandwidth=1.0, stashing=stashing), 3)
    opt_free, stage_only = brute_force(free)
    assert opt_free > stage_only * (1 + 1e-6)
    best = min(splits(free), key=lambda s: (evaluate(free.instance, free.plan(s)).objective, s))
    cap = max(evaluate(free.instance, free.plan(best)).memory)
    assert cap != math.floor(cap)
    p = PartitionProblem(chain(work, out, act, param, memory=cap, bandwidth=1.0, stashing=stashing), 3)
    opt, _ = brute_force(p)
    assert opt == pytest.approx(opt_free, rel=1e-12)
    assert StraightModel.of(p).memory_binding
    all_prove(p, opt)


def test_fractional_bytes_memory_binding_with_windows():
    """Byte counts with fractions, a capacity half a byte between two splits' needs: the faster
    one does not fit, every model proves the best one that does (windows binding)."""
    work, out = [1.0, 1.0, 0.1, 3.0, 0.5], [1.5, 0.25, 2.75, 0.125, 0.0]
    act = [100.15, 100.15, 0.3, 50.0, 0.7]
    free = PartitionProblem(chain(work, out, act, bandwidth=1.0), 2)
    ranked = sorted(splits(free), key=lambda s: evaluate(free.instance, free.plan(s)).objective)
    mem0 = [evaluate(free.instance, free.plan(s)).memory[0] for s in ranked]
    # a capacity just below the best split's stage-0 memory and above some other's
    k = next(i for i in range(1, len(ranked)) if mem0[i] < mem0[0] - 0.5)
    cap = mem0[0] - 0.25
    assert cap != math.floor(cap)
    p = PartitionProblem(chain(work, out, act, memory=cap, bandwidth=1.0), 2)
    opt, _ = brute_force(p)
    assert opt > evaluate(free.instance, free.plan(ranked[0])).objective
    assert opt <= evaluate(free.instance, free.plan(ranked[k])).objective
    all_prove(p, opt)


# ---- a real profile -----------------------------------------------------------------------------
@pytest.mark.parametrize("bandwidth", [None, 1e9])
def test_vgg16_brute_force(bandwidth):
    """VGG16, S = 2 and 3: every model proves the brute-force optimum of evaluate (for S = 3
    above the optimum of the stage times alone: the window rows bind)."""
    inst = vgg16(bandwidth)
    for S in (2, 3):
        p = PartitionProblem(inst, S)
        # every split fits (no memory limit): score them by the period (= evaluate, checked above)
        opt = min(p.period(s) for s in splits(p))
        best = min(splits(p), key=p.period)
        assert evaluate(inst, p.plan(best)).objective == pytest.approx(opt, rel=1e-12)
        if S == 3:  # the window rows bind
            assert opt > stage_optimum(p) * (1 + 1e-6)
        for name, run in METHODS.items():
            res = run(p, time_limit=None)
            check(p, res, opt)
            assert res.status == Status.OPTIMAL, (name, res.info)


@pytest.mark.parametrize("S", [4, 8])
@pytest.mark.parametrize("bandwidth", [None, 1e9, 2e8])
def test_vgg16_milp_equals_cpsat(bandwidth, S):
    """VGG16: CBC, HiGHS and CP-SAT prove the same objective (within their tolerances); for
    S = 4 the window rows bind (the optimum of the stage times alone is lower)."""
    inst = vgg16(bandwidth)
    p = PartitionProblem(inst, S)
    res = {name: run(p, time_limit=None) for name, run in METHODS.items()}
    for name, r in res.items():
        assert r.status == Status.OPTIMAL, (name, r.info)
        assert r.objective == evaluate(inst, r.plan).bottleneck
    objs = [r.objective for r in res.values()]
    tol = max(REL * max(objs), res["cpsat"].info["tolerance_s"], res["cpsat-chain"].info["tolerance_s"])
    assert max(objs) - min(objs) <= tol, objs
    assert max(r.lower_bound for r in res.values()) <= min(objs) * (1 + 1e-12)
    if S == 4:  # the window rows bind: the optimum of the stage times alone is lower
        assert min(objs) > stage_optimum(p) * (1 + 1e-6)


def test_no_window_rows_without_cut_costs():
    """Cuts that cost nothing (no bytes cross): no window rows in either model."""
    inst = chain([1.0, 2.0, 3.0, 1.0], [0.0] * 4)
    m = StraightModel.of(PartitionProblem(inst, 3))
    assert not m.windowed and m.windows() == []
    lp, _T, _y = build_milp(m, m.time_unit)
    assert not any(name.startswith("window") for name in lp.constraints)
    assert np.all(m.mid == 0)


# ---- the warm start ----------------------------------------------------------------------------
@pytest.mark.parametrize(("bandwidth", "memory", "stages"),
                         [(None, None, (2, 4, 8)), (2e8, None, (2, 4, 8)), (None, 8 * 2**30, (4,))])
def test_window_beam_meets_its_limit(bandwidth, memory, stages):
    """A split the beam search accepts at T (width 1: the greedy; 16) has period <= T and fits;
    the local search never makes a split worse; the warm start is a valid split."""
    from pipeopt.problems.partition.model import heuristic_split, improve_split, window_beam

    inst = vgg16(bandwidth, memory=memory)
    for S in stages:
        p = PartitionProblem(inst, S)
        m = StraightModel.of(p)
        assert m.memory_binding == (memory is not None)
        accepted = {1: 0, 16: 0}
        for T in np.linspace(m.lower_bound, 2 * m.top, 40):
            for width in accepted:
                starts = window_beam(m, float(T), width)
                if starts is None:
                    continue
                accepted[width] += 1
                assert len(starts) == S - 1 and all(x < y for x, y in itertools.pairwise([0, *starts, m.n]))
                assert m.fits(starts) and m.bottleneck(starts) <= T * (1 + 1e-12)
                better = improve_split(m, starts)
                assert m.value(better) <= m.value(starts)
                rows = m.row_values(np.array([0, *better, m.n]))[0]
                assert rows == pytest.approx(m.value(better), rel=1e-12)
        assert accepted[16] >= accepted[1] > 0
        h = heuristic_split(m)
        assert len(h) == S - 1 and all(h[t - 1] in m.window(t) for t in range(1, S))
