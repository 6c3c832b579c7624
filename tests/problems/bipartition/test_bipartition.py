"""Bi-Partition (separate forward and backward cuts): model, exact MILP, baselines."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import PROFILE_DIR
from pipeopt import Cluster, Instance, Settings, evaluate
from pipeopt.problems.bipartition.greedy import greedy, same_cut
from pipeopt.problems.bipartition.problem import BipartitionProblem
from pipeopt.errors import InfeasibleError, InvalidPlanError, InvalidProblemError
from pipeopt.problems.bipartition.milp import relaxation_optimum, solve_bisection, solve_milp
from pipeopt.plan import Plan, Stage
from pipeopt.registry import method, methods
from pipeopt.result import Status

PROFILES = PROFILE_DIR
MS = 1e-3
MB = 2**20


def chain_instance(fwd, bwd, act, param, out, *, skips=(), stages=3, memory=math.inf, bandwidth=2e10,
                   overlap=True, stashing=False, microbatches=4, name="tiny") -> Instance:
    """A chain l0 -> l1 -> ... (times in ms, sizes in MB) plus skip edges ``(u, v, MB)``."""
    g = nx.DiGraph()
    n = len(fwd)
    for i in range(n):
        g.add_node(f"l{i}", fwd={"gpu": fwd[i] * MS}, bwd={"gpu": bwd[i] * MS}, act_bytes=act[i] * MB,
                   param_bytes=param[i] * MB, out_bytes=out[i] * MB)
    for i in range(n - 1):
        g.add_edge(f"l{i}", f"l{i + 1}")
    for u, v, w in skips:
        g.add_edge(f"l{u}", f"l{v}", bytes=w * MB)
    cl = Cluster.homogeneous(stages, memory=memory, bandwidth=bandwidth)
    st_ = Settings(overlap=overlap, weight_stashing=stashing, microbatches=microbatches)
    return Instance(g, cl, st_, name=name)


def all_cuts(n: int, S: int):
    return [list(c) for c in itertools.combinations(range(1, n), S - 1)]


def brute_force(problem: BipartitionProblem) -> float:
    """Best feasible bottleneck over every pair of forward and backward splits, by evaluate."""
    best = math.inf
    for a in all_cuts(problem.n, problem.stages):
        for b in all_cuts(problem.n, problem.stages):
            if problem.max_shift is not None and any(abs(x - y) > problem.max_shift for x, y in zip(a, b)):
                continue
            ev = evaluate(problem.instance, problem.plan(a, b))
            if ev.feasible:
                best = min(best, ev.objective)
    return best


# a backward pass ~2x forward but uneven, heavy activations in the middle, a skip edge
TINY = dict(fwd=[1.0, 3.0, 2.0, 4.0, 1.0, 2.5, 1.5], bwd=[3.0, 4.0, 6.0, 5.0, 3.5, 2.0, 4.0],
            act=[40, 10, 30, 5, 20, 8, 2], param=[5, 80, 10, 60, 1, 30, 4], out=[8, 2, 6, 1, 4, 3, 1],
            skips=[(1, 4, 3.0)])

CASES = [  # at 2e10 B/s separate cuts gain in every case but the last two
    dict(stages=2),
    dict(stages=3),
    dict(stages=3, overlap=False),
    dict(stages=3, bandwidth=2e11),  # nearly free transfers
    dict(stages=3, memory=300 * MB),  # memory binds
    dict(stages=3, memory=250 * MB, stashing=True, overlap=False),
    dict(stages=2, memory=250 * MB),
    dict(stages=3, max_shift=1),  # the shift limit binds
    dict(stages=3, memory=50 * MB),  # nothing fits
    dict(stages=3, bandwidth=1e9),  # expensive transfers: the same-cut plan is optimal
    dict(stages=3, bandwidth=5e7, overlap=False),
]


def _case_id(c):
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items())


# ---- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_score_equals_evaluate_on_every_plan(case):
    case = dict(case)
    shift = case.pop("max_shift", None)
    inst = chain_instance(**TINY, **case)
    p = BipartitionProblem(inst, case["stages"], max_shift=shift)
    for a in all_cuts(p.n, p.stages):
        for b in all_cuts(p.n, p.stages):
            if shift is not None and any(abs(x - y) > shift for x, y in zip(a, b)):
                with pytest.raises(InvalidPlanError, match="max_shift"):
                    p.plan(a, b)
                continue
            s, ev = p.score(a, b), evaluate(inst, p.plan(a, b))
            assert s.bottleneck == pytest.approx(ev.bottleneck, rel=1e-12)
            np.testing.assert_allclose(s.stage_time, ev.stage_time, rtol=1e-12)
            np.testing.assert_allclose(s.comm_time, ev.comm_time, rtol=1e-12)
            np.testing.assert_allclose(s.memory, ev.memory, rtol=1e-12)
            assert (s.excess == 0) == ev.feasible
            assert p.cuts_of(p.plan(a, b)) == (a, b)


def test_transfers_by_hand():
    """Forward cut after l0, backward cut after l1: l1's forward on stage 1, backward on stage 0."""
    inst = chain_instance([1, 1, 1], [2, 2, 2], act=[10, 20, 30], param=[1, 8, 3], out=[4, 5, 6],
                          stages=2, microbatches=4, overlap=False, bandwidth=1e9)
    p = BipartitionProblem(inst, 2)
    ev = evaluate(inst, p.plan([1], [2]))
    # forward: l0's activation (4) + l1's weights going to its forward stage (8/4);
    # backward: l1's output gradient (5) + l1's stashed activation moving back (20)
    assert ev.comm_bytes[0] == pytest.approx((4 + 8 / 4 + 5 + 20) * MB)
    assert ev.stage_time[0] == pytest.approx((1 + 2 + 2) * MS + (4 + 2) * MB / 1e9)
    assert ev.stage_time[1] == pytest.approx((1 + 1 + 2) * MS + (5 + 20) * MB / 1e9)
    # memory: stage 0 keeps 2 microbatches of l0, l1 activations, weights of l0, l1;
    # stage 1 one microbatch of l2, weights of l1 (its forward) and l2
    assert ev.memory == pytest.approx([2 * 30 * MB + 9 * MB, 30 * MB + 11 * MB])


