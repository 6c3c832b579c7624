"""group: heterogeneous devices into workers with partition and split - MILP, CP-SAT, brute
force, Algorithm 2 and round-robin."""

from __future__ import annotations

import math

import networkx as nx
import pytest

import pipeopt
from pipeopt.problems.resource.duan_wu import (
    algorithm2,
    algorithm2_groups,
    round_robin,
    round_robin_groups,
    worker_cost,
)
from pipeopt.problems.resource import group
from pipeopt.problems.resource import GroupProblem, brute_force
from pipeopt.problems.resource.examples import random_chain, soc_devices

REL = 2e-4

MIXED = (
    pipeopt.Device("a", {"cpu": 1, "gpu": 2}),
    pipeopt.Device("b", {"cpu": 4}),
    pipeopt.Device("c", {"gpu": 3, "npu": 1}),
    pipeopt.Device("d", {"npu": 4}),
    pipeopt.Device("e", {"cpu": 1, "gpu": 2}),  # identical to "a": symmetry breaking must keep the optimum
)


def _problem(layers, devices, q, *, seed=0, bandwidth=1e9, memory=None):
    if memory is not None:
        devices = tuple(pipeopt.Device(d.name, d.resources, memory) for d in devices)
    inst = pipeopt.Instance(random_chain(layers, seed=seed), pipeopt.Cluster(devices, bandwidth))
    return GroupProblem(inst, q)


def _check_result(problem, r):
    assert r.plan is not None
    assert r.objective == pipeopt.evaluate(problem.instance, r.plan).objective
    used = [d for st in r.plan.stages for d in st.devices]
    assert sorted(used) == sorted(problem.device_names)  # every device in exactly one worker
    assert all(st.beta is not None and st.devices for st in r.plan.stages)
    if r.lower_bound is not None:
        assert r.lower_bound <= r.objective * (1 + 1e-9)


CASES = [  # layers, devices, workers, seed, bandwidth, memory
    (6, MIXED[:4], 2, 0, 1e9, None),
    (7, MIXED, 3, 1, 1e9, None),
    (6, MIXED, 3, 2, 4e6, None),
    (7, MIXED[:4], 3, 3, 1e9, 2.2e7),
]


@pytest.mark.parametrize("layers,devices,q,seed,bandwidth,memory", CASES)
def test_cpsat_equals_brute_force(layers, devices, q, seed, bandwidth, memory):
    p = _problem(layers, devices, q, seed=seed, bandwidth=bandwidth, memory=memory)
    _, _, best = brute_force(p)
    r = group.solve_cpsat(p, time_limit=None, threads=1)
    _check_result(p, r)
    assert r.lower_bound <= best * (1 + 1e-6)
    assert r.status == pipeopt.Status.OPTIMAL
    assert r.objective <= best * (1 + REL)
    for base in (algorithm2(p), round_robin(p)):
        _check_result(p, base)
        assert r.objective <= base.objective * (1 + 1e-9)  # exact <= Algorithm 2, round-robin


@pytest.mark.parametrize("layers,devices,q,seed,bandwidth,memory", CASES[:2])
def test_milp_agrees_with_brute_force_and_cpsat(layers, devices, q, seed, bandwidth, memory):
    p = _problem(layers, devices, q, seed=seed, bandwidth=bandwidth, memory=memory)
    _, _, best = brute_force(p)
    m = group.solve_milp(p, time_limit=None, solver="highs")
    _check_result(p, m)
    assert m.lower_bound <= best * (1 + 1e-6)
    if m.status == pipeopt.Status.OPTIMAL:
        assert math.isclose(m.objective, best, rel_tol=REL)
        c = group.solve_cpsat(p, time_limit=None, threads=1)
        assert c.status == pipeopt.Status.OPTIMAL and math.isclose(m.objective, c.objective, rel_tol=REL)


def test_exact_no_worse_than_baselines_on_a_larger_instance():
    devices = soc_devices(8, seed=11)
    p = _problem(24, devices, 3, seed=5, bandwidth=5e7)
    r = group.solve_cpsat(p, time_limit=None, threads=1)  # (a proof, not a race with the clock)
    _check_result(p, r)
    for base in (algorithm2(p), round_robin(p)):
        _check_result(p, base)
        assert base.status == pipeopt.Status.FEASIBLE and base.lower_bound is None
        assert r.objective <= base.objective * (1 + 1e-9)
        assert r.lower_bound <= base.objective


