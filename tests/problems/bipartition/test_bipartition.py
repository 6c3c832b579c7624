"""Bi-Partition (separate forward and backward cuts): model, exact MILP, baselines."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import strategies
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
    return strategies.chain_instance(
        [f * MS for f in fwd], [b * MS for b in bwd], [o * MB for o in out], [a * MB for a in act],
        [p * MB for p in param], devices=stages, memory=memory, bandwidth=bandwidth,
        skips=[(u, v, w * MB) for u, v, w in skips], overlap=overlap, weight_stashing=stashing,
        microbatches=microbatches, name=name)


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
    # backward: l1's output gradient (5) + l1's input, l0's output (4), moving back to where
    # l1's backward runs (what that backward needs; not l1's own act_bytes, 20)
    assert ev.comm_bytes_forward[0] == pytest.approx((4 + 8 / 4) * MB)
    assert ev.comm_bytes_backward[0] == pytest.approx((5 + 4) * MB)
    assert ev.stage_time[0] == pytest.approx((1 + 2 + 2) * MS + (4 + 2) * MB / 1e9)
    assert ev.stage_time[1] == pytest.approx((1 + 1 + 2) * MS + (5 + 4) * MB / 1e9)
    # memory: stage 0 keeps 2 microbatches of l0, l1 activations, weights of l0, l1;
    # stage 1 one microbatch of l2, weights of l1 (its forward) and l2
    assert ev.memory == pytest.approx([2 * 30 * MB + 9 * MB, 30 * MB + 11 * MB])


def test_migrated_activation_is_the_layers_input():
    """A layer whose forward and backward run on different stages ships its input (the bytes on
    its in-edges), not its own act_bytes; a layer without predecessor ships its act_bytes.
    pipeopt's reading of the Bi-Partition abstract."""
    g = nx.DiGraph()
    spec = {"input": (7, 6, 0), "l0": (10, 4, 1), "l1": (20, 5, 2), "l2": (30, 6, 4), "l3": (40, 1, 8)}
    for name, (act, out, par) in spec.items():
        g.add_node(name, fwd={"gpu": 1 * MS}, bwd={"gpu": 2 * MS}, act_bytes=act * MB, out_bytes=out * MB,
                   param_bytes=par * MB, pin_first=name == "input")
    for u, v in [("input", "l0"), ("l0", "l1"), ("l1", "l2"), ("l2", "l3")]:
        g.add_edge(u, v)
    g.add_edge("l0", "l2", bytes=3 * MB)  # a skip: l2 reads l1's tensor (5) and l0's (3)
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9), Settings(microbatches=4), name="skip")
    p = BipartitionProblem(inst, 2)
    # units: (input, l0), l1, l2, l3; input has no predecessor (its act_bytes, 7), l0 reads input (6)
    np.testing.assert_allclose(p.migrated, np.array([7 + 6, 4, 5 + 3, 6]) * MB)
    # l2: forward on stage 0, backward on stage 1 -> its input, 8 MB, travels forward with l2's
    # output (6); its weights (4 MB / 4 microbatches) travel back beside the gradients of
    # l1's and l0's tensors (5 + 3)
    ev = evaluate(inst, p.plan([3], [2]))
    assert ev.comm_bytes_forward[0] == pytest.approx((6 + 8) * MB)
    assert ev.comm_bytes_backward[0] == pytest.approx((5 + 3 + 4 / 4) * MB)
    fwd_b, bwd_b = p.cut_bytes(3, 2)
    assert (fwd_b, bwd_b) == (pytest.approx((6 + 8) * MB), pytest.approx((5 + 3 + 1) * MB))
    # l1 forward on stage 1, backward on stage 0: its input, l0's tensor (4), goes back beside the
    # gradients crossing the backward split (5 + 3); forward: l0's tensor once (4) + l1's weights
    ev = evaluate(inst, p.plan([1], [2]))
    assert ev.comm_bytes_backward[0] == pytest.approx((5 + 3 + 4) * MB)
    assert ev.comm_bytes_forward[0] == pytest.approx((4 + 2 / 4) * MB)
    for a, b in [([3], [2]), ([1], [2]), ([2], [1]), ([1], [3])]:
        assert p.score(a, b).bottleneck == pytest.approx(evaluate(inst, p.plan(a, b)).bottleneck, rel=1e-12)