def test_same_cut_plans_score_as_straight_plans():
    inst = chain_instance(**TINY, stages=3, overlap=False, stashing=True, memory=400 * MB)
    p = BipartitionProblem(inst, 3)
    for a in all_cuts(p.n, 3):
        straight = p.same_cut_problem().plan(a)
        e1, e2 = evaluate(inst, straight), evaluate(inst, p.plan(a, a))
        assert e1.objective == e2.objective and e1.memory == e2.memory and e1.comm_bytes == e2.comm_bytes


# ---- exact = brute force -----------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_milp_equals_brute_force(case):
    case = dict(case)
    shift = case.pop("max_shift", None)
    p = BipartitionProblem(chain_instance(**TINY, **case), case["stages"], max_shift=shift)
    best = brute_force(p)
    if not math.isfinite(best):
        for solver in ("cbc", "highs"):
            with pytest.raises(InfeasibleError, match="fits"):
                solve_milp(p, time_limit=20, solver=solver)
        with pytest.raises(InfeasibleError, match="fits"):
            solve_bisection(p)
        assert same_cut(p).status == Status.INFEASIBLE
        assert greedy(p).status == Status.INFEASIBLE
        return
    plain = [solve_milp(p, time_limit=20, solver=s, dp_bound=False) for s in ("cbc", "highs")]
    for r in [*plain, solve_milp(p, time_limit=20, solver="highs")]:
        assert r.status == Status.OPTIMAL
        assert r.objective == pytest.approx(best, rel=1e-7)
        assert r.lower_bound <= r.objective * (1 + 1e-12)
        assert r.lower_bound == pytest.approx(best, rel=1e-6)
        assert r.evaluation.feasible and r.space == "bipartition"
    for r in plain:  # the solver's own claim = evaluate (same-cut plan on a tie: same value)
        assert r.info["milp_objective"] == pytest.approx(r.objective, rel=1e-6)
    d = solve_bisection(p)
    assert d.lower_bound <= best * (1 + 1e-9) and d.objective >= best * (1 - 1e-12)
    if d.info["relaxed_plan_fits"]:
        assert d.status == Status.OPTIMAL and d.objective == pytest.approx(best, rel=1e-9)
    g, g2, s = greedy(p), greedy(p, move="both"), same_cut(p)
    for h in (g, g2):
        assert best <= h.objective * (1 + 1e-12) and h.objective <= s.objective * (1 + 1e-12)
        assert h.status == Status.FEASIBLE and h.lower_bound is None
    assert s.status == Status.FEASIBLE and s.info["same_cut_optimal"]


def test_separate_cuts_beat_same_cut_when_transfers_are_cheap():
    """The point of Bi-Partition: with cheap transfers the exact optimum beats every same-cut plan."""
    p = BipartitionProblem(chain_instance(**TINY, stages=3), 3)
    r, s = solve_milp(p, time_limit=20, solver="highs"), same_cut(p)
    assert r.objective < s.objective * (1 - 0.1)  # 14.5 ms against 17 ms
    a, b = r.info["fwd_cuts"], r.info["bwd_cuts"]
    assert a != b


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_relaxation_equals_brute_force_without_memory(case):
    case = dict(case)
    shift = case.pop("max_shift", None)
    case.pop("memory", None)
    p = BipartitionProblem(chain_instance(**TINY, **case), case["stages"], max_shift=shift)
    best = brute_force(p)
    rel = relaxation_optimum(p)
    assert rel.closed and rel.lower <= best and rel.lower == pytest.approx(best, rel=1e-9)
    assert evaluate(p.instance, p.plan(rel.fwd_cuts, rel.bwd_cuts)).objective == pytest.approx(best, rel=1e-9)