def test_time_limit_is_honest():
    p = _problem(40, soc_devices(10, seed=3), 4, seed=2, bandwidth=5e7)
    r = group.solve_milp(p, time_limit=0.01)
    _check_result(p, r)
    assert r.status == pipeopt.Status.TIME_LIMIT and r.gap is not None and r.gap > 0


def test_algorithm2_rules():
    """Identical devices: Algorithm 2 deals them evenly; the worker cost is the split time of 1/q of the model."""
    devices = tuple(pipeopt.Device(f"x{i}", {"cpu": 1, "gpu": 1}) for i in range(7))
    p = _problem(10, devices, 3)
    sizes = sorted(len(g) for g in algorithm2_groups(p))
    assert sizes == [2, 2, 3]
    assert sorted(len(g) for g in round_robin_groups(p)) == [2, 2, 3]
    one = worker_cost(p, {"cpu": 1, "gpu": 1})
    two = worker_cost(p, {"cpu": 2, "gpu": 2})
    assert math.isclose(one, 2 * two) and worker_cost(p, {}) == math.inf


def test_round_robin_deals_by_speed():
    devices = (pipeopt.Device("slow", {"cpu": 1}), pipeopt.Device("fast", {"cpu": 8}),
               pipeopt.Device("mid", {"cpu": 3}), pipeopt.Device("mid2", {"cpu": 2}))
    p = _problem(6, devices, 2)
    assert round_robin_groups(p) == [("fast", "mid2"), ("mid", "slow")]


def test_through_solve():
    from pipeopt.solve import solve

    inst = pipeopt.Instance(random_chain(6, seed=1), pipeopt.Cluster(MIXED[:4], 1e9))
    r = solve(inst, problem="group", method="algorithm2", workers=2)
    assert r.status == pipeopt.Status.FEASIBLE and r.plan.num_stages == 2


def test_bad_input():
    inst = pipeopt.Instance(random_chain(6, seed=1), pipeopt.Cluster(MIXED[:3], 1e9))
    with pytest.raises(pipeopt.InvalidProblemError, match="more workers"):
        GroupProblem(inst, 4)  # more workers than devices
    with pytest.raises(pipeopt.InvalidProblemError):
        GroupProblem(inst, 0)
    with pytest.raises(pipeopt.InvalidClusterError, match="no resources"):
        pipeopt.Device("empty", {"cpu": 0})
    g = nx.DiGraph()
    g.add_node("l0", fwd={"fpga": 1.0}, bwd={"fpga": 2.0}, out_bytes=0, param_bytes=0, act_bytes=0)
    with pytest.raises(pipeopt.InvalidClusterError, match="runs only on"):
        pipeopt.Instance(g, pipeopt.Cluster(MIXED[:2], 1e9))  # a layer no resource kind can run
    bad = pipeopt.Plan((pipeopt.Stage(("l0", "l1", "l2"), ("a",), beta={"cpu": -0.1, "gpu": 0.5}),
                        pipeopt.Stage(("l3", "l4", "l5"), ("b", "c"))))
    with pytest.raises(pipeopt.InvalidPlanError, match="outside"):
        pipeopt.evaluate(inst, bad)


def test_memory_with_an_unlimited_device():
    """One device without a memory limit among limited ones: CP-SAT still equals brute force."""
    devices = (pipeopt.Device("a", {"cpu": 1, "gpu": 2}, 6e6), pipeopt.Device("b", {"cpu": 4}),
               pipeopt.Device("c", {"gpu": 3, "npu": 1}, 8e6), pipeopt.Device("d", {"npu": 4}, 5e6))
    p = _problem(7, devices, 3, seed=6)
    _, _, best = brute_force(p)
    unlimited = _problem(7, tuple(pipeopt.Device(d.name, d.resources) for d in devices), 3, seed=6)
    assert best > brute_force(unlimited)[2] * 1.01  # the memory limits bind
    r = group.solve_cpsat(p, time_limit=None, threads=1)
    _check_result(p, r)
    assert r.evaluation.feasible
    assert r.status == pipeopt.Status.OPTIMAL and math.isclose(r.objective, best, rel_tol=REL)
