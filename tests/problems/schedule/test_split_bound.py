"""The per-stage split bound (pipeopt/problems/schedule/split_bound.py) is a valid lower bound:

* below the brute force over every split and EVERY order of every rank (tests/brute_force.py,
  no symmetry assumed) on small random chains (p = 2, v = 1 and 2, with and without memory
  limits, overlap, latency and W shares);
* on every split of a small chain, below the executor's time of each of torch's orders there
  (GPipe, 1F1B, InterleavedZeroBubble v = 1 and 2, Interleaved1F1B, LoopedBFS, ZBVZeroBubble,
  DualPipeV), p = 2 and 3;
* the bottleneck DP equals the least over splits of the per-split bound (enumerated).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import split_backward_chains

import brute_force as bf
from pipeopt import Cluster, Instance, Settings
from pipeopt.errors import PipeoptError
from pipeopt.problems.schedule import ScheduleProblem
from pipeopt.problems.schedule.split_bound import pair_bounds, split_lower_bound
from pipeopt.schedules import make_schedule

FEW = settings(max_examples=10, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOL = 1e-9


@st.composite
def chains(draw, n_min=2, n_max=5, p=2):
    n = draw(st.integers(n_min, n_max))
    g = draw(split_backward_chains(n))
    memory = draw(st.sampled_from([math.inf, 4e8 * n / 2 + 3e8, 1e9, 6e8]))
    latency = draw(st.sampled_from([0.0, 0.01, 0.05]))
    return Instance(g, Cluster.homogeneous(p, memory=memory, bandwidth=1e9, latency=latency),
                    Settings(overlap=draw(st.booleans())))


def split_value(problem, pairs, starts) -> float:
    bounds = [0, *starts, problem.n]
    return max(float(pairs[s][bounds[s], bounds[s + 1]]) for s in range(problem.S))


@FEW
@given(chains(), st.sampled_from([("looped", 1, 2), ("looped", 1, 3), ("looped", 2, 2), ("v", 2, 2)]))
def test_split_bound_below_the_brute_force_over_every_order(inst, shape):
    placement, v, m = shape
    if inst.chain.n < 2 * v:
        return
    problem = ScheduleProblem(inst, "free", 2, m, v, placement=placement)
    value, _, _ = bf.free_order_optimum(inst, problem.schedule.placement, m)
    bound, starts = split_lower_bound(problem)
    if not math.isfinite(value):
        return  # nothing fits: any bound holds
    assert bound <= value * (1 + TOL), (bound, value)
    assert math.isclose(split_value(problem, pair_bounds(problem), starts), bound, rel_tol=1e-12)


ORDERS = (("GPipe", None), ("1F1B", None), ("InterleavedZeroBubble", 1), ("InterleavedZeroBubble", 2),
          ("Interleaved1F1B", 2), ("LoopedBFS", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2))


@FEW
@given(chains(n_min=6, n_max=8, p=3), st.sampled_from([2, 3]), st.sampled_from([3, 4, 6]), st.data())
def test_pair_bound_below_every_fixed_order_on_every_split(inst, p, m, data):
    for name, v in ORDERS:
        try:
            problem = ScheduleProblem(inst, name, p, m, v)
        except PipeoptError:
            continue
        if problem.S > problem.n:
            continue
        pairs = pair_bounds(problem)
        all_splits = list(itertools.combinations(range(1, problem.n), problem.S - 1))
        best_split = math.inf
        for starts in all_splits:
            best_split = min(best_split, split_value(problem, pairs, starts))
        picked = data.draw(st.lists(st.sampled_from(all_splits), min_size=1, max_size=6))
        for starts in picked:
            ex = problem.execute(list(starts))
            if ex.feasible:
                assert split_value(problem, pairs, starts) <= ex.time * (1 + TOL), (name, starts)
        bound, _ = split_lower_bound(problem, pairs)
        assert bound == best_split or (math.isinf(bound) and math.isinf(best_split)), (name, bound, best_split)


def test_shipped_gpt2_xl_p8_bound():
    """GPT-2 XL on 8 A100s, m = 16: the bound (375.99 ms, the optimum CP-SAT proves at low load)
    is above the busiest rank's work (338.13 ms)."""
    import pipeopt
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    problem = ScheduleProblem(pipeopt.read(root / "instances/homogeneous/gpt2-xl-a100-40gb-x8.json"), "free", 8, 16)
    bound, starts = split_lower_bound(problem)
    assert len(starts) == 7 and bound > problem.memory_free_bound() * 1.1
    assert np.isclose(bound, 0.37599, rtol=1e-4)


@FEW
@given(chains(), st.sampled_from([("looped", 1, 2), ("looped", 1, 3), ("looped", 2, 2), ("v", 2, 2)]))
def test_split_first_equals_the_brute_force_over_every_order(inst, shape):
    """The split-first decomposition alone (no time limit: each split below the incumbent solved
    to its optimum) proves the brute force's optimum, and claims it only with a proof."""
    from pipeopt.errors import InfeasibleError
    from pipeopt.problems.schedule import solve_free_order

    placement, v, m = shape
    if inst.chain.n < 2 * v:
        return
    problem = ScheduleProblem(inst, "free", 2, m, v, placement=placement)
    value, _, _ = bf.free_order_optimum(inst, problem.schedule.placement, m)
    try:
        res = solve_free_order(problem, time_limit=None, threads=1, decompose=True)
    except InfeasibleError:
        assert not math.isfinite(value)
        return
    assert res.status == "optimal"
    assert math.isclose(res.objective, value, rel_tol=1e-6), (res.objective, value)
    assert res.lower_bound <= res.objective * (1 + 1e-9)
    first = res.info.get("split_first", {})
    assert first.get("bound", 0.0) <= value * (1 + 1e-6)
