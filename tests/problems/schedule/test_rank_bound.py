"""The rank bound of two chunks per rank (pipeopt/problems/schedule/rank_bound.py) is a valid
lower bound, and its DP is exact for what it bounds:

* below the brute force over every split and EVERY order of every rank (tests/brute_force.py,
  no symmetry assumed) on small random chains (p = 2, looped and V placements, with and without
  memory limits, overlap, latency and W shares);
* on every split of a small chain, each rank's bound is below the executor's time of each of
  torch's two-chunk orders there (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,
  ZBVZeroBubble, DualPipeV), p = 2 and 3;
* the DP's bound equals the least over every split of the largest rank and stage bound
  (enumerated), to the bisection's tolerance;
* on the shipped GPT-2 XL and BERT-large instances it is above the busiest rank's work.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_split_bound import FEW, TOL, chains, split_value

import brute_force as bf
import pipeopt
from pipeopt.errors import PipeoptError
from pipeopt.problems.schedule import ScheduleProblem
from pipeopt.problems.schedule.rank_bound import REL_TOL, rank_bounds, rank_lower_bound
from pipeopt.problems.schedule.split_bound import pair_bounds, split_lower_bound

ROOT = Path(__file__).resolve().parents[3]


def _lo(problem) -> float:
    return max(split_lower_bound(problem)[0], problem.memory_free_bound())


def _split_value(problem, pairs, starts) -> float:
    """The largest stage and rank bound of one split: what the DP minimises."""
    return max(split_value(problem, pairs, starts), *rank_bounds(problem, list(starts)))


@FEW
@given(chains(n_min=4, n_max=5), st.sampled_from([("looped", 2), ("v", 2)]))  # (m = 3: the brute force's
# visited set can outgrow the memory)
def test_rank_bound_below_the_brute_force_over_every_order(inst, shape):
    placement, m = shape
    problem = ScheduleProblem(inst, "free", 2, m, 2, placement=placement)
    value, _, _ = bf.free_order_optimum(inst, problem.schedule.placement, m)
    if not math.isfinite(value):
        return  # nothing fits: any bound holds
    lo = _lo(problem)
    bound = rank_lower_bound(problem, lo, value * 2)
    assert lo <= bound <= value * (1 + TOL), (lo, bound, value)


TWO_CHUNK = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


@FEW
@given(chains(n_min=6, n_max=8, p=3), st.sampled_from([2, 3]), st.sampled_from([2, 3, 4, 6]), st.data())
def test_rank_bounds_below_every_two_chunk_order_on_every_split(inst, p, m, data):
    for name in TWO_CHUNK:
        try:
            problem = ScheduleProblem(inst, name, p, m, 2)
        except PipeoptError:
            continue
        if problem.S > problem.n:
            continue
        all_splits = list(itertools.combinations(range(1, problem.n), problem.S - 1))
        picked = data.draw(st.lists(st.sampled_from(all_splits), min_size=1, max_size=6))
        for starts in picked:
            ex = problem.execute(list(starts))
            if ex.feasible:
                assert max(rank_bounds(problem, list(starts))) <= ex.time * (1 + TOL), (name, starts)


@FEW
@given(chains(n_min=5, n_max=8, p=3), st.sampled_from([2, 3]), st.sampled_from([2, 4, 6]),
       st.sampled_from(["looped", "v"]))
def test_the_dp_is_the_least_over_splits(inst, p, m, placement):
    try:
        problem = ScheduleProblem(inst, "free", p, m, 2, placement=placement)
    except PipeoptError:
        return
    if problem.S > problem.n:
        return
    pairs = pair_bounds(problem)
    best = min(_split_value(problem, pairs, starts)
               for starts in itertools.combinations(range(1, problem.n), problem.S - 1))
    lo = _lo(problem)
    if not math.isfinite(best):
        return
    bound = rank_lower_bound(problem, lo, 2 * best, pairs)
    assert bound <= max(best, lo) * (1 + TOL)
    if lo < best * (1 - REL_TOL):
        assert bound >= best * (1 - 2 * REL_TOL), (bound, best)
    else:
        assert bound == lo


def test_one_chunk_per_rank_and_a_zero_floor_are_left_as_they_are():
    problem = ScheduleProblem(pipeopt.read(ROOT / "instances/homogeneous/gpt2-xl-a100-40gb-x4.json"), "free", 4, 8)
    lo = _lo(problem)
    assert rank_lower_bound(problem, lo, lo * 2) == lo
    two = ScheduleProblem(problem.instance, "free", 4, 8, 2, placement="v")
    assert rank_lower_bound(two, 0.0, 1.0) == 0.0  # nothing to gallop from (it returns, not loops)


@pytest.mark.parametrize("path,p,m,placement,at_least,best", [
    ("instances/homogeneous/gpt2-xl-a100-40gb-x4.json", 4, 8, "v", 0.3429, 0.35542),
    ("instances/homogeneous/gpt2-xl-a100-40gb-x4.json", 4, 8, "looped", 0.3436, 0.36193),
    ("instances/homogeneous/gpt2-xl-a100-40gb-x8.json", 8, 16, "v", 0.3492, 0.36732),
    ("instances/memory/bert-large-mb16-v100-16gb-x4.json", 4, 8, "v", 0.7383, 0.76458),
])
def test_shipped_instances(path, p, m, placement, at_least, best):
    """Above the busiest rank's work (338.13 ms on GPT-2 XL, 708.88 ms on BERT-large) and below
    the best plan the benchmarks found (free_order.md: 355.42 / 361.93 / 367.32 / 764.58 ms)."""
    problem = ScheduleProblem(pipeopt.read(ROOT / path), "free", p, m, 2, placement=placement)
    lo = _lo(problem)
    bound = rank_lower_bound(problem, lo, 2 * lo)
    assert bound >= at_least > problem.memory_free_bound()
    assert bound <= best