def test_migrated_layer_without_predecessor_ships_its_act_bytes():
    """A source layer (no in-edge) moved between stages ships its own act_bytes."""
    g = nx.DiGraph()
    for name, act in [("l0", 10), ("src", 9), ("l1", 20)]:
        g.add_node(name, fwd={"gpu": 1 * MS}, bwd={"gpu": 2 * MS}, act_bytes=act * MB, out_bytes=2 * MB,
                   param_bytes=0.0)
    g.add_edge("l0", "l1")
    g.add_edge("src", "l1")
    inst = Instance(g, Cluster.homogeneous(2, bandwidth=1e9), Settings(microbatches=4), name="sources")
    plan = Plan((Stage(("l0", "src"), ("gpu0",), bwd_layers=("l0",)),
                 Stage(("l1",), ("gpu1",), bwd_layers=("src", "l1"))))
    ev = evaluate(inst, plan)
    # forward: the tensors of l0 and src (2 + 2) and src's migrated act_bytes (9); backward: l0's gradient
    assert ev.comm_bytes_forward[0] == pytest.approx((2 + 2 + 9) * MB)
    assert ev.comm_bytes_backward[0] == pytest.approx(2 * MB)
    p = BipartitionProblem(inst, 2)
    a, b = p.cuts_of(plan)
    assert p.score(a, b).bottleneck == pytest.approx(ev.bottleneck, rel=1e-12)


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
                solve_milp(p, time_limit=None, solver=solver)
        with pytest.raises(InfeasibleError, match="fits"):
            solve_bisection(p)
        assert same_cut(p).status == Status.INFEASIBLE
        assert greedy(p).status == Status.INFEASIBLE
        return
    plain = [solve_milp(p, time_limit=None, solver=s, dp_bound=False) for s in ("cbc", "highs")]
    for r in [*plain, solve_milp(p, time_limit=None, solver="highs")]:
        assert r.status == Status.OPTIMAL
        assert r.objective == pytest.approx(best, rel=1e-7)
        assert r.lower_bound <= r.objective * (1 + 1e-12)
        assert r.lower_bound == pytest.approx(best, rel=1e-6)
        assert r.evaluation.feasible and r.space == "bipartition"
    for r in plain:  # the solver's own claim = evaluate (same-cut plan on a tie: same value)
        assert r.info["milp_objective"] == pytest.approx(r.objective, rel=1e-6)
    d = solve_bisection(p, time_limit=None)
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
    r, s = solve_milp(p, time_limit=None, solver="highs"), same_cut(p)
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
    r = solve_milp(p, time_limit=None, solver="cbc")
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
            solve_milp(p, time_limit=None, solver="highs")
        return
    r = solve_milp(p, time_limit=None, solver="highs", dp_bound=False)
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


