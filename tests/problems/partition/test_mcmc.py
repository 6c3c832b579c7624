"""The FlexFlow-style MCMC baseline: valid plans scored by evaluate, never better than the
proven optimum (the DP, or brute force), deterministic for a seed under a proposal cap; five
chains (seeds seed .. seed + 4) share the time limit and the median chain's plan is returned."""

from __future__ import annotations

import math

import pytest
from conftest import profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import brute_force, instances

from pipeopt import Cluster, PartitionProblem, Status, evaluate
from pipeopt.problems.partition.mcmc import mcmc
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.problem import is_close
from pipeopt.registry import method
from pipeopt.solve import solve


def check_plan(res, problem):
    """A valid plan of exactly S stages (straight) scored by evaluate."""
    inst = problem.instance
    assert res.method == "mcmc"
    assert res.lower_bound is None  # a heuristic proves nothing
    ev = evaluate(inst, res.plan)
    assert is_close(res.objective, ev.objective)
    layers = [n for st in res.plan.stages for n in st.layers]
    assert sorted(layers) == sorted(inst.graph.nodes)
    assert all(st.layers for st in res.plan.stages)
    if problem.replication:
        assert sum(st.replicas for st in res.plan.stages) == problem.stages
    else:
        assert res.plan.num_stages == problem.stages
        assert all(st.replicas == 1 for st in res.plan.stages)
    assert res.status == (Status.FEASIBLE if ev.feasible else Status.INFEASIBLE)


@pytest.mark.parametrize("name, S", [("vgg16", 4), ("gnmt", 8), ("resnet50", 8), ("inception_v3", 16)])
def test_never_better_than_the_dp_on_real_profiles(name, S):
    p = PartitionProblem(profile(name), S)
    res = mcmc(p, iterations=1000, seed=1)
    check_plan(res, p)
    opt = solve_dp(p).objective
    assert res.objective >= opt * (1 - 1e-9)
    start = mcmc(p, iterations=0)  # the chain starts from DeepSpeed's uniform split
    assert start.plan == solve(p.instance, method="uniform", stages=S).plan
    assert res.objective <= start.objective * (1 + 1e-9)  # the best plan seen is at least the start


def test_reaches_the_optimum_on_small_profiles():
    # short chains: 5000 proposals find the DP optimum (pins the search's quality)
    for name, S in [("vgg16", 4), ("vgg16", 8), ("gnmt", 4)]:
        p = PartitionProblem(profile(name), S)
        assert is_close(mcmc(p, iterations=5000).objective, solve_dp(p).objective), (name, S)


def test_replication_moves():
    inst = profile("vgg16")
    p = PartitionProblem(inst, 8, replication=True)
    res = mcmc(p, iterations=300, seed=3)
    check_plan(res, p)
    assert res.space == "replicated-one-order"
    assert res.objective >= solve_dp(p).objective * (1 - 1e-9)
    assert res.objective <= mcmc(PartitionProblem(inst, 8), iterations=0).objective  # the uniform start


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=7), S=st.integers(1, 4), replication=st.booleans(), seed=st.integers(0, 5))
def test_random_chains_against_brute_force(inst, S, replication, seed):
    if S > inst.chain.n:
        return
    p = PartitionProblem(inst, S, replication)
    res = mcmc(p, iterations=200, seed=seed)
    check_plan(res, p)
    best = brute_force(p)  # the optimum over every contiguous split, by evaluate
    if math.isinf(best):
        assert res.status == Status.INFEASIBLE
        with pytest.raises(InfeasibleError):
            solve_dp(p)
    elif res.status == Status.FEASIBLE:
        assert res.objective >= best * (1 - 1e-9)


@pytest.mark.parametrize("score", ["model", "evaluate"])
def test_deterministic_for_a_seed(score):
    p = PartitionProblem(profile("resnet50"), 6)
    a = mcmc(p, iterations=150, seed=7, score=score)
    b = mcmc(p, iterations=150, seed=7, score=score)
    assert a.plan == b.plan and a.info["accepted"] == b.info["accepted"]
    assert a.info["objectives"] == b.info["objectives"]
    assert a.info["proposals"] == [150] * 5
    c = mcmc(p, iterations=150, seed=100, score=score)
    assert c.info["accepted"] != a.info["accepted"] or c.plan != a.plan  # the seed matters


