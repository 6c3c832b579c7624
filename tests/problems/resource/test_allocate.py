"""allocate: the optimal forward/backward split (LP), the paper's theorem, sequential execution."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pulp
import pytest

import pipeopt
from pipeopt.cost import stage_compute
from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.resource import (
    AllocateProblem,
    JointProblem,
    best_split,
    optimal_split,
    sequential_time,
    theorem_split,
)
from pipeopt.problems.resource.examples import soc_instance, with_second_kind

PROFILES = "../shared/data/pipedream-profiles"


def _random_case(rng: random.Random, K: int):
    kinds = [f"k{i}" for i in range(K)]
    res = {k: rng.choice([0.5, 1, 2, 3]) for k in kinds}
    F = {k: rng.uniform(0.1, 3) for k in kinds}
    B = {k: F[k] * rng.uniform(0.3, 4) for k in kinds}
    return res, F, B


def _lp_with_pulp(res, F, B) -> float:
    """The allocation LP solved by a general LP solver: its optimal stage time."""
    prob = pulp.LpProblem("alloc", pulp.LpMaximize)
    r = pulp.LpVariable("r", 0)
    beta = {k: pulp.LpVariable(f"b_{k}", 0, 1) for k in res}
    prob += r
    prob += pulp.lpSum(beta[k] * res[k] / F[k] for k in res) >= r
    prob += pulp.lpSum((1 - beta[k]) * res[k] / B[k] for k in res) >= r
    prob.solve(pulp.PULP_CBC_CMD(msg=False))
    return 1.0 / r.value()


@pytest.mark.parametrize("seed", range(6))
def test_theorem_equal_ratios(seed):
    """Duan & Wu's theorem: F_k/B_k = c for every kind => beta = c/(c+1) is optimal."""
    rng = random.Random(seed)
    c = rng.uniform(0.2, 3.0)
    res = {k: rng.choice([1, 2, 4]) for k in ("cpu", "gpu", "npu")}
    F = {k: rng.uniform(0.5, 5) for k in res}
    B = {k: F[k] / c for k in res}
    beta = theorem_split(res, F, B)
    assert all(math.isclose(b, c / (c + 1)) for b in beta.values())
    tau_theorem = stage_compute(res, F, B, beta)[2]
    _, tau_lp = best_split(res, F, B)
    assert math.isclose(tau_theorem, tau_lp, rel_tol=1e-12)
    # and no point of a grid does better
    grid = np.linspace(0, 1, 41)
    best_grid = min(stage_compute(res, F, B, dict(zip(res, g)))[2] for g in itertools.product(grid, repeat=3))
    assert best_grid >= tau_lp * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_lp_split_against_fine_grid(seed):
    """Two kinds: the LP split is no worse than any point of a 401 x 401 grid, and the grid gets close."""
    res, F, B = _random_case(random.Random(seed), 2)
    beta, tau = best_split(res, F, B)
    assert all(0 <= b <= 1 for b in beta.values())
    assert math.isclose(stage_compute(res, F, B, beta)[2], tau, rel_tol=1e-12)
    g = np.linspace(0, 1, 401)
    b0, b1 = np.meshgrid(g, g, indexing="ij")
    k0, k1 = list(res)
    fwd_rate = b0 * res[k0] / F[k0] + b1 * res[k1] / F[k1]
    bwd_rate = (1 - b0) * res[k0] / B[k0] + (1 - b1) * res[k1] / B[k1]
    with np.errstate(divide="ignore"):
        grid_tau = 1.0 / np.minimum(fwd_rate, bwd_rate)
    assert grid_tau.min() >= tau * (1 - 1e-12)
    assert grid_tau.min() <= tau * (1 + 1e-2)


@pytest.mark.parametrize("seed", range(5))
def test_lp_split_against_general_lp_solver(seed):
    res, F, B = _random_case(random.Random(100 + seed), 4)
    assert math.isclose(best_split(res, F, B)[1], _lp_with_pulp(res, F, B), rel_tol=1e-6)


def test_split_beats_sequential_and_equals_it_on_one_kind():
    rng = random.Random(3)
    for _ in range(20):
        res, F, B = _random_case(rng, 3)
        assert best_split(res, F, B)[1] <= sequential_time(res, F, B) * (1 + 1e-12)
        one = {"gpu": 2.0}
        assert math.isclose(best_split(one, {"gpu": F["k0"]}, {"gpu": B["k0"]})[1],
                            sequential_time(one, {"gpu": F["k0"]}, {"gpu": B["k0"]}), rel_tol=1e-12)


def test_degenerate_loads():
    res = {"cpu": 1.0, "gpu": 2.0}
    assert best_split(res, {"cpu": 0.0, "gpu": 0.0}, {"cpu": 0.0, "gpu": 0.0})[1] == 0.0
    beta, tau = best_split(res, {"cpu": 0.0, "gpu": 1.0}, {"cpu": 1.0, "gpu": 2.0})  # free forward on cpu
    assert math.isclose(stage_compute(res, {"cpu": 0.0, "gpu": 1.0}, {"cpu": 1.0, "gpu": 2.0}, beta)[2], tau, rel_tol=1e-6)
    assert math.isclose(tau, 1 / (1 / 1.0 + 2 / 2.0), rel_tol=1e-6)
    assert best_split(res, {"npu": 1.0}, {"npu": 1.0})[1] == math.inf  # no kind can run it


def _methods(problem):
    from pipeopt.problems.resource import allocate as allocate_lp

    return {name: getattr(allocate_lp, fn)(problem)
            for name, fn in (("lp", "solve_lp"), ("theorem", "theorem"), ("sequential", "sequential"))}