def test_max_shift_zero_is_the_partition_problem():
    p = BipartitionProblem(chain_instance(**TINY, stages=3, bandwidth=2e11), 3, max_shift=0)
    r = solve_milp(p, time_limit=20, solver="cbc")
    assert r.status == Status.OPTIMAL
    assert r.objective == pytest.approx(same_cut(p).objective, rel=1e-9)
    assert r.info["fwd_cuts"] == r.info["bwd_cuts"]


@st.composite
def random_chain(draw):
    n = draw(st.integers(3, 6))
    S = draw(st.integers(2, min(3, n)))
    pos = st.floats(0.1, 10.0)
    fwd = draw(st.lists(pos, min_size=n, max_size=n))
    ratio = draw(st.lists(st.floats(0.5, 4.0), min_size=n, max_size=n))
    sizes = st.lists(st.floats(0.0, 50.0), min_size=n, max_size=n)
    act, param, out = draw(sizes), draw(sizes), draw(sizes)
    edge = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.floats(0, 20))
    skips = draw(st.lists(edge, max_size=2))
    skips = [(u, v, w) for u, v, w in skips if v > u + 1]
    bw = draw(st.sampled_from([5e8, 1e10, 1e12]))
    memory = draw(st.sampled_from([math.inf, 200 * MB, 400 * MB]))
    overlap = draw(st.booleans())
    inst = chain_instance(fwd, [f * r for f, r in zip(fwd, ratio)], act, param, out, skips=skips, stages=S,
                          memory=memory, bandwidth=bw, overlap=overlap, stashing=draw(st.booleans()))
    return BipartitionProblem(inst, S)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_chain())
def test_random_chains_milp_equals_brute_force(p):
    best = brute_force(p)
    if not math.isfinite(best):
        with pytest.raises(InfeasibleError):
            solve_milp(p, time_limit=20, solver="highs")
        return
    r = solve_milp(p, time_limit=20, solver="highs", dp_bound=False)
    assert r.status == Status.OPTIMAL
    assert r.objective == pytest.approx(best, rel=1e-6)
    if "milp_objective" in r.info:  # the MILP ran (not for S = 1 or n, nor when a bound meets the start)
        assert r.info["milp_objective"] == pytest.approx(r.objective, rel=1e-6)
    d = solve_bisection(p)
    assert d.lower_bound <= best * (1 + 1e-9)
    if d.status == Status.OPTIMAL:
        assert d.objective == pytest.approx(best, rel=1e-9)
    g, s = greedy(p), same_cut(p)
    assert r.objective <= g.objective * (1 + 1e-9) and g.objective <= s.objective * (1 + 1e-12)


# ---- real PipeDream profiles -------------------------------------------------------------------

REAL = ["alexnet", "vgg16", "resnet18", "squeezenet1_0", "gnmt"]


@pytest.fixture(scope="module")
def profiles():
    from pipeopt.io.pipedream import read_pipedream

    if not PROFILES.exists():
        pytest.skip("PipeDream profiles not found")
    return {m: read_pipedream(PROFILES / f"{m}.txt") for m in REAL}


@pytest.mark.parametrize("S", [2, 4])
@pytest.mark.parametrize("model", REAL)
def test_real_profiles_milp_beats_same_cut(profiles, model, S):
    p = BipartitionProblem(profiles[model], S)
    r = solve_milp(p, time_limit=20, solver="highs", dp_bound=False)
    d = solve_bisection(p)  # no memory limit here: exact
    g, s = greedy(p), same_cut(p)
    assert d.status == Status.OPTIMAL
    assert r.status in (Status.OPTIMAL, Status.TIME_LIMIT)
    assert r.lower_bound <= d.objective * (1 + 1e-9) and d.lower_bound <= r.objective * (1 + 1e-9)
    assert r.lower_bound >= p.simple_lower_bound() * (1 - 1e-12)
    assert d.objective <= g.objective * (1 + 1e-12) and g.objective <= s.objective * (1 + 1e-12)
    assert r.objective <= s.objective * (1 + 1e-12)  # the same-cut plan is in the space
    if r.status == Status.OPTIMAL:
        assert r.objective == pytest.approx(d.objective, rel=1e-7)  # MILP = bisection
        assert r.gap == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("model,S", [("alexnet", 4), ("gnmt", 2)])
