"""joint: partition and split at once on identical multi-resource workers - DP, MILP, CP-SAT,
brute force, and the two-step baseline."""

from __future__ import annotations

import math

import pytest

import pipeopt
from pipeopt.problems.resource.duan_wu import bisection_partition, two_step
from pipeopt.problems.resource import joint
from pipeopt.problems.resource import JointProblem, brute_force
from pipeopt.problems.resource.examples import random_chain, soc_instance

REL = 2e-4  # exact methods stop at a relative gap of 1e-4


def _tiny(seed: int, layers: int = 7, stages: int = 3, memory: float = math.inf, bandwidth: float = 1e9):
    return JointProblem(soc_instance(layers, stages + 1, seed=seed, heterogeneous=False,
                                     memory=memory, bandwidth=bandwidth), stages)


def _check_result(problem, r):
    assert r.plan is not None
    ev = pipeopt.evaluate(problem.instance, r.plan)
    assert r.objective == ev.objective  # the claimed objective is evaluate's
    assert all(st.beta is not None for st in r.plan.stages)
    if r.lower_bound is not None:
        assert r.lower_bound <= r.objective * (1 + 1e-9)


@pytest.mark.parametrize("seed,bandwidth,memory", [(0, 1e9, math.inf), (1, 5e6, math.inf), (2, 1e9, 3.5e7), (3, 2e6, 4e7)])
def test_exact_methods_equal_brute_force(seed, bandwidth, memory):
    p = _tiny(seed, memory=memory, bandwidth=bandwidth)
    _starts, _groups, best = brute_force(p)
    dp = joint.solve_dp(p)
    _check_result(p, dp)
    assert math.isclose(dp.objective, best, rel_tol=1e-9)
    for r in (joint.solve_milp(p, time_limit=None, solver="highs"), joint.solve_cpsat(p, time_limit=None, threads=1)):
        _check_result(p, r)
        assert r.lower_bound <= best * (1 + 1e-6)  # a valid bound
        assert r.status == pipeopt.Status.OPTIMAL
        assert r.objective <= best * (1 + REL)


def test_milp_cbc_and_highs_and_cpsat_agree():
    p = _tiny(7, layers=8)
    rs = [joint.solve_milp(p, time_limit=None, solver="cbc"), joint.solve_milp(p, time_limit=None, solver="highs"),
          joint.solve_cpsat(p, time_limit=None, threads=1)]
    proven = [r for r in rs if r.status == pipeopt.Status.OPTIMAL]
    assert len(proven) >= 2
    for r in proven:
        assert math.isclose(r.objective, proven[0].objective, rel_tol=REL)


@pytest.mark.parametrize("seed", range(4))
def test_exact_no_worse_than_two_step(seed):
    p = JointProblem(soc_instance(30, 4, seed=seed, heterogeneous=False, bandwidth=2e7), 4)
    base = two_step(p)
    _check_result(p, base)
    assert base.status == pipeopt.Status.FEASIBLE and base.lower_bound is None
    dp = joint.solve_dp(p)
    assert dp.objective <= base.objective * (1 + 1e-12)


def test_greedy_bisection_is_exact_without_transfers():
    """Without transfers and memory the binary search on the split time is exact (monotone costs)."""
    inst = soc_instance(25, 5, seed=4, heterogeneous=False, bandwidth=1e30)
    p = JointProblem(inst, 5)
    _, v = bisection_partition(p, p.groups, mode="split")
    assert math.isclose(v, joint.solve_dp(p).objective, rel_tol=1e-7)


def test_single_kind_joint_equals_the_partition_dp():
    """With one resource kind the split's least stage time is the sequential one, (F + B) / R;
    split execution only relaxes the window rows (2k microbatches in flight). Where no window
    row binds, as here, the joint optimum is the partition optimum."""
    from pipeopt.problems.partition.dp import solve_dp as partition_dp

    graph = random_chain(15, kinds=("gpu",), seed=3)
    inst = pipeopt.Instance(graph, pipeopt.Cluster.homogeneous(4, bandwidth=5e7))
    a = joint.solve_dp(JointProblem(inst, 4))
    b = partition_dp(pipeopt.PartitionProblem(inst, 4))
    assert math.isclose(a.objective, b.objective, rel_tol=1e-9)


def test_time_limit_is_honest():
    p = JointProblem(soc_instance(60, 6, seed=9, heterogeneous=False, bandwidth=2e7), 6)
    r = joint.solve_milp(p, time_limit=_expired())  # passed before the call: no race with a fast machine
    _check_result(p, r)
    assert r.status == pipeopt.Status.TIME_LIMIT
    assert r.lower_bound <= joint.solve_dp(p).objective


def test_through_solve():
    from pipeopt.solve import solve

    inst = soc_instance(8, 3, seed=1, heterogeneous=False)
    r = solve(inst, problem="joint", method="dp", stages=3, time_limit=None)
    assert r.status == pipeopt.Status.OPTIMAL and r.space == "split"


def test_bad_input():
    inst = soc_instance(5, 3, seed=0, heterogeneous=False)
    with pytest.raises(pipeopt.InvalidProblemError, match="more stages"):
        JointProblem(inst, 4)  # more stages than devices
    with pytest.raises(pipeopt.InvalidProblemError, match="identical"):
        mixed = (pipeopt.Device("a", {"cpu": 1, "gpu": 1}), pipeopt.Device("b", {"cpu": 2}))
        JointProblem(pipeopt.Instance(inst.graph, pipeopt.Cluster(mixed)), 2)
    with pytest.raises(pipeopt.InvalidProblemError, match="overlap"):
        JointProblem(inst.with_settings(overlap=False), 2)


@pytest.mark.parametrize("name,S,bandwidth", [("vgg16", 4, None), ("gnmt", 8, 1e9), ("resnet50", 4, 1e9),
                                               ("alexnet", 4, None)])
def test_two_step_partition_is_the_sequential_binary_search(name, S, bandwidth):
    """On single-kind GPUs two_step keeps the partition of Duan & Wu's binary search on the
    sequential stage time and gives its stages their best shares; the exact DP is no worse.
    (The partition problem's own binary search is no reference any more: it scores the
    sequential window rows, split execution has its own.)"""
    from pipeopt.io.pipedream import read_pipedream

    inst = read_pipedream(f"../shared/data/pipedream-profiles/{name}.txt", devices=8, bandwidth=bandwidth)
    p = JointProblem(inst, S)
    starts, _ = bisection_partition(p, p.groups, mode="sequential")
    b = two_step(p)
    assert b.plan.layer_lists() == p.plan(starts, p.groups).layer_lists()
    assert math.isclose(b.objective, p.plan_value(starts, p.groups), rel_tol=1e-12)
    assert joint.solve_dp(p).objective <= b.objective * (1 + 1e-12)


def _expired():
    """A deadline that passed before the solve starts (a time-limit test that no machine's speed
    can turn into a proof)."""
    import time

    from pipeopt.backends.deadline import Deadline

    return Deadline(1e-3, clock=time.perf_counter() - 1.0)