@pytest.mark.parametrize("seed", range(3))
def test_allocate_methods_on_one_partition(seed):
    inst = soc_instance(12, 4, seed=seed, heterogeneous=False)
    out = _methods(AllocateProblem(inst, 3))
    lists = {name: r.plan.layer_lists() for name, r in out.items()}
    assert lists["lp"] == lists["theorem"] == lists["sequential"]  # the same partition
    for r in out.values():
        assert r.objective == pipeopt.evaluate(inst, r.plan).objective
    assert out["lp"].status == pipeopt.Status.OPTIMAL
    assert math.isclose(out["lp"].lower_bound, out["lp"].objective, rel_tol=1e-12)  # its own optimum
    assert out["lp"].objective <= out["theorem"].objective * (1 + 1e-12)
    assert out["lp"].objective <= out["sequential"].objective * (1 + 1e-12)
    assert out["sequential"].space == "sequential" and out["lp"].space == "split"
    assert all(st.beta is None for st in out["sequential"].plan.stages)
    assert math.isclose(out["lp"].info["sequential_objective"], out["sequential"].objective, rel_tol=1e-12)
    # the partition is the binary-search one of the two-step baseline
    from pipeopt.problems.resource.duan_wu import two_step

    assert two_step(JointProblem(inst, 3)).plan.layer_lists() == lists["lp"]


def test_allocate_through_solve_and_registry():
    inst = soc_instance(10, 3, seed=5, heterogeneous=False)
    from pipeopt.solve import solve

    r = solve(inst, problem="allocate", method="lp", stages=3, time_limit=None)
    assert r.status == pipeopt.Status.OPTIMAL and r.plan.num_stages == 3


def test_optimal_split_of_a_given_plan():
    inst = soc_instance(9, 3, seed=2)
    names = [d.name for d in inst.cluster.devices]
    plan = pipeopt.Plan((pipeopt.Stage(("l0", "l1", "l2", "l3"), (names[0],)),
                         pipeopt.Stage(("l4", "l5", "l6", "l7", "l8"), (names[1], names[2]))))
    best = optimal_split(inst, plan)
    assert best.layer_lists() == plan.layer_lists() and [s.devices for s in best.stages] == [s.devices for s in plan.stages]
    seq = pipeopt.evaluate(inst, plan).objective
    assert pipeopt.evaluate(inst, best).objective <= seq * (1 + 1e-12)
    # a brute-force grid over each stage's shares (the other's kept) does not beat its objective
    ev = pipeopt.evaluate(inst, best)
    grid = np.linspace(0, 1, 21)
    for i, st in enumerate(plan.stages):
        kinds = sorted({k for d in st.devices for k in inst.cluster.device(d).resources})
        tmin = math.inf
        for g in itertools.product(grid, repeat=len(kinds)):
            stages = list(best.stages)
            stages[i] = pipeopt.Stage(st.layers, st.devices, beta=dict(zip(kinds, g)))
            tmin = min(tmin, pipeopt.evaluate(inst, pipeopt.Plan(tuple(stages))).bottleneck)
        assert tmin >= ev.bottleneck * (1 - 1e-12)
    r = _methods(AllocateProblem(inst, plan_given=plan))["lp"]
    assert r.objective == pipeopt.evaluate(inst, best).objective


def test_share_outside_unit_interval_is_rejected():
    inst = soc_instance(6, 2, seed=1, heterogeneous=False)
    names = [d.name for d in inst.cluster.devices]
    bad = pipeopt.Plan((pipeopt.Stage(("l0", "l1", "l2"), (names[0],), beta={"cpu": 1.5, "gpu": 0.5, "npu": 0.5}),
                        pipeopt.Stage(("l3", "l4", "l5"), (names[1],))))
    with pytest.raises(pipeopt.InvalidPlanError, match="outside"):
        pipeopt.evaluate(inst, bad)
    with pytest.raises(pipeopt.InvalidPlanError, match="outside"):
        AllocateProblem(inst, plan_given=bad)
    with pytest.raises(pipeopt.InvalidPlanError):
        optimal_split(inst, bad)
    with pytest.raises(pipeopt.InvalidProblemError):
        AllocateProblem(inst)  # neither stages nor a plan


def test_real_profile_with_a_synthetic_second_kind():
    """AlexNet (PipeDream profile) on GPU+CPU workers: the split beats sequential execution."""
    base = read_pipedream(f"{PROFILES}/alexnet.txt", devices=4)
    graph = with_second_kind(base.graph, kind="cpu", slowdown=8.0, bwd_ratio=1.0)
    devices = tuple(pipeopt.Device(f"w{i}", {"gpu": 1, "cpu": 4}) for i in range(4))
    inst = pipeopt.Instance(graph, pipeopt.Cluster(devices, base.cluster.bandwidth), name="alexnet+cpu")
    out = _methods(AllocateProblem(inst, 4))
    assert out["lp"].objective < out["sequential"].objective
    assert out["lp"].objective <= out["theorem"].objective * (1 + 1e-12)


def test_a_plan_that_recomputes_is_refused_not_dropped():
    """The resource problems score a plan by its cuts and do not choose recomputation: a given
    plan with a recompute set is refused by name, never solved without it."""
    inst = soc_instance(6, 2, seed=1, heterogeneous=False)
    names = [d.name for d in inst.cluster.devices]
    plan = pipeopt.Plan((pipeopt.Stage(("l0", "l1", "l2"), (names[0],), recompute={"l1": "full"}),
                         pipeopt.Stage(("l3", "l4", "l5"), (names[1],))))
    with pytest.raises(pipeopt.InvalidPlanError, match="recompute"):
        AllocateProblem(inst, plan_given=plan)