def test_real_profiles_cbc_equals_highs(profiles, model, S):
    p = BipartitionProblem(profiles[model], S)
    rc, rh = solve_milp(p, time_limit=30, solver="cbc"), solve_milp(p, time_limit=30, solver="highs")
    if rc.status == rh.status == Status.OPTIMAL:
        assert rc.objective == pytest.approx(rh.objective, rel=1e-6)
    assert max(rc.lower_bound, rh.lower_bound) <= min(rc.objective, rh.objective) * (1 + 1e-6)


# ---- bad input ---------------------------------------------------------------------------------


def test_invalid_plans_raise():
    inst = chain_instance(**TINY, stages=3)
    names = [f"l{i}" for i in range(7)]
    devs = ("gpu0", "gpu1")
    # a layer's forward missing
    with pytest.raises(InvalidPlanError, match="dropped from the forward pass"):
        evaluate(inst, Plan((Stage(names[:3], devs[:1], bwd_layers=names[:3]),
                             Stage(names[4:], devs[1:], bwd_layers=names[3:]))))
    # backward edge l2 -> l3 going from stage 1 back to stage 0 in the backward pass
    with pytest.raises(InvalidPlanError, match="backward pass"):
        evaluate(inst, Plan((Stage(names[:3], devs[:1], bwd_layers=names[:2] + names[3:]),
                             Stage(names[3:], devs[1:], bwd_layers=[names[2]]))))
    # a layer in two stages' backward sets
    with pytest.raises(InvalidPlanError, match="backward pass"):
        evaluate(inst, Plan((Stage(names[:3], devs[:1], bwd_layers=names[:4]),
                             Stage(names[3:], devs[1:], bwd_layers=names[3:]))))
    p = BipartitionProblem(inst, 3)
    with pytest.raises(InvalidPlanError, match="empty"):
        p.plan([2, 4], [3, 3])
    with pytest.raises(InvalidPlanError, match="2 backward cuts"):
        p.plan([2, 4], [3])
    with pytest.raises(InvalidPlanError, match="contiguous"):
        p.cuts_of(Plan((Stage(["l0", "l2"], ("gpu0",)), Stage(["l1"], ("gpu1",)),
                        Stage(names[3:], ("gpu2",)))))


def test_bad_problem_raises():
    inst = chain_instance(**TINY, stages=3)
    with pytest.raises(InvalidProblemError, match="max_shift"):
        BipartitionProblem(inst, 3, max_shift=-1)
    with pytest.raises(InvalidProblemError, match="more stages"):
        BipartitionProblem(chain_instance(**TINY, stages=8), 8)
    with pytest.raises(InvalidProblemError, match="objective"):
        BipartitionProblem(inst.with_settings(objective="gpipe"), 3)
    with pytest.raises(InvalidProblemError, match="solver"):
        solve_milp(BipartitionProblem(inst, 3), solver="gurobi")
    with pytest.raises(InvalidProblemError, match="move"):
        greedy(BipartitionProblem(inst, 3), move="forward")


def test_registry_and_solve():
    from pipeopt.solve import solve

    assert {m.name for m in methods("bipartition")} == {"milp", "bisection", "greedy", "same_cut"}
    assert method("bipartition", "bisection").exact
    assert method("bipartition", "milp").exact and not method("bipartition", "greedy").exact
    inst = chain_instance(**TINY, stages=3, bandwidth=2e11)
    res = {m: solve(inst, problem="bipartition", method=m, stages=3, time_limit=20)
           for m in ("milp", "greedy", "same_cut")}
    assert res["milp"].status == Status.OPTIMAL
    assert res["milp"].objective <= res["greedy"].objective <= res["same_cut"].objective
    d = res["milp"].to_dict()
    assert all("bwd_layers" in s for s in d["plan"]["stages"])


def test_time_limit_is_honest(profiles):
    """Inception-v3 (325 units) in 8 stages: the plain MILP cannot finish in 1 s and says so;
    with the bisection bound the same call proves the optimum."""
    from pipeopt.io.pipedream import read_pipedream

    p = BipartitionProblem(read_pipedream(PROFILES / "inception_v3.txt"), 8)
    plain = solve_milp(p, time_limit=1, solver="highs", dp_bound=False)
    aided = solve_milp(p, time_limit=1, solver="highs")
    exact = solve_bisection(p)
    assert plain.plan is not None
    assert plain.lower_bound <= exact.objective * (1 + 1e-9) <= plain.objective * (1 + 1e-9)
    if plain.status != Status.OPTIMAL:  # (a much faster machine might finish in 1 s)
        assert plain.status == Status.TIME_LIMIT and plain.gap > 0
    assert exact.status == aided.status == Status.OPTIMAL
    assert aided.objective == pytest.approx(exact.objective, rel=1e-9)
    assert exact.objective < same_cut(p).objective  # 91.76 ms against 94.40 ms