def tight_chain(seed: int, memory: float = math.inf) -> BipartitionProblem:
    """A random chain (n <= 6, S <= 3) on a network slow enough that transfers rival compute:
    the 1F1B window rows (a microbatch's round trip through stages i..l) often set the period."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    S = int(rng.integers(2, min(3, n) + 1))
    fwd = rng.uniform(0.5, 5.0, n)
    bwd = fwd * rng.uniform(0.5, 3.0, n)
    act, param, out = rng.uniform(0, 40, n), rng.uniform(0, 40, n), rng.uniform(1, 30, n)
    skips = [(0, n - 1, float(rng.uniform(0, 10)))] if rng.random() < 0.5 else []
    inst = chain_instance(list(fwd), list(bwd), list(act), list(param), list(out), skips=skips, stages=S,
                          bandwidth=float(rng.choice([5e9, 1e10, 2e10])), memory=memory,
                          stashing=bool(rng.random() < 0.5), microbatches=int(rng.integers(1, 9)))
    return BipartitionProblem(inst, S)


def windows_bind(p: BipartitionProblem, a, b) -> bool:
    """The plan's period is set by a window row: above every stage's own time and every cut direction."""
    ev = evaluate(p.instance, p.plan(a, b))
    own = max([*ev.stage_time, *ev.comm_time])
    return ev.bottleneck > own * (1 + 1e-9)


def brute_force_plan(p: BipartitionProblem):
    """(best objective, its cuts) over every (forward, backward) cut pair, scored by evaluate."""
    best, arg = math.inf, None
    for a in all_cuts(p.n, p.stages):
        for b in all_cuts(p.n, p.stages):
            ev = evaluate(p.instance, p.plan(a, b))
            if ev.feasible and ev.objective < best:
                best, arg = ev.objective, (a, b)
    return best, arg


def test_tight_chains_windows_bind():
    """The cross-check below is a test of the window rows: on most of its instances the optimum's
    period is a window row (a model without them would claim a lower value)."""
    bound = [windows_bind(tight_chain(seed), *brute_force_plan(tight_chain(seed))[1]) for seed in range(16)]
    assert sum(bound) >= 8


@pytest.mark.parametrize("seed", range(16))
def test_tight_chains_exact_methods_equal_brute_force(seed):
    """MILP (CBC / HiGHS, plain and with the relaxation) and bisection = brute force by evaluate on
    tiny chains where the 1F1B window rows bind; the greedy is never below the optimum."""
    p = tight_chain(seed)
    best, _ = brute_force_plan(p)
    solver = SOLVER_CYCLE[seed % 2]
    runs = [solve_milp(p, time_limit=None, solver=solver, dp_bound=False),
            solve_milp(p, time_limit=None, solver=solver),
            solve_bisection(p, time_limit=None)]
    for r in runs:
        assert r.status == Status.OPTIMAL
        assert r.objective == pytest.approx(best, rel=1e-7)
        assert r.objective == pytest.approx(evaluate(p.instance, r.plan).objective, rel=1e-12)
        assert r.lower_bound <= best * (1 + 1e-9)
        if "milp_objective" in r.info:  # the solver's own value of its plan = evaluate
            assert r.info["milp_objective"] >= best * (1 - 1e-6)
    for g in (greedy(p), greedy(p, move="backward")):
        assert g.objective >= best * (1 - 1e-12)
        assert g.objective <= same_cut(p).objective * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_tight_chains_with_memory_milp_equals_brute_force(seed):
    """Windows and memory bind together: the relaxation cannot prove it, the MILP must."""
    free = tight_chain(seed)
    peaks = sorted(max(free.score(a, b).memory) for a in all_cuts(free.n, free.stages)
                   for b in all_cuts(free.n, free.stages))
    p = tight_chain(seed, memory=peaks[len(peaks) // 3])
    best, _ = brute_force_plan(p)
    for solver in ("cbc", "highs"):
        r = solve_milp(p, time_limit=None, solver=solver)
        assert r.status == Status.OPTIMAL and r.objective == pytest.approx(best, rel=1e-7)
        assert r.lower_bound <= best * (1 + 1e-9)
    d = solve_bisection(p)
    assert d.lower_bound <= best * (1 + 1e-9) and d.objective >= best * (1 - 1e-12)
    assert greedy(p).objective >= best * (1 - 1e-12)


SOLVER_CYCLE = ("highs", "cbc")


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
    d = solve_bisection(p, time_limit=None)  # no memory limit here: exact
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
    res = {m: solve(inst, problem="bipartition", method=m, stages=3, time_limit=None)
           for m in ("milp", "greedy", "same_cut")}
    assert res["milp"].status == Status.OPTIMAL
    assert res["milp"].objective <= res["greedy"].objective <= res["same_cut"].objective
    d = res["milp"].to_dict()
    assert all("bwd_layers" in s for s in d["plan"]["stages"])


def test_time_limit_is_honest(profiles):
    """Inception-v3 (325 units) in 8 stages: the plain MILP stopped after 1 s says what it has
    (a plan, a bound below the optimum, status time_limit or a real proof); with the bisection
    bound the same call, without a wall-clock limit, proves the optimum (no proof is asserted
    under a wall-clock limit: that fails on a loaded machine)."""
    from pipeopt.io.pipedream import read_pipedream

    p = BipartitionProblem(read_pipedream(PROFILES / "inception_v3.txt"), 8)
    plain = solve_milp(p, time_limit=1, solver="highs", dp_bound=False)
    aided = solve_milp(p, time_limit=None, solver="highs")
    exact = solve_bisection(p, time_limit=None)
    assert plain.plan is not None
    assert plain.lower_bound <= exact.objective * (1 + 1e-9) <= plain.objective * (1 + 1e-9)
    if plain.status != Status.OPTIMAL:  # (a much faster machine might finish in 1 s)
        assert plain.status == Status.TIME_LIMIT and plain.gap > 0
    assert exact.status == aided.status == Status.OPTIMAL
    assert aided.objective == pytest.approx(exact.objective, rel=1e-9)
    # (with the window rows and per-tensor transfers the same-cut plan is optimal here: 111.72 ms)
    assert exact.objective <= same_cut(p).objective * (1 + 1e-12)
