"""Duan & Wu's Algorithm 2 in its two readings of p_i: the average stage (``algorithm2``) and
each worker's own stage, grouping and partition iterated to a fixed point
(``algorithm2_staged``). Both are baselines scored by evaluate, never below brute force."""

from __future__ import annotations

import math

import pytest
from brute_force import group_optimum

import pipeopt
from pipeopt.problems.resource import GroupProblem
from pipeopt.problems.resource.duan_wu import (
    STAGED_ROUNDS,
    algorithm2,
    algorithm2_groups,
    algorithm2_staged,
    bisection_partition,
    staged_cost,
    staged_groups,
)
from pipeopt.problems.resource.examples import random_chain, soc_devices
from pipeopt.problems.resource.split import best_split
from pipeopt.registry import method
from pipeopt.solve import solve

MIXED = (
    pipeopt.Device("a", {"cpu": 1, "gpu": 2}),
    pipeopt.Device("b", {"cpu": 4}),
    pipeopt.Device("c", {"gpu": 3, "npu": 1}),
    pipeopt.Device("d", {"npu": 4}),
    pipeopt.Device("e", {"cpu": 1, "gpu": 2}),
)


def _problem(layers, devices, q, *, seed=0, bandwidth=1e9, memory=None):
    if memory is not None:
        devices = tuple(pipeopt.Device(d.name, d.resources, memory) for d in devices)
    inst = pipeopt.Instance(random_chain(layers, seed=seed), pipeopt.Cluster(devices, bandwidth))
    return GroupProblem(inst, q)


def _check(problem, r, name):
    assert r.method == name and r.space == "split"
    assert r.lower_bound is None  # a baseline proves nothing
    ev = pipeopt.evaluate(problem.instance, r.plan)
    assert r.objective == ev.objective
    assert r.status == (pipeopt.Status.FEASIBLE if ev.feasible else pipeopt.Status.INFEASIBLE)
    used = [d for st in r.plan.stages for d in st.devices]
    assert sorted(used) == sorted(problem.device_names)  # every device in exactly one worker
    assert r.plan.num_stages == problem.num_stages
    assert all(st.beta is not None and st.devices and st.layers for st in r.plan.stages)


CASES = [  # layers, devices, workers, seed, bandwidth, memory
    (6, MIXED[:4], 2, 0, 1e9, None),
    (7, MIXED, 3, 1, 1e9, None),
    (6, MIXED, 3, 2, 4e6, None),
    (7, MIXED[:4], 3, 3, 1e9, 2.2e7),
]


@pytest.mark.parametrize("layers,devices,q,seed,bandwidth,memory", CASES)
def test_staged_is_a_valid_plan_scored_by_evaluate_and_never_below_brute_force(layers, devices, q, seed,
                                                                               bandwidth, memory):
    p = _problem(layers, devices, q, seed=seed, bandwidth=bandwidth, memory=memory)
    best = group_optimum(p.instance, q)  # every grouping x every split, scored by evaluate
    a2, st = algorithm2(p), algorithm2_staged(p)
    _check(p, a2, "algorithm2")
    _check(p, st, "algorithm2_staged")
    for r in (a2, st):
        if r.status == pipeopt.Status.FEASIBLE:
            assert r.objective >= best.value * (1 - 1e-9)
    # round 0 is Algorithm 2's plan, and the best round is kept: never worse than the first reading
    assert (st.status != pipeopt.Status.FEASIBLE, st.objective) <= (a2.status != pipeopt.Status.FEASIBLE,
                                                                     a2.objective * (1 + 1e-12))
    info = st.info
    assert len(info["objectives"]) == info["rounds"] + 1
    assert math.isclose(info["objectives"][0], a2.objective, rel_tol=1e-12)
    assert st.objective == info["objectives"][info["best_round"]]


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_staged_iterates_to_a_fixed_point_on_a_larger_instance(seed):
    p = _problem(24, soc_devices(8, seed=11 + seed), 3, seed=5 + seed, bandwidth=5e7)
    st = algorithm2_staged(p)
    _check(p, st, "algorithm2_staged")
    info = st.info
    assert info["fixed_point"] or info["cycle"] or info["rounds"] == STAGED_ROUNDS
    if info["fixed_point"] and info["best_round"] == info["rounds"]:
        # the last grouping, partitioned, regroups into itself
        groups = [tuple(s.devices) for s in st.plan.stages]
        starts, _ = bisection_partition(p, groups, mode="sequential")
        assert staged_groups(p, starts) == groups
    zero = algorithm2_staged(p, rounds=0)  # no regrouping: Algorithm 2's plan
    assert zero.plan == algorithm2(p).plan and zero.info["rounds"] == 0


def test_staged_cost_is_the_split_time_of_the_workers_own_stage():
    p = _problem(10, MIXED, 3, seed=4)
    starts = [3, 7]
    res = {"cpu": 1, "gpu": 2}
    for s, (a, b) in enumerate([(0, 3), (3, 7), (7, 10)]):
        F, B = p.load(a, b)
        assert staged_cost(p, starts, s, res) == best_split(res, F, B)[1]
    assert staged_cost(p, starts, 0, {}) == math.inf
    groups = staged_groups(p, starts)
    assert sorted(d for g in groups for d in g) == sorted(p.device_names) and all(groups)
    assert len(algorithm2_groups(p)) == 3


def test_registered_and_reachable_through_solve():
    spec = method("group", "algorithm2_staged")
    assert not spec.exact and spec.space == "split"
    inst = pipeopt.Instance(random_chain(6, seed=1), pipeopt.Cluster(MIXED[:4], 1e9))
    r = solve(inst, problem="group", method="algorithm2_staged", workers=2)
    assert r.status == pipeopt.Status.FEASIBLE and r.plan.num_stages == 2
