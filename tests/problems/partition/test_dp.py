"""The exact DP against brute-force enumeration and the cost model, on random and real input."""

from __future__ import annotations

import math

import pytest
from conftest import PROFILES, profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import brute_force, instances

from pipeopt import Cluster, Device, Instance, PartitionProblem, evaluate
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition.dp import REL_TOL, solve_dp
from pipeopt.result import Status
from pipeopt.problems.partition.problem import is_close


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=instances(max_layers=7, alpha=True), S=st.integers(1, 4), replication=st.booleans())
def test_dp_equals_brute_force(inst, S, replication):
    if S > inst.chain.n:
        with pytest.raises(InvalidProblemError, match="more stages"):
            PartitionProblem(inst, S, replication)
        return
    p = PartitionProblem(inst, S, replication)
    best = brute_force(p)
    if math.isinf(best):
        with pytest.raises(InfeasibleError, match="fits"):
            solve_dp(p)
        return
    res = solve_dp(p)
    assert is_close(res.objective, best)
    assert is_close(res.info["dp_value"], res.objective)  # claimed value = evaluate(plan)
    assert res.evaluation.feasible
    assert res.lower_bound <= res.objective and is_close(res.lower_bound, res.objective, rel=1e-9)  # proven
    if not replication:
        assert res.plan.num_stages == S
    assert sum(s.replicas for s in res.plan.stages) == (S if replication else S)


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("S", [2, 4, 8, 16])
def test_dp_on_real_profiles(name, S):
    inst = profile(name)
    straight = solve_dp(PartitionProblem(inst, S))
    rep = solve_dp(PartitionProblem(inst, S, replication=True))
    for res in (straight, rep):
        assert is_close(res.info["dp_value"], evaluate(inst, res.plan).objective)
        layers = [n for st in res.plan.stages for n in st.layers]
        assert sorted(layers) == sorted(inst.graph.nodes)  # every layer exactly once
        assert all(st.layers for st in res.plan.stages)
    assert straight.plan.num_stages == S
    assert sum(st.replicas for st in rep.plan.stages) == S
    # replication widens the space: never worse
    assert rep.objective <= straight.objective * (1 + 1e-9)
    # more workers never hurt in the replicated space
    if S > 2:
        fewer = solve_dp(PartitionProblem(inst, S // 2, replication=True))
        assert rep.objective <= fewer.objective * (1 + 1e-9)


def test_memory_limit_binds_and_infeasible_is_typed():
    inst = profile("vgg16")
    free = solve_dp(PartitionProblem(inst, 4))
    peak = max(free.evaluation.memory)
    limited = inst.replace(cluster=Cluster.homogeneous(16, memory=peak * 0.8, bandwidth=inst.cluster.bandwidth))
    res = solve_dp(PartitionProblem(limited, 4))
    assert res.evaluation.feasible and max(res.evaluation.memory) <= peak * 0.8
    assert res.objective >= free.objective
    tiny = inst.replace(cluster=Cluster.homogeneous(16, memory=1e6, bandwidth=inst.cluster.bandwidth))
    with pytest.raises(InfeasibleError, match="fits in"):
        solve_dp(PartitionProblem(tiny, 4))


def test_bad_requests_are_typed():
    inst = profile("alexnet")
    with pytest.raises(InvalidProblemError, match="more stages"):
        PartitionProblem(inst, 100)
    with pytest.raises(InvalidProblemError, match="positive integer"):
        PartitionProblem(inst, 0)
    with pytest.raises(InvalidProblemError, match="devices"):
        PartitionProblem(profile("alexnet", devices=2), 4)
    mixed = Cluster((Device("a", {"gpu": 1.0}), Device("b", {"gpu": 2.0})))
    with pytest.raises(InvalidProblemError, match="identical"):
        PartitionProblem(Instance(inst.graph, mixed), 2)
    with pytest.raises(InvalidProblemError, match="bottleneck"):  # the DP's probe is the steady state's
        solve_dp(PartitionProblem(inst.with_settings(objective="gpipe"), 2))


@pytest.mark.parametrize("name, stages, most", [("alexnet", 4, 8), ("alexnet", 16, 1), ("resnet18", 8, 10),
                                                ("vgg16", 8, 10)])
def test_the_bisection_probes_just_below_each_new_plan(name, stages, most):
    """The first pass's plan, or a midpoint's, is often optimal: a probe just below it proves it
    (PipeDream profiles: 1-9 probes where the midpoints alone took 39-42)."""
    res = solve_dp(PartitionProblem(profile(name), stages), time_limit=None)
    assert res.status == Status.OPTIMAL and res.info["probes"] <= most
    assert res.objective - res.lower_bound <= REL_TOL * res.lower_bound