def test_five_seeds_median_and_range():
    p = PartitionProblem(profile("resnet50"), 8)
    res = mcmc(p, iterations=300, seed=4)
    info = res.info
    assert info["seeds"] == [4, 5, 6, 7, 8]
    assert len(info["objectives"]) == len(info["proposals"]) == len(info["accepted"]) == 5
    objs = sorted(info["objectives"])
    assert info["median"] == objs[2] == res.objective
    assert info["min"] == objs[0] and info["max"] == objs[-1]
    assert math.isclose(info["range"], objs[-1] - objs[0])
    assert info["objectives"][info["seeds"].index(info["median_seed"])] == res.objective
    for s, obj in zip(info["seeds"], info["objectives"]):  # each chain on its own is a one-chain run
        one = mcmc(p, iterations=300, seed=s, chains=1)
        assert one.info["seeds"] == [s] and is_close(one.objective, obj)
    # every chain's plan is scored by evaluate: the median's plan is the returned one
    assert is_close(evaluate(p.instance, res.plan).objective, res.objective)


@pytest.mark.parametrize("overlap, stashing", [(True, False), (False, True)])
def test_model_score_equals_evaluate_score(overlap, stashing):
    # the prefix-array score and evaluate() are the same cost model: same chain, same plan
    inst = profile("gnmt").replace(cluster=Cluster.homogeneous(16, memory=0.5e9))  # memory binds
    inst = inst.with_settings(overlap=overlap, weight_stashing=stashing)
    p = PartitionProblem(inst, 4)
    a = mcmc(p, iterations=300, seed=2, score="model")
    b = mcmc(p, iterations=300, seed=2, score="evaluate")
    assert a.plan == b.plan and a.info["accepted"] == b.info["accepted"]
    assert a.info["objectives"] == b.info["objectives"]


def test_simulator_score():
    p = PartitionProblem(profile("vgg16"), 4)
    res = mcmc(p, iterations=20, seed=0, score="simulate", schedule="1f1b")
    check_plan(res, p)
    assert res.info["score"] == "simulate" and res.info["schedule"] == "1f1b"


def test_memory_penalty_steers_to_a_plan_that_fits():
    # 10 GB per GPU: the uniform split of resnet50 on 4 stages (41 GB on stage 0) does not
    # fit; the DP's optimum under the limit does
    inst = profile("resnet50").replace(cluster=Cluster.homogeneous(16, memory=10e9))
    p = PartitionProblem(inst, 4)
    start = mcmc(p, iterations=0)
    assert start.status == Status.INFEASIBLE
    res = mcmc(p, iterations=3000)
    assert res.status == Status.FEASIBLE and res.evaluation.feasible
    assert res.objective >= solve_dp(p).objective * (1 - 1e-9)


def test_time_limit_is_the_budget_and_bad_options():
    # no proposal cap: the five chains share the time limit, each runs until its share passes
    p = PartitionProblem(profile("vgg16"), 4)
    res = mcmc(p, time_limit=0.5)
    assert len(res.info["proposals"]) == 5 and all(k > 0 for k in res.info["proposals"])
    assert res.info["iterations_cap"] is None
    assert sum(res.info["budget_per_chain"]) <= 0.5 + 1e-9
    check_plan(res, p)
    capped = mcmc(p, iterations=10**9, time_limit=0.2)
    assert all(k < 10**9 for k in capped.info["proposals"])
    for bad in ({"iterations": -1}, {"temperature": 0.0}, {"score": "flexflow"}, {"jump": 1.5}, {"chains": 0},
                {"time_limit": None}):  # neither a finite limit nor a cap: it would never stop
        with pytest.raises(InvalidProblemError):
            mcmc(p, **bad)
    assert mcmc(p, time_limit=None, iterations=10).info["budget_per_chain"] == [None] * 5


def test_registered_and_reachable_through_solve():
    spec = method("partition", "mcmc")
    assert not spec.exact and spec.space == "one-order"
    res = solve(profile("vgg16"), method="mcmc", stages=4, seed=0, time_limit=0.5)
    assert res.method == "mcmc" and res.plan.num_stages == 4
