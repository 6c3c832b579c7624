"""The resource problems optimise evaluate's bottleneck exactly: the 1F1B steady period with its
window rows, split execution with 2k microbatches in flight.

* the split of one worker at a trial period T (least f + b with both passes within T) against
  fine grids, and its supporting planes (valid for every worker, tight at the one given);
* the period of a plan (:meth:`ResourceProblem.period`) = evaluate's bottleneck of its plan,
  and no share found by a search scored by evaluate beats its shares (the allocate optimum);
* every exact method (allocate lp; joint dp, milp, cp-sat; group milp, cp-sat) against brute
  force over every plan scored by :func:`pipeopt.evaluate`, on instances where the window rows
  bind (a cut takes 0.2 to 1 stage time), where memory binds (under split execution's 2k
  microbatches), with S = 1, and fast links.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from strategies import resource_splits

import pipeopt
from pipeopt.cost import stage_compute
from pipeopt.problems.resource import AllocateProblem, GroupProblem, JointProblem, allocate, group, joint
from pipeopt.problems.resource.examples import random_chain
from pipeopt.problems.resource.problem import ChainProbe, chain_optimum, minmax_chain_dp
from pipeopt.problems.resource.split import best_split, busy_cut, least_busy, least_busy_many

KINDS = ("cpu", "gpu", "npu")
PROFILES = ({"cpu": 2.0, "gpu": 1.0, "npu": 1.0}, {"cpu": 4.0, "gpu": 2.0}, {"cpu": 1.0, "gpu": 4.0, "npu": 2.0},
            {"gpu": 3.0, "npu": 3.0}, {"cpu": 3.0, "gpu": 0.5})


# ---- one worker ---------------------------------------------------------------------------------

def _worker(rng: random.Random, K: int, one_sided: bool = True):
    kinds = [f"k{i}" for i in range(K)]
    res = {k: rng.choice([0.5, 1, 2, 3]) for k in kinds}
    F = {k: rng.uniform(0.1, 3) for k in kinds}
    B = {k: F[k] * rng.uniform(0.3, 4) for k in kinds}
    if one_sided and K > 1 and rng.random() < 0.4:  # a kind that runs one pass only
        k = rng.choice(kinds)
        (F if rng.random() < 0.5 else B)[k] = math.inf
    return kinds, res, F, B


def _grid_times(kinds, res, F, B, n):
    g = np.linspace(0, 1, n)
    grids = np.meshgrid(*([g] * len(kinds)), indexing="ij")
    with np.errstate(divide="ignore", invalid="ignore"):
        fr = sum(np.where(np.isfinite(F[k]), grids[i] * res[k] / F[k], 0.0) for i, k in enumerate(kinds))
        br = sum(np.where(np.isfinite(B[k]), (1 - grids[i]) * res[k] / B[k], 0.0) for i, k in enumerate(kinds))
        return 1 / fr, 1 / br


@pytest.mark.parametrize("K", [1, 2, 3])
def test_least_busy_against_a_fine_grid(K):
    """Least f + b with f, b <= T: no grid point does better, and the grid gets close; infeasible
    exactly below the least stage time; the least stage time agrees with the grid too."""
    rng = random.Random(K)
    n = {1: 20001, 2: 401, 3: 61}[K]
    for _ in range(40):
        kinds, res, F, B = _worker(rng, K)
        _, tau = best_split(res, F, B)
        ff, bb = _grid_times(kinds, res, F, B, n)
        assert np.maximum(ff, bb).min() >= tau * (1 - 1e-12)
        if not math.isfinite(tau):
            continue
        assert least_busy(res, F, B, tau * (1 - 1e-6))[0] is None
        for T in (tau * (1 + 1e-7), tau * 1.05, tau * 1.5, math.inf):
            beta, f, b = least_busy(res, F, B, T)
            assert beta is not None and all(0.0 <= v <= 1.0 for v in beta.values())
            assert (f, b, max(f, b)) == pytest.approx(stage_compute(res, F, B, beta), rel=1e-12)
            assert f <= T * (1 + 1e-9) and b <= T * (1 + 1e-9)
            ok = (ff <= T) & (bb <= T)
            if ok.any():
                grid = float((ff + bb)[ok].min())
                assert grid >= (f + b) * (1 - 1e-12)
                assert grid <= (f + b) * (1 + 0.05)


def test_least_busy_closed_form_with_one_kind():
    """One kind: beta = sqrt F / (sqrt F + sqrt B), f + b = (sqrt F + sqrt B)^2 / R, clipped by the caps."""
    R, F, B = 2.0, 1.0, 4.0
    beta, f, b = least_busy({"gpu": R}, {"gpu": F}, {"gpu": B})
    assert beta["gpu"] == pytest.approx(1 / 3, rel=1e-12)
    assert f + b == pytest.approx((1 + 2) ** 2 / R, rel=1e-12)
    tau = best_split({"gpu": R}, {"gpu": F}, {"gpu": B})[1]  # both passes equal: (F + B) / R
    assert tau == pytest.approx((F + B) / R)
    T = 2.8  # the unclipped optimum has b = 4 / (2 * 2/3) = 3 > T: clipped to b = T
    beta, f, b = least_busy({"gpu": R}, {"gpu": F}, {"gpu": B}, T)
    assert b == pytest.approx(T, rel=1e-12) and beta["gpu"] == pytest.approx(1 - B / (R * T), rel=1e-12)
    assert least_busy({"gpu": R}, {"gpu": F}, {"gpu": B}, tau)[2] == pytest.approx(tau, rel=1e-9)


def test_least_busy_many_equals_one_by_one():
    rng = random.Random(4)
    kinds = list(KINDS)
    res = {"cpu": 2.0, "gpu": 1.0, "npu": 1.5}
    P = 60
    F = {k: np.array([rng.uniform(0.1, 3) for _ in range(P)]) for k in kinds}
    B = {k: F[k] * np.array([rng.uniform(0.3, 4) for _ in range(P)]) for k in kinds}
    F["npu"][::7] = np.inf
    B["gpu"][::5] = np.inf
    F["cpu"][3] = 0.0  # a free pass: left to least_busy (nan)
    for k in kinds:  # no kind runs both passes: nan
        B[k][11] = np.inf
    for T in (0.0, 0.4, 1.0, math.inf):
        busy, _, _ = least_busy_many(res, F, B, T)
        assert np.isnan(busy[[3, 11]]).all() and np.isfinite(busy).any() == (T > 0)
        for q in range(P):
            _, f, b = least_busy(res, {k: float(F[k][q]) for k in kinds}, {k: float(B[k][q]) for k in kinds}, T)
            if np.isnan(busy[q]):
                continue
            assert busy[q] == pytest.approx(f + b, rel=1e-12) if math.isfinite(f + b) else math.isinf(busy[q])


def test_degenerate_loads():
    res = {"cpu": 1.0, "gpu": 2.0}
    # forward free on cpu: a tiny share there, everything else to backward
    beta, f, b = least_busy(res, {"cpu": 0.0, "gpu": 1.0}, {"cpu": 1.0, "gpu": 2.0}, 10.0)
    assert f == 0.0 and b == pytest.approx(1 / (1 / 1.0 + 2 / 2.0), rel=1e-6)
    # a kind that runs the forward pass only serves it whole
    beta, f, b = least_busy(res, {"cpu": 1.0, "gpu": 1.0}, {"cpu": math.inf, "gpu": 2.0}, math.inf)
    assert beta["cpu"] == 1.0
    assert best_split(res, {"cpu": 1.0, "gpu": 1.0}, {"cpu": math.inf, "gpu": 2.0})[0]["cpu"] == 1.0
    assert least_busy(res, {"npu": 1.0}, {"npu": 1.0})[0] is None  # no kind runs it
    assert least_busy({"cpu": 0.0}, {"cpu": 1.0}, {"cpu": 1.0})[0] is None


def test_busy_cut_is_a_supporting_plane():
    """busy_cut: const - sum_k R_k coef_k <= least f + b for every worker R (valid), = at the
    worker it was taken at (tight) - also for kinds that worker does not have."""
    rng = random.Random(5)
    for _ in range(1500):
        K = rng.choice([1, 2, 3])
        kinds, res, F, B = _worker(rng, K)
        res = {k: v for k, v in res.items() if rng.random() < 0.7} or res
        _, tau = best_split(res, F, B)
        if not math.isfinite(tau):
            continue
        T = tau * rng.choice([1 + 1e-7, 1.01, 1.1, 1.5, 3, 1e6])
        coef, const = busy_cut(res, F, B, T)
        _, f, b = least_busy(res, F, B, T)
        assert const - sum(res[k] * coef[k] for k in res) == pytest.approx(f + b, rel=1e-7)
        for _ in range(10):
            R = {k: rng.choice([0, 0.5, 1, 2, 3, 5]) for k in kinds}
            beta, f2, b2 = least_busy(R, F, B, T)
            if beta is not None:
                assert const - sum(R[k] * coef[k] for k in kinds if R[k] > 0) <= (f2 + b2) * (1 + 1e-9)


# ---- instances ----------------------------------------------------------------------------------

def _instance(graph, resources, memory, bandwidth, name):
    devs = tuple(pipeopt.Device(f"d{i}", r, m) for i, (r, m) in enumerate(zip(resources, memory)))
    return pipeopt.Instance(graph, pipeopt.Cluster(devs, bandwidth), name=name)


def reference(problem):
    """Brute force scored by evaluate: every plan with its period's shares; the best that fits.
    Returns (value, plan) - ``(inf, None)`` if no plan fits."""
    best = (math.inf, None)
    for starts, groups in resource_splits(problem):
        plan = problem.plan(starts, groups)
        ev = pipeopt.evaluate(problem.instance, plan)
        if ev.feasible and ev.bottleneck < best[0]:
            best = (ev.bottleneck, plan)
    return best


def window_case(kind: str, seed: int, n: int, S: int, devices: int, bandwidth: str, memory: str):
    """A small joint or group problem. ``bandwidth``: ``"tight"`` - a cut takes 0.2 .. 1 of the
    optimum's stage time with fast links (the window rows bind), or ``"fast"``. ``memory``:
    ``"inf"``; ``"bind"`` - the optimum's stages (split execution, 2k in flight) fit exactly
    (joint: every device gets the largest stage's memory; group: each of its workers gets
    exactly its stage's memory); ``"none"`` - just below what the leanest plan needs."""
    rng = random.Random(f"{kind}-{seed}")
    graph = random_chain(n, KINDS, seed=seed, act_bytes=rng.uniform(1e5, 1e7) + 0.37,
                         param_bytes=rng.uniform(1e5, 1e7))
    count = S if kind == "joint" else devices
    res = [dict(PROFILES[0])] * count if kind == "joint" else [dict(rng.choice(PROFILES)) for _ in range(count)]
    make = (lambda inst: JointProblem(inst, S)) if kind == "joint" else (lambda inst: GroupProblem(inst, S))
    free = make(_instance(graph, res, [math.inf] * count, 1e13, f"{kind}-{seed}"))
    bw = 1e13
    if bandwidth == "tight":
        acts = sum(graph.nodes[v]["out_bytes"] for v in graph.nodes) / n
        bw = acts / (rng.uniform(0.2, 1.0) * reference(free)[0])
    free = make(_instance(graph, res, [math.inf] * count, bw, f"{kind}-{seed}"))
    mem = [math.inf] * count
    if memory != "inf":
        value, plan = reference(free)
        ev = pipeopt.evaluate(free.instance, plan)
        if memory == "bind" and kind == "joint":  # identical devices: the optimum's largest stage fits exactly
            mem = [max(ev.memory)] * count
        elif memory == "bind":
            for st, need in zip(plan.stages, ev.memory):
                for d in st.devices:
                    mem[int(d[1:])] = need / len(st.devices)
        else:
            least = min(max(pipeopt.evaluate(free.instance, free.plan(c, g)).memory) for c, g in resource_splits(free))
            mem = [least * (1 - 1e-6) / (1 if kind == "joint" else count)] * count
    return make(_instance(graph, res, mem, bw, f"{kind}-{seed}"))


def window_active(ev) -> bool:
    """Some window row is active at the plan's period (within 1e-9)."""
    S = len(ev.forward_op)
    return any((sum(ev.forward_op[i:]) + sum(ev.backward_op[i:]) + sum(ev.round_trip[i:])) / (2 * (S - i))
               >= ev.bottleneck * (1 - 1e-9) for i in range(S - 1))


# ---- a plan's period ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind,seed", [("joint", 2), ("joint", 10), ("group", 5), ("group", 27)])
def test_period_is_evaluate_and_no_share_beats_it(kind, seed):
    """The period of every plan is evaluate's bottleneck of its plan, its bound is below it, and
    a search over the shares scored by evaluate (random restarts, coordinate moves) never
    beats it; the sequential and theorem values are evaluate's too."""
    rng = random.Random(seed)
    p = window_case(kind, seed, 5, 3 if kind == "group" else 2, 4, "tight", "inf")
    plans = list(resource_splits(p))
    for starts, groups in rng.sample(plans, min(6, len(plans))):
        value, shares, lower = p.period(starts, groups)
        plan = p.plan(starts, groups)
        assert pipeopt.evaluate(p.instance, plan).bottleneck == pytest.approx(value, rel=1e-12)
        assert lower <= value <= lower * (1 + 1e-12)
        stages = list(plan.stages)
        for _ in range(150):
            i = rng.randrange(len(stages))
            st = stages[i]
            beta = ({k: rng.random() for k in st.beta} if rng.random() < 0.2 else
                    {k: min(1.0, max(0.0, b + rng.gauss(0, 0.05))) for k, b in st.beta.items()})
            trial = stages[:i] + [pipeopt.Stage(st.layers, st.devices, beta=beta)] + stages[i + 1:]
            assert pipeopt.evaluate(p.instance, pipeopt.Plan(tuple(trial))).bottleneck >= value * (1 - 1e-12)
        for mode in ("sequential", "theorem"):
            v = p.plan_value(starts, groups, mode)
            assert pipeopt.evaluate(p.instance, p.plan(starts, groups, mode)).bottleneck == pytest.approx(v, rel=1e-12)


def test_window_rows_change_the_best_shares():
    """Where a window row binds, each stage's least-time share (the old allocation LP) is worse
    than the shares of least period."""
    found = 0
    for seed, n, S in ((2, 5, 3), (3, 4, 3), (4, 5, 2), (7, 4, 2), (12, 4, 3)):
        p = window_case("joint", seed, n, S, S, "tight", "inf")
        value, plan = reference(p)
        ev = pipeopt.evaluate(p.instance, plan)
        if not window_active(ev):
            continue
        least_time = pipeopt.Plan(tuple(
            pipeopt.Stage(st.layers, st.devices, beta=best_split(p.pooled(st.devices), *p.load(a, b))[0])
            for st, a, b in zip(plan.stages, [0, *p.starts_of(plan)], [*p.starts_of(plan), p.n])))
        assert pipeopt.evaluate(p.instance, least_time).bottleneck > value * (1 + 1e-6)
        found += 1
    assert found == 5


def test_split_memory_counts_2k_microbatches():
    p = window_case("joint", 3, 5, 3, 3, "fast", "inf")
    starts, groups = [1, 3], p.groups
    ev = pipeopt.evaluate(p.instance, p.plan(starts, groups))
    bounds = [0, *starts, p.n]
    assert ev.in_flight == [6, 4, 2]
    for s in range(3):
        assert p.stage_memory(bounds[s], bounds[s + 1], s) == pytest.approx(ev.memory[s], rel=1e-12)
        assert p.in_flight(s, "sequential") == 3 - s
    seq = pipeopt.evaluate(p.instance, p.plan(starts, groups, "sequential"))
    assert seq.in_flight == [3, 2, 1]


# ---- exact methods against brute force ----------------------------------------------------------

CASES = [  # kind, seed, n, S, devices, bandwidth, memory
    ("joint", 2, 3, 2, 2, "tight", "inf"),
    ("joint", 3, 4, 3, 3, "tight", "inf"),
    ("joint", 12, 5, 3, 3, "tight", "bind"),
    ("joint", 13, 5, 2, 2, "tight", "bind"),
    ("joint", 7, 5, 1, 1, "tight", "inf"),
    ("joint", 8, 5, 4, 4, "fast", "bind"),
    ("joint", 9, 4, 2, 2, "tight", "none"),
    ("group", 0, 4, 3, 3, "tight", "inf"),
    ("group", 5, 5, 3, 4, "tight", "inf"),
    ("group", 6, 5, 2, 3, "tight", "bind"),
    ("group", 8, 4, 2, 3, "tight", "bind"),
    ("group", 3, 4, 1, 3, "tight", "inf"),
    ("group", 14, 4, 3, 3, "fast", "bind"),
    ("group", 15, 3, 2, 3, "tight", "none"),
]

METHODS = {
    "joint": [("dp", joint.solve_dp, {}), ("milp-cbc", joint.solve_milp, {"solver": "cbc"}),
              ("milp-highs", joint.solve_milp, {"solver": "highs"}), ("cpsat", joint.solve_cpsat, {"threads": 1})],
    "group": [("milp-cbc", group.solve_milp, {"solver": "cbc"}), ("milp-highs", group.solve_milp, {"solver": "highs"}),
              ("cpsat", group.solve_cpsat, {"threads": 1})],
}


def _check_claims(p, r, best):
    """Every claim of one result against the brute-force optimum ``best`` (seconds)."""
    assert r.plan is not None
    ev = pipeopt.evaluate(p.instance, r.plan)
    assert r.objective == ev.objective == ev.bottleneck and ev.feasible
    assert all(st.beta is not None for st in r.plan.stages)
    assert r.objective >= best * (1 - 1e-12)
    assert r.lower_bound is not None and r.lower_bound <= best * (1 + 1e-12)
    assert str(r.status) == "optimal", (r.status, r.info)
    assert r.objective <= best * (1 + r.info["rel_gap_target"]) * (1 + 1e-12)


@pytest.fixture(scope="module")
def cases():
    cache = {}

    def get(case):
        if case not in cache:
            p = window_case(*case)
            cache[case] = (p, reference(p))
        return cache[case]

    return get


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_exact_methods_against_brute_force_scored_by_evaluate(case, cases):
    p, (best, plan) = cases(case)
    for name, method, kw in METHODS[case[0]]:
        if plan is None:
            with pytest.raises(pipeopt.InfeasibleError):
                method(p, time_limit=None, **kw)
            continue
        _check_claims(p, method(p, time_limit=None, **kw), best)


def test_the_cases_bind_what_they_claim(cases):
    """The tight cases have active window rows at their optimum, the memory cases bind (the
    optimum without the memory limit does not fit, or fits exactly), "none" has no plan."""
    active = 0
    for case in CASES:
        p, (best, plan) = cases(case)
        if case[-1] == "none":
            assert plan is None
            continue
        ev = pipeopt.evaluate(p.instance, plan)
        active += case[5] == "tight" and window_active(ev)
        if case[-1] == "bind":
            assert any(m >= c * (1 - 1e-9) for m, c in zip(ev.memory, ev.memory_capacity)) or \
                best > reference(window_case(*case[:-1], "inf"))[0]
    assert active >= 4


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "joint"][:4], ids=lambda c: "-".join(map(str, c)))
def test_chain_dp_exact_in_every_mode(case, cases):
    """The chain DP (stage s on its fixed worker) is exact for split and sequential execution:
    its value is the least evaluate bottleneck over all splits in that mode."""
    p, _ = cases(case)
    for mode in ("split", "sequential"):
        best = min((pipeopt.evaluate(p.instance, p.plan(c, g, mode)) for c, g in resource_splits(p)),
                   key=lambda ev: ev.bottleneck if ev.feasible else math.inf)
        starts, value = minmax_chain_dp(p, p.groups, mode)
        if not best.feasible:
            assert math.isinf(value)
            continue
        assert value == pytest.approx(best.bottleneck, rel=1e-11)
        assert pipeopt.evaluate(p.instance, p.plan(starts, p.groups, mode)).bottleneck == pytest.approx(value, rel=1e-12)
        found = chain_optimum(p, p.groups, mode)
        assert found.closed and found.lower <= best.bottleneck * (1 + 1e-12)
        assert ChainProbe(p, p.groups, mode)(found.lower * (1 - 1e-9)).outcome == "infeasible"


