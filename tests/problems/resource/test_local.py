"""The local search over groupings (pipeopt.problems.resource.local): a heuristic start whose
plan is scored by the one evaluation, never worse than where it started, never better than the
brute-force optimum, and a local optimum of its moves when it stops on its own."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings

import pipeopt
from pipeopt.backends.deadline import Deadline
from pipeopt.problems.resource import GroupProblem, brute_force, group
from pipeopt.problems.resource.duan_wu import algorithm2_groups, bisection_partition
from pipeopt.problems.resource.local import STEPS, improve, improve_best, moves
from pipeopt.problems.resource.problem import chain_optimum
from strategies import device_instance, group_problems


def _start(p: GroupProblem):
    groups = algorithm2_groups(p)
    starts, _ = bisection_partition(p, groups, mode="split")
    return starts, groups


def test_moves_keep_every_device_and_a_device_per_stage():
    counts = np.array([[2, 0, 1], [0, 1, 0], [1, 1, 3]])
    seen = [c for c in moves(counts)]
    assert seen, "a grouping with a worker of two devices has neighbours"
    for c in seen:
        assert (c.sum(axis=1) == counts.sum(axis=1)).all()  # every device still placed
        assert (c.sum(axis=0) >= 1).all()  # every worker keeps a device
        assert (c >= 0).all()
        assert np.abs(c - counts).sum() in (2, 4)  # one device moved, or two swapped
    # moves: from a worker of >= 2 devices, a class it holds, to each other worker
    n_moves = sum((counts[:, a] > 0).sum() * 2 for a in range(3) if counts[:, a].sum() >= 2)
    n_swaps = sum(1 for a in range(3) for b in range(a + 1, 3) for t in range(3) for u in range(3)
                  if t != u and counts[t, a] > 0 and counts[u, b] > 0)
    assert len(seen) == n_moves + n_swaps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=group_problems(min_units=3, min_workers=2))
def test_improve_is_scored_exactly_and_between_the_start_and_the_optimum(p):
    starts, groups = _start(p)
    start = p.plan_value(starts, groups)
    _, _, best = brute_force(p)
    found_starts, found_groups, value = improve(p, starts, groups)
    if not math.isfinite(start):  # nothing to improve from: the start comes back
        assert (found_starts, found_groups, value) == (list(starts), list(groups), start)
        return
    assert value == p.plan_value(found_starts, found_groups)
    assert math.isclose(value, pipeopt.evaluate(p.instance, p.plan(found_starts, found_groups)).objective, rel_tol=1e-12)
    assert sorted(d for g in found_groups for d in g) == sorted(p.device_names)
    assert value <= start
    assert value >= best * (1 - 1e-9)
    # a local optimum: no neighbour's best split beats it by the smallest step
    counts = np.array([p.class_counts(g) for g in found_groups]).T
    for c in moves(counts):
        other = chain_optimum(p, p.groups_from_counts(c.tolist()))
        if other.plan is not None:
            assert other.value >= value * (1 - STEPS[-1]) * (1 - 1e-9)


def test_improve_beats_algorithm2_on_gpt2_xl_over_mixed_devices():
    """Real shapes (the zoo's GPT-2 XL, fp16) over 16 devices of 4 catalogue kinds into 4
    workers: the search moves off Algorithm 2's grouping, and the group starts include it."""
    from pipeopt import zoo

    inst = zoo.instance("gpt2-xl", {"a100-80gb": 4, "t4": 6, "apple-m2": 3, "snapdragon-x-elite": 3},
                        bandwidth="10gbe", name="gpt2-xl mixed 16")
    p = GroupProblem(inst, 4)
    starts, groups = _start(p)
    start = p.plan_value(starts, groups)
    found_starts, found_groups, value = improve(p, starts, groups)
    assert value < start
    assert math.isclose(value, pipeopt.evaluate(inst, p.plan(found_starts, found_groups)).objective, rel_tol=1e-12)
    cands = group._starts(p)(Deadline(None))  # Algorithm 2's, round-robin's, the better one improved
    assert len(cands) == 3
    assert p.plan_value(*cands[2]) < min(p.plan_value(*c) for c in cands[:2])


def test_improve_stops_at_its_deadline_with_the_start():
    p = GroupProblem(device_instance(6, [0, 1, 2, 0, 1], seed=3, bandwidth=1e9), 3)
    starts, groups = _start(p)
    dl = Deadline(1e-9)  # passed before the first move is tried
    found_starts, found_groups, value = improve(p, starts, groups, dl)
    assert value == p.plan_value(starts, groups)
    assert (found_starts, found_groups) == (list(starts), list(groups))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=group_problems(min_units=3, min_workers=2))
def test_improve_best_improves_the_best_plan_or_returns_nothing(p):
    """local.improve_best (the group starts' and the type DP's polish): the local search from the
    best of the plans it is given; a plan only if strictly better, scored by the one evaluation."""

    plans = [_start(p), (*_start(p),)]
    values = [p.plan_value(*c) for c in plans]
    out = improve_best(p, plans, Deadline(None))
    _, _, best = brute_force(p)
    if not out:
        if math.isfinite(min(values)):  # the start is a local optimum already
            assert improve(p, *plans[0])[2] == min(values)
        return
    (found,) = out
    value = p.plan_value(*found)
    assert value < min(values)
    assert value >= best * (1 - 1e-9)
    assert math.isclose(value, pipeopt.evaluate(p.instance, p.plan(*found)).objective, rel_tol=1e-12)


def test_improve_best_of_no_plans_is_no_plan():
    p = GroupProblem(device_instance(6, [0, 1, 2, 0, 1], seed=3, bandwidth=1e9), 3)
    assert improve_best(p, [], Deadline(None)) == []