@pytest.mark.parametrize("case", [c for c in CASES if c[-1] != "none"][:6], ids=lambda c: "-".join(map(str, c)))
def test_allocate_is_the_least_period_over_the_shares(case, cases):
    """allocate on a given plan: OPTIMAL, its value evaluate's, its bound within float rounding,
    and no share found by a search scored by evaluate beats it."""
    p, (best, plan) = cases(case)
    given = pipeopt.Plan(tuple(pipeopt.Stage(st.layers, st.devices) for st in plan.stages))
    r = allocate.solve_lp(AllocateProblem(p.instance, plan_given=given), time_limit=None)
    assert str(r.status) == "optimal"
    assert r.objective == pytest.approx(best, rel=1e-12)
    assert r.lower_bound <= r.objective <= r.lower_bound * (1 + 1e-12)
    rng = random.Random(1)
    stages = list(r.plan.stages)
    for _ in range(200):
        i = rng.randrange(len(stages))
        st = stages[i]
        beta = {k: min(1.0, max(0.0, b + rng.gauss(0, 0.03))) for k, b in st.beta.items()}
        trial = stages[:i] + [pipeopt.Stage(st.layers, st.devices, beta=beta)] + stages[i + 1:]
        assert pipeopt.evaluate(p.instance, pipeopt.Plan(tuple(trial))).objective >= r.objective * (1 - 1e-12)
